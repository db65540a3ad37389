"""rollback --packages for real, in a Debian 12 root: dpkg, apt and its autoremove rule.

An install records the packages it named and the ones apt brought with them (`jq` brings
`libjq1` and `libonig5`); rollback --packages purges them all, so dpkg's database lists what it
listed before and no conffile or maintainer-script state is left. What the machine's owner
installed since is never taken along: a package that needs one of the named ones stops the
rollback before anything changes; one that needs a dependency keeps that dependency.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from egpu_setup.errors import EgpuSetupError
from egpu_setup.execute import apt as execute_apt
from egpu_setup.execute.files import Context, missing_parents, write_managed
from egpu_setup.execute.undo import mark_venv
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.installed import installed_packages
from egpu_setup.plan.steps import AptInstall
from egpu_setup.rollback.core import (
    RollbackOptions,
    apply_rollback,
    plan_rollback,
    rollback_text,
)
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import debroot as _debroot
from helpers.local_apt import build_deb as _build_deb
from helpers.local_apt import local_repository as _local_repository

pytestmark = pytest.mark.debootstrap

NAMED = "jq"
BROUGHT = ["libjq1", "libonig5"]  # jq's Depends in bookworm, neither in a minbase root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _debroot.copy_or_skip("bookworm", tmp_path / "root")


_chroot = _debroot.chroot


def _install_jq(root: Path) -> Manifest:
    paths = StatePaths.for_root(root)
    ctx = Context(RootHost(root), Manifest.load(paths), "test-run")
    status, _detail = execute_apt.install(ctx, AptInstall((NAMED,), True))
    assert status == "done"
    return Manifest.load(paths)


def _later_package(root: Path, name: str, depends: str) -> None:
    """What the machine's owner installs after egpu-setup: a package that needs `depends`."""
    build = root / "tmp" / name
    (build / "DEBIAN").mkdir(parents=True)
    (build / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: Lab <lab@example.org>\n"
        f"Depends: {depends}\nDescription: a lab tool installed after egpu-setup\n"
    )
    deb = f"/tmp/{name}.deb"
    assert _chroot(root, "dpkg-deb", "--build", f"/tmp/{name}", deb).returncode == 0
    done = _chroot(root, "dpkg", "-i", deb)
    assert done.returncode == 0, done.stderr


def _rollback(root: Path) -> str:
    """`rollback --root ROOT --yes --packages`; its text."""
    options = RollbackOptions(yes=True, root_dir=str(root), packages=True)
    return rollback_text(apply_rollback(plan_rollback(options)))


def test_the_install_records_what_it_named_and_what_apt_brought(root: Path) -> None:
    before = installed_packages(RootHost(root))
    assert NAMED not in before and not set(BROUGHT) & set(before)
    manifest = _install_jq(root)
    assert [(p["name"], p.get("pulled_in", False)) for p in manifest.packages] == [
        (NAMED, False),
        *((b, True) for b in BROUGHT),
    ]


