"""Edges of the apt and pip steps, each with real processes and real files.

Headers for the running kernel, which sources the components drop-in may mirror, `apt-get update`
of our source only, what rollback may remove, a silent child killed at its deadline, the user's
HOME for uv/pip under sudo, a bundle .deb swapped after planning, commands owed by a dead run,
and boot-configuration commands that --yes alone must not run.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from egpu_setup.bundle.format import load_manifest, repository_files
from egpu_setup.errors import ExecutionError
from egpu_setup.execute import apt as execute_apt
from egpu_setup.execute import pip as execute_pip
from egpu_setup.execute.files import Context
from egpu_setup.host.machine import Host, LiveHost, RootHost
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.options import BundleSource, PlanOptions
from egpu_setup.plan.steps import AptInstall, AptRepository, PipInstall, RunCommand, WriteFile
from egpu_setup.render.files import HostCommand
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import debroot as _debroot
from helpers import install_values as values
from helpers import pypi_index as _pypi_index

DRIVER = frozenset({"driver"})
# apt parses an inline key only when it verifies a download; this source is never fetched.
INLINE_KEY = (
    " -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n"
    " mQINBGTestKeyNotRealButParsedOnlyWhenUsedAAAAAAAAAAAAAAAAAAAAAAAA\n"
    " =AbCd\n -----END PGP PUBLIC KEY BLOCK-----"
)
PPA_STANZA = (
    "Types: deb\nURIs: http://127.0.0.1:9/ppa/ubuntu\nSuites: bookworm\nComponents: main\n"
    f"Signed-By:\n{INLINE_KEY}\n"
)
VENDOR_LINE = (
    "deb [signed-by=/usr/share/keyrings/vendor.gpg] http://127.0.0.1:9/vendor bookworm main\n"
)


def _debroot_copy(tmp_path: Path, suite: str = "bookworm") -> Path:
    return _debroot.copy_or_skip(suite, tmp_path / suite)


_chroot = _debroot.chroot


def _ctx(host: Host, paths: StatePaths) -> Context:
    return Context(host, Manifest.load(paths), "test-run")


# -- 1. headers for the running kernel ------------------------------------------------------------


@pytest.mark.debootstrap
def test_live_headers_only_when_apt_has_them_and_never_for_an_image(tmp_path: Path) -> None:
    root = _debroot_copy(tmp_path)
    dep = _chroot(root, "apt-cache", "depends", "linux-headers-amd64").stdout
    depends = re.search(r"Depends: linux-headers-(\S+-amd64)", dep)
    assert depends is not None, dep
    current = depends.group(1)  # 6.1.0-NN-amd64
    host = RootHost(root)

    def packages(kernel: str, target: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        facts = values.facts(kernel=kernel)
        plan = build_plan(
            facts,
            values.profile(),
            values.resolution(facts_=facts),
            (),
            host,
            PlanOptions(target=target, only=DRIVER),
        )
        return next(s for s in plan.steps if isinstance(s, AptInstall)).packages, plan.warnings

    live, _ = packages(current, "live")
    assert f"linux-headers-{current}" in live and live.count("linux-headers-amd64") == 1
    # an ABI the archive no longer carries: not planned (apt would fail), said why
    gone, warnings = packages("6.1.0-1-amd64", "live")
    assert "linux-headers-6.1.0-1-amd64" not in gone and "linux-headers-amd64" in gone
    assert any("not in the apt cache" in w for w in warnings)
    image, _ = packages(current, "root")
    assert [p for p in image if p.startswith("linux-headers")] == ["linux-headers-amd64"]


# -- 3./4. the components drop-in mirrors the distro archive only; update refreshes ours only -----


@pytest.mark.debootstrap
def test_components_skip_ppas_and_third_party_and_apt_stays_usable(tmp_path: Path) -> None:
    root = _debroot_copy(tmp_path)
    (root / "etc/apt/sources.list.d/some-ppa.sources").write_text(PPA_STANZA)
    (root / "etc/apt/sources.list.d/vendor.list").write_text(VENDOR_LINE)
    host = RootHost(root)
    paths = StatePaths.for_root(root)
    plan = build_plan(
        values.facts(),
        values.profile(),
        values.resolution(),
        (),
        host,
        PlanOptions(target="root", only=DRIVER),
    )
    repo = next(s for s in plan.steps if isinstance(s, AptRepository))
    mirror = _debroot.host_mirror()
    assert re.findall(r"^URIs: (.*)$", repo.content, re.M) == [mirror], repo.content
    assert "127.0.0.1" not in repo.content and "Signed-By" not in repo.content
    execute_apt.add_repository(_ctx(host, paths), repo)
    # every source together: no "Conflicting values set for option Signed-By"
    sim = _chroot(root, "apt-get", "-s", "install", "nvidia-driver")
    assert sim.returncode == 0, sim.stderr
    assert "Inst nvidia-driver (535." in sim.stdout


@pytest.mark.debootstrap
def test_update_refreshes_our_source_only_a_stale_repo_does_not_roll_it_back(
    tmp_path: Path,
) -> None:
    root = _debroot_copy(tmp_path)
    # a third-party repository that is gone: a full `apt-get update` exits 100 for it
    stale = "deb [trusted=yes] file:/nonexistent-egpu-setup-test ./\n"
    (root / "etc/apt/sources.list.d/stale.list").write_text(stale)
    assert _chroot(root, "apt-get", "update").returncode == 100
    host = RootHost(root)
    paths = StatePaths.for_root(root)
    plan = build_plan(
        values.facts(),
        values.profile(),
        values.resolution(),
        (),
        host,
        PlanOptions(target="root", only=DRIVER),
    )
    repo = next(s for s in plan.steps if isinstance(s, AptRepository))
    assert execute_apt.add_repository(_ctx(host, paths), repo) == ("done", "")
    assert (root / repo.sources_path.lstrip("/")).read_text() == repo.content
    lists = {p.name for p in (root / "var/lib/apt/lists").iterdir()}
    assert any("_contrib_binary-amd64_Packages" in n for n in lists)
    # the other sources' lists were kept (List-Cleanup=0)
    assert any(n.endswith("_main_binary-amd64_Packages") for n in lists)


def test_inline_and_fingerprint_keys_are_never_mirrored(tmp_path: Path) -> None:
    """Without apt lists (a fresh image), the evidence is the Signed-By value itself."""
    r = tmp_path / "root"
    (r / "etc/apt/sources.list.d").mkdir(parents=True)
    (r / "var/lib/dpkg").mkdir(parents=True)
    (r / "var/lib/dpkg/status").write_text("")
    (r / "etc/apt/sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n" + PPA_STANZA + "\n"
        "Types: deb\nURIs: http://127.0.0.1:9/fpr\nSuites: bookworm\nComponents: main\n"
        "Signed-By: 0123456789ABCDEF0123456789ABCDEF01234567\n"
    )
    (r / "etc/apt/sources.list.d/vendor.list").write_text(VENDOR_LINE)
    plan = build_plan(
        values.facts(),
        values.profile(),
        values.resolution(),
        (),
        RootHost(r),
        PlanOptions(target="root", only=DRIVER),
    )
    repo = plan.steps[0]
    assert isinstance(repo, AptRepository)
    assert re.findall(r"^URIs: (.*)$", repo.content, re.M) == ["http://mirror.invalid/debian"]
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n" in repo.content


# -- 5. rollback --packages removes only what we installed -----------------------------------------


@pytest.mark.debootstrap
def test_only_packages_missing_before_apt_ran_are_recorded(tmp_path: Path) -> None:
    root = _debroot_copy(tmp_path)
    assert _chroot(root, "dpkg-query", "-W", "hello").returncode != 0
    assert _chroot(root, "dpkg-query", "-W", "debianutils").returncode == 0
    host = RootHost(root)
    paths = StatePaths.for_root(root)
    ctx = _ctx(host, paths)
    step = AptInstall(("hello", "debianutils"), no_install_recommends=True)
    status, detail = execute_apt.install(ctx, step)
    assert status == "done" and "1 already installed" in detail
    assert _chroot(root, "dpkg-query", "-W", "hello").returncode == 0
    assert [p["name"] for p in Manifest.load(paths).packages] == ["hello"]


# -- 6. a silent child is killed at its deadline ---------------------------------------------------


def test_a_silent_hang_is_killed_at_the_deadline_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = f"echo started; sleep 60 & echo $! > {pidfile}; wait"
    started = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        LiveHost().run_checked(["sh", "-c", script], timeout=1.5)
    took = time.monotonic() - started
    assert took < 10, took  # not the 60 s the child would sleep
    err = info.value
    assert err.exit_code == 1 and "did not finish within 1.5 s" in err.message
    # started by absolute path from the system's directories (host/process.program)
    assert "sh -c" in err.message and err.argv[1] == "-c" and err.argv[0].endswith("/bin/sh")
    assert "started" in err.stderr_tail
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # the whole process group went, not just sh
        if not Path(f"/proc/{grandchild}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{grandchild}").exists()


def test_stream_keeps_output_lines_and_exit_status() -> None:
    kept: list[str] = []
    res = LiveHost().stream(
        ["sh", "-c", "echo 'Inst a'; echo other; printf 'Inst b'; exit 3"],
        timeout=30,
        on_line=lambda line: kept.append(line) if line.startswith("Inst ") else None,
    )
    assert res.rc == 3 and kept == ["Inst a", "Inst b"] and res.tail().splitlines()[-1] == "Inst b"


# -- 7. uv/pip under sudo run with the user's HOME -------------------------------------------------


def test_installer_env_for_a_user_uses_their_home_and_drops_roots() -> None:
    base = {
        "HOME": "/root",
        "USER": "root",
        "XDG_CACHE_HOME": "/root/.cache",
        "UV_CACHE_DIR": "/root/.cache/uv",
        "PIP_INDEX_URL": "https://elsewhere.invalid/simple",
        "PATH": "/usr/bin:/bin",
        "https_proxy": "http://proxy.invalid:3128",
    }
    env = execute_pip.installer_env(execute_pip.Account("alice", 1000, "/home/alice"), base)
    assert env["HOME"] == "/home/alice" and env["USER"] == env["LOGNAME"] == "alice"
    assert not {"XDG_CACHE_HOME", "UV_CACHE_DIR", "PIP_INDEX_URL"} & set(env)
    assert env["https_proxy"] == base["https_proxy"] and env["PIP_CONFIG_FILE"] == os.devnull
    assert "UV_NO_CACHE" not in env
    # a system account without a home runs with the caches off
    none = execute_pip.installer_env(execute_pip.Account("svc", 999, "/nonexistent"), base)
    assert none["UV_NO_CACHE"] == none["PIP_NO_CACHE_DIR"] == "1"
    # root's own run is unchanged
    assert execute_pip.installer_env(None, base)["HOME"] == "/root"


def test_account_comes_from_the_targets_passwd(tmp_path: Path) -> None:
    from egpu_setup.errors import EgpuSetupError

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nlab:x:1234:1234:Lab,,,:/srv/lab:/bin/bash\n"
    )
    assert execute_pip.account(RootHost(tmp_path), "lab") == execute_pip.Account(
        "lab", 1234, "/srv/lab", 1234
    )
    with pytest.raises(EgpuSetupError, match="not in"):
        execute_pip.account(RootHost(tmp_path), "ghost")
    me = pwd.getpwuid(os.getuid())
    assert execute_pip.account(LiveHost(), me.pw_name).home == me.pw_dir


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_install_as_another_user_runs_with_their_home(
    installer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `runuser -u nobody` install; before the fix uv failed on a cache it cannot create."""
    uv = shutil.which("uv")
    if shutil.which("runuser") is None or not Path("/usr/bin/python3").exists():
        pytest.skip("needs runuser and the system python3")
    if installer == "uv" and uv is None:
        pytest.skip("uv not on PATH")
    nobody = pwd.getpwnam("nobody")
    # under /tmp, not tmp_path: nobody cannot enter root's 0700 pytest directories
    base = Path(tempfile.mkdtemp(prefix="egpu-setup-user-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        if installer == "uv":
            # this machine's uv lives under /root (0700): a copy nobody can run, first on PATH
            (base / "bin").mkdir()
            shutil.copy(os.path.realpath(str(uv)), base / "bin/uv")
            monkeypatch.setenv("PATH", f"{base / 'bin'}:{os.environ['PATH']}")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        venv = base / "venv"
        subprocess.run(
            ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-m", "venv", str(venv)],
            check=True,
            cwd="/",
        )
        wheels = base / "wheels"
        wheels.mkdir()
        whl = [_pypi_index.build_wheel(wheels, "egpu-probe", "1.0")]
        monkeypatch.setenv("HOME", "/root")  # what sudo leaves
        with _pypi_index.LocalIndex(whl) as idx:
            step = PipInstall(
                str(venv), ("egpu-probe==1.0",), idx.url, False, "python3", run_as="nobody"
            )
            paths = StatePaths.for_root(base / "state")
            ctx = Context(LiveHost(), Manifest(paths), "t")
            done = execute_pip.install(ctx, step, installer, paths)
            assert done == ("done", f"with {installer}")
        site = next(venv.glob("lib/python*/site-packages/egpu_probe"))
        assert site.stat().st_uid == nobody.pw_uid
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- 8. a bundle .deb swapped between plan and execute ---------------------------------------------


def _bundle(tmp_path: Path) -> tuple[Path, Path]:
    b = tmp_path / "bundle"
    repo = b / "debs/debian-12"
    repo.mkdir(parents=True)
    files = {"a_1.0_amd64.deb": b"!<arch>\nfirst", "b_2.0_amd64.deb": b"!<arch>\nsecond"}
    files["Packages"] = b"Package: a\nVersion: 1.0\n\nPackage: b\nVersion: 2.0\n"
    entries = []
    for name, data in files.items():
        (repo / name).write_bytes(data)
        entries.append(
            {
                "path": f"debs/debian-12/{name}",
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
        )
    (b / "manifest.json").write_text(
        json.dumps({"schema": "egpu-setup/bundle/1", "targets": [], "files": entries})
    )
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    (root / "etc/apt/sources.list.d").mkdir(parents=True)
    return b, root


def test_a_deb_swapped_after_planning_stages_nothing(tmp_path: Path) -> None:
    b, root = _bundle(tmp_path)
    source = BundleSource(
        directory=str(b),
        target="py3.11-debian-12",
        distro="debian-12",
        find_links=None,
        requirements_file=None,
        repository=str(b / "debs/debian-12"),
        packages_sha256=hashlib.sha256((b / "debs/debian-12/Packages").read_bytes()).hexdigest(),
        repository_sha256=repository_files(load_manifest(b), "debs/debian-12"),
    )
    host = RootHost(root)
    plan = build_plan(
        values.facts(),
        values.profile(),
        values.resolution(),
        (),
        host,
        PlanOptions(target="root", only=DRIVER, bundle=source),
    )
    repo = plan.steps[0]
    assert isinstance(repo, AptRepository)
    assert [n for n, _ in repo.stage_sha256] == ["Packages", "a_1.0_amd64.deb", "b_2.0_amd64.deb"]
    (b / "debs/debian-12/b_2.0_amd64.deb").write_bytes(b"!<arch>\nsomething else")
    (b / "debs/debian-12/extra_1_amd64.deb").write_bytes(b"not in the manifest")
    paths = StatePaths.for_root(root)
    with pytest.raises(ExecutionError, match=r"b_2\.0_amd64\.deb changed after it was checked"):
        execute_apt.add_repository(_ctx(host, paths), repo)
    staged = root / "var/lib/egpu-setup/bundle-apt/debian-12"
    assert not staged.exists() or not any(staged.iterdir())
    assert not (root / repo.sources_path.lstrip("/")).exists()
    assert Manifest.load(paths).files == {}


# -- 2./9. owed commands, their order, and boot-configuration consent ------------------------------


def _config_root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    for d in ("etc/modprobe.d", "etc/udev/rules.d", "var/lib/dpkg"):
        (r / d).mkdir(parents=True)
    (r / "var/lib/dpkg/status").write_text("")
    return r


def _owing(root: Path, owed: tuple[str, ...]) -> Manifest:
    """The real manifest of `root`, owing `owed` (helper A's record when it exists; until then
    a subclass with the same contract: pending_commands() -> argv tuples still owed)."""
    paths = StatePaths.for_root(root)
    if hasattr(Manifest, "add_pending_command"):
        manifest = Manifest.load(paths)
        manifest.add_pending_command(owed, "earlier-run")
        return manifest

    class Owing(Manifest):
        def pending_commands(self) -> tuple[tuple[str, ...], ...]:
            return (owed,)

    return Owing(paths)


NOUVEAU = values.rendered()[1]
INITRAMFS = HostCommand(("update-initramfs", "-u"), "rebuild the initramfs", after=(NOUVEAU.path,))
GRUB = HostCommand(("update-grub",), "apply the kernel parameters", consent=True)


def test_commands_come_before_torch_and_owed_ones_are_planned_again(tmp_path: Path) -> None:
    r = _config_root(tmp_path)
    host = RootHost(r)
    opts = PlanOptions(target="root", venv=str(tmp_path / "venv"))
    res = values.resolution(action="keep")
    plan = build_plan(
        values.facts(), values.profile(), res, (NOUVEAU,), host, opts, None, (INITRAMFS,)
    )
    kinds = [s.kind for s in plan.steps]
    # a failed torch download must not leave the initramfs unbuilt
    assert kinds.index("run-command") < kinds.index("pip-install"), kinds
    assert kinds.index("write-file") < kinds.index("run-command")
    cmd = next(s for s in plan.steps if isinstance(s, RunCommand))
    assert cmd.triggers == (NOUVEAU.path,) and not cmd.owed

    # the file is on disk now, but the run died before the command: still owed
    (r / NOUVEAU.path.lstrip("/")).write_text(NOUVEAU.content)
    (r / NOUVEAU.path.lstrip("/")).chmod(NOUVEAU.mode)
    opts = PlanOptions(target="root", only=frozenset({"driver", "config"}))
    done = build_plan(
        values.facts(), values.profile(), res, (NOUVEAU,), host, opts, None, (INITRAMFS,)
    )
    assert done.steps == ()  # a manifest without the record: nothing owed
    again = build_plan(
        values.facts(),
        values.profile(),
        res,
        (NOUVEAU,),
        host,
        opts,
        _owing(r, INITRAMFS.argv),
        (INITRAMFS,),
    )
    assert [s.kind for s in again.steps] == ["run-command"]
    owed = again.steps[0]
    assert isinstance(owed, RunCommand)
    assert owed.owed and "owed by an earlier run" in owed.describe()
    assert not any(isinstance(s, WriteFile) for s in again.steps)


def test_boot_configuration_commands_are_marked_for_consent(tmp_path: Path) -> None:
    host = RootHost(_config_root(tmp_path))
    opts = PlanOptions(target="root", only=frozenset({"config"}))
    res = values.resolution(action="keep")
    plan = build_plan(values.facts(), values.profile(), res, (), host, opts, None, (GRUB,))
    (step,) = plan.consent_steps
    assert step.argv == ("update-grub",) and step.to_json()["consent"] is True
    # honest: no "(asks first)" claim; it says consent is needed
    assert "asks first" not in step.describe()
    assert "needs your explicit consent" in step.describe()