def test_packages_go_with_their_dependencies_and_dpkg_lists_what_it_did_before(
    root: Path,
) -> None:
    before = installed_packages(RootHost(root))
    _install_jq(root)
    text = _rollback(root)
    assert installed_packages(RootHost(root)) == before
    # purged, not removed: no `rc` state, no conffile or script left in dpkg's database
    listed = _chroot(root, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n").stdout
    assert not [ln for ln in listed.splitlines() if ln.split()[0] in (NAMED, *BROUGHT)]
    info = {p.name.split(":")[0].split(".")[0] for p in (root / "var/lib/dpkg/info").iterdir()}
    assert not info & {NAMED, *BROUGHT}
    assert "the 2 packages apt brought with them, purged" in text.splitlines()
    assert "kept" not in text
    assert Manifest.load(StatePaths.for_root(root)).packages == []


def test_a_dependency_something_installed_since_needs_stays_and_says_why(root: Path) -> None:
    _install_jq(root)
    _later_package(root, "lab-regex-tool", "libonig5")
    text = _rollback(root)
    left = installed_packages(RootHost(root))
    assert NAMED not in left and "libjq1" not in left
    assert "libonig5" in left and "lab-regex-tool" in left
    assert "kept libonig5: needed by lab-regex-tool, installed since" in text
    # still recorded: a later rollback takes it once nothing needs it
    kept = Manifest.load(StatePaths.for_root(root)).packages
    assert [p["name"] for p in kept] == ["libonig5"]


def test_a_dependency_marked_manual_since_stays(root: Path) -> None:
    _install_jq(root)
    assert _chroot(root, "apt-mark", "manual", "libjq1").returncode == 0
    text = _rollback(root)
    assert "libjq1" in installed_packages(RootHost(root))
    assert "kept libjq1: marked manually installed since" in text


def test_a_package_that_needs_a_named_one_stops_rollback_before_anything_changes(
    root: Path,
) -> None:
    _install_jq(root)
    paths = StatePaths.for_root(root)
    rule = "/etc/udev/rules.d/61-egpu-setup-test.rules"  # a file of the same run
    ctx = Context(RootHost(root), Manifest.load(paths), "test-run")
    write_managed(ctx, rule, b"# Generated by egpu-setup\n# the same install wrote this\n", 0o644)
    _later_package(root, "lab-json-tool", NAMED)
    manifest_before = paths.manifest.read_bytes()
    status_before = (root / "var/lib/dpkg/status").read_bytes()
    with pytest.raises(EgpuSetupError) as info:
        _rollback(root)
    assert "would also remove lab-json-tool, which egpu-setup did not install" in info.value.message
    assert "rollback without --packages" in (info.value.hint or "")
    assert (root / "var/lib/dpkg/status").read_bytes() == status_before
    assert paths.manifest.read_bytes() == manifest_before
    assert (root / rule.lstrip("/")).read_bytes().endswith(b"# the same install wrote this\n")


def test_a_dependency_whose_removal_script_refuses_is_kept_and_the_rest_purged(
    root: Path,
) -> None:
    """sudo's prerm refuses while root has no password; any package's may. The refusal is
    respected, named, and the other packages still go."""
    refuse = 'echo "Refusing to remove lab-guard." >&2; exit 1'
    guard = _build_deb(root, "lab-guard", depends="lab-glue", prerm=refuse)
    glue = _build_deb(root, "lab-glue")  # what the kept package needs stays with it
    lib = _build_deb(root, "lab-lib")
    tool = _build_deb(root, "lab-driver", depends="lab-guard, lab-lib")
    _local_repository(root, [guard, glue, lib, tool])
    paths = StatePaths.for_root(root)
    ctx = Context(RootHost(root), Manifest.load(paths), "test-run")
    execute_apt.install(ctx, AptInstall(("lab-driver",), True))
    recorded = Manifest.load(paths).packages
    assert [(p["name"], p.get("pulled_in", False)) for p in recorded] == [
        ("lab-driver", False),
        ("lab-glue", True),
        ("lab-guard", True),
        ("lab-lib", True),
    ]
    text = _rollback(root)
    left = installed_packages(RootHost(root))
    assert {"lab-driver", "lab-lib", "lab-guard", "lab-glue"} & set(left) == {
        "lab-guard",
        "lab-glue",
    }, _chroot(root, "dpkg", "-l", "lab-*").stdout
    assert "kept lab-guard: its removal script refused" in text
    assert "kept lab-glue: a package kept here needs it" in text
    # still marked as dependencies, as before rollback asked apt to purge them
    auto = _chroot(root, "apt-mark", "showauto").stdout.split()
    assert {"lab-guard", "lab-glue"} <= set(auto)
    assert _chroot(root, "dpkg", "--audit").stdout == ""


def test_a_directory_dpkg_loses_through_merged_usr_is_made_again(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Debian 12's /lib is a link to usr/lib. The base lists /lib/lab-hooks (as systemd lists
    /lib/systemd/system-sleep); the driver brings /usr/lib/lab-hooks/x (as nvidia-suspend-common
    brings /usr/lib/systemd/system-sleep/nvidia). Purging it, dpkg deletes the directory the base
    still lists under its other name; rollback makes it again, as it was."""
    assert (root / "lib").is_symlink()
    base = _build_deb(root, "lab-base", files=("lib/lab-hooks/",))
    hook = _build_deb(root, "lab-hook", files=("usr/lib/lab-hooks/x",))
    tool = _build_deb(root, "lab-driver", depends="lab-hook")
    _local_repository(root, [base, hook, tool])
    assert _chroot(root, "dpkg", "-i", "/tmp/repo/lab-base_1.0_all.deb").returncode == 0
    hooks = root / "usr/lib/lab-hooks"
    os.chmod(hooks, 0o750)
    paths = StatePaths.for_root(root)
    ctx = Context(RootHost(root), Manifest.load(paths), "test-run")
    execute_apt.install(ctx, AptInstall(("lab-driver",), True))
    assert (hooks / "x").is_file()
    with caplog.at_level("INFO", logger="egpu_setup.rollback"):
        _rollback(root)
    assert "made /usr/lib/lab-hooks again" in caplog.text  # dpkg had deleted it
    assert hooks.is_dir() and not (hooks / "x").exists()
    assert stat.S_IMODE(hooks.stat().st_mode) == 0o750 and hooks.stat().st_uid == 0
    assert "lab-base" in installed_packages(RootHost(root))


def test_venvs_go_with_the_directories_made_for_them_also_below_a_linked_opt(
    tmp_path: Path,
) -> None:
    """Two venvs under one new directory, below an /opt that is a link (to /srv/opt, as labs
    put /opt on a larger disk): the directories are recorded by name, the manifest reloads, and
    rollback --packages removes the venvs and then their parent, but not /opt's target."""
    root = tmp_path / "root"
    (root / "srv/opt").mkdir(parents=True)
    (root / "opt").symlink_to("srv/opt")
    host = RootHost(root)
    paths = StatePaths.for_root(root)
    manifest = Manifest.load(paths)
    for venv in ("/opt/egpu-lab/tool", "/opt/egpu-lab/venv"):
        manifest.add_venv(venv, "test-run", missing_parents(host, venv))
        real = root / "srv" / venv.lstrip("/")
        real.mkdir(parents=True)
        (real / "pyvenv.cfg").write_text("home = /usr/bin\n")
        mark_venv(host, venv, "test-run")
    manifest.save()
    recorded = [v.get("created_dirs") for v in Manifest.load(paths).venvs]
    assert recorded == [["/opt/egpu-lab"], None]  # the second found it made
    options = RollbackOptions(yes=True, root_dir=str(root), packages=True)
    text = rollback_text(apply_rollback(plan_rollback(options)))
    assert "venvs created by egpu-setup, removed: /opt/egpu-lab/tool /opt/egpu-lab/venv" in text
    assert not (root / "srv/opt/egpu-lab").exists()
    assert (root / "srv/opt").is_dir() and (root / "opt").is_symlink()
    assert Manifest.load(paths).venvs == []


def test_a_foreign_architecture_twin_installed_since_is_never_taken_for_ours(root: Path) -> None:
    """egpu-setup brought lab-twin (amd64) and lab-common; Steam-style, the owner then adds
    lab-twin:i386, which needs lab-common too. apt names it lab-twin:i386 in its simulation: it
    is not the lab-twin egpu-setup installed, so what it needs stays, and so does it."""
    common = _build_deb(root, "lab-common", multi_arch="foreign")  # serves either architecture
    twin = _build_deb(root, "lab-twin", depends="lab-common", arch="amd64")
    foreign = _build_deb(root, "lab-twin", depends="lab-common", arch="i386")
    tool = _build_deb(root, "lab-driver", depends="lab-twin, lab-common", arch="amd64")
    _local_repository(root, [common, twin, tool])
    paths = StatePaths.for_root(root)
    ctx = Context(RootHost(root), Manifest.load(paths), "test-run")
    execute_apt.install(ctx, AptInstall(("lab-driver",), True))
    assert _chroot(root, "dpkg", "--add-architecture", "i386").returncode == 0
    done = _chroot(root, "dpkg", "-i", f"/tmp/repo/{foreign.name}")
    assert done.returncode == 0, done.stderr
    text = _rollback(root)
    listed = _chroot(root, "dpkg-query", "-W", "-f", "${Package}:${Architecture}\n", "lab-*").stdout
    assert "lab-twin:i386" in listed.split() and "lab-common:all" in listed.split(), listed
    assert "lab-driver:amd64" not in listed.split()
    assert "kept lab-common: needed by lab-twin:i386, installed since" in text


def test_the_venv_of_the_running_egpu_setup_is_kept_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a booted lab machine `egpu-setup rollback --packages` runs from /opt/egpu-setup/tool,
    a venv egpu-setup made: deleting it under the running process would end the rollback
    half-done. It is kept, with the command that removes it afterwards."""
    import sys

    from egpu_setup.host.machine import LiveHost

    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "pyvenv.cfg").write_text("home = /usr/bin\n")
    other = tmp_path / "venv"
    other.mkdir()
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")
    host = LiveHost()
    paths = StatePaths.for_root(Path("/"))  # the test session's own state dir (conftest)
    manifest = Manifest.load(paths)
    for venv in (tool, other):
        manifest.add_venv(str(venv), "test-run")
        mark_venv(host, str(venv), "test-run")
    manifest.save()
    monkeypatch.setattr(sys, "prefix", str(tool))
    outcome = apply_rollback(plan_rollback(RollbackOptions(yes=True, packages=True)))
    assert tool.is_dir() and not other.exists()
    assert outcome.kept_venvs == ((str(tool), f"the egpu-setup running this rollback lives in "
                                   f"it: rm -rf {tool} afterwards"),)  # fmt: skip
    assert [v["path"] for v in Manifest.load(paths).venvs] == [str(tool)]
