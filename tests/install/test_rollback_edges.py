"""Rollback and state at the edges: paths that were links or files, normal users, follow-ups.

Real files in temporary roots (and a real Debian root from tests/helpers/debroot.py for the initramfs
tool); a normal user is the real `nobody` (the test drops its effective uid, so the kernel does
the permission checks). Only what cannot run here is replaced: `boltctl` needs a Thunderbolt
controller and boltd, so a stand-in on PATH prints what boltctl prints and logs its argv.
"""

from __future__ import annotations

import contextlib
import ctypes  # noqa: F401  (the parent-death signal's; see as_nobody)
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests  # noqa: F401  (pip's step asks the index first; see as_nobody)

import egpu_setup.commands.rollback
import egpu_setup.detect.osrelease
import egpu_setup.execute.pip
import egpu_setup.render.context  # noqa: F401
from egpu_setup.cli import main
from egpu_setup.errors import EgpuSetupError
from egpu_setup.execute.executor import ExecOptions, execute, undo_argv
from egpu_setup.execute.undo import apply_undo, plan_undo
from egpu_setup.host.machine import Host, LiveHost, RootHost
from egpu_setup.plan.steps import (
    EnableUnit,
    PipInstall,
    Plan,
    RebootNeeded,
    RunCommand,
    Step,
    WriteFile,
)
from egpu_setup.state.journal import Journal
from egpu_setup.state.lock import RunLock
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StateAccessError, StatePaths
from egpu_setup.state.verify_marker import VERIFY_MARKER
from helpers import debroot as _debroot
from helpers import execute_root as te
from helpers import install_values as values
from helpers.debroot import snapshot
from helpers.pypi_index import LocalIndex, build_wheel
from helpers.render_cases import CASES

UDEV = "/etc/udev/rules.d/71-egpu-setup.rules"
WANTS = "/etc/systemd/system/multi-user.target.wants/egpu-setup-wait.service"
WAIT_UNIT = "/etc/systemd/system/egpu-setup-wait.service"
MODPROBE = "/etc/modprobe.d/egpu-setup-nouveau.conf"
GRUB_DROPIN = "/etc/default/grub.d/60-egpu-setup.cfg"
UUID = "c4010000-0070-6f0e-2245-1ab2c11b5d21"
NOBODY = 65534


def _make_root(r: Path) -> Path:
    for d in ("etc/udev/rules.d", "etc/modprobe.d", "etc/systemd/system", "etc/X11", "usr/lib"):
        (r / d).mkdir(parents=True)
    (r / "etc/X11/xorg.conf").write_bytes(te.USER_XORG)
    return r


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _make_root(tmp_path / "root")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _write(path: str, content: str, mode: int = 0o644) -> WriteFile:
    return WriteFile(path, values.HEADER + content, mode, "test", "create", "")


def _execute(root: Path, *steps: Step, host: Host | None = None) -> None:
    host = host or RootHost(root)
    paths = StatePaths.for_root(host.root)
    with RunLock(paths.lock):
        execute(Plan(tuple(steps)), host, paths, ExecOptions(), progress=lambda _t: None)


# -- 1. a path that was a symlink before egpu-setup -----------------------------------------------


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling-link", "link-to-a-file"])
def test_a_file_that_replaced_a_symlink_rolls_back_to_that_exact_link(
    root: Path, dangling: bool
) -> None:
    link = root / UDEV.lstrip("/")
    vendor = root / "usr/lib/71-vendor.rules"
    if not dangling:
        vendor.write_text('SUBSYSTEM=="pci", GOTO="end"\n')
    os.symlink("../../../usr/lib/71-vendor.rules", link)
    before = snapshot(root, "etc"), snapshot(root, "usr")
    te.run(root, force=not dangling)  # a link to a foreign file is a conflict: --force
    assert not link.is_symlink() and "egpu-setup" in link.read_text()
    # the preview no longer crashes (it was a TypeError, exit 70)
    proc = _cli("rollback", "--root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    files = {f["path"]: f for f in json.loads(proc.stdout)["files"]}
    assert files[UDEV]["action"] == "restored"
    assert "link -> ../../../usr/lib/71-vendor.rules" in files[UDEV]["detail"]
    proc = _cli("rollback", "--root", str(root), "--yes")
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(link) == "../../../usr/lib/71-vendor.rules"
    assert (snapshot(root, "etc"), snapshot(root, "usr")) == before


def test_a_link_someone_already_put_back_is_left_alone(root: Path) -> None:
    link = root / UDEV.lstrip("/")
    os.symlink("/dev/null", link)  # the classic way to mask a udev rule
    te.run(root)
    link.unlink()
    os.symlink("/dev/null", link)  # the admin restored it by hand
    manifest = Manifest.load(StatePaths.for_root(root))
    undo = {u.path: u for u in plan_undo(RootHost(root), manifest)}
    assert undo[UDEV].action == "already-gone"
    apply_undo(RootHost(root), manifest, list(undo.values()))
    assert os.readlink(link) == "/dev/null"


# -- 2. a regular file at a unit-link path ----------------------------------------------------------


def test_a_users_file_where_the_unit_link_goes_is_restored_not_deleted(root: Path) -> None:
    wants = root / WANTS.lstrip("/")
    wants.parent.mkdir(parents=True)
    wants.write_bytes(b"# the admin's own copy of a unit, not a link\n[Unit]\n")
    wants.chmod(0o640)
    before = snapshot(root, "etc")
    # somebody's file where the link goes is a conflict: refused without --force, kept as is
    with pytest.raises(EgpuSetupError):
        te.run(root)
    assert not wants.is_symlink()
    te.run(root, force=True)
    assert os.readlink(wants) == WAIT_UNIT
    manifest = Manifest.load(StatePaths.for_root(root))
    undo = {u.path: u for u in plan_undo(RootHost(root), manifest)}
    assert undo[WANTS].action == "restored"
    apply_undo(RootHost(root), manifest, list(undo.values()))
    assert not wants.is_symlink()
    assert wants.read_bytes() == b"# the admin's own copy of a unit, not a link\n[Unit]\n"
    assert snapshot(root, "etc") == before  # mode 0640 too


# -- 3. the link's hash is saved -------------------------------------------------------------------


def test_a_unit_link_is_recorded_with_its_final_hash(root: Path) -> None:
    _execute(root, EnableUnit("egpu-setup-wait.service", WAIT_UNIT, (WANTS,)))
    entry = Manifest.load(StatePaths.for_root(root)).files[WANTS]
    assert entry["sha256"] == "link:" + WAIT_UNIT and entry["created"] is True
    manifest = Manifest.load(StatePaths.for_root(root))
    assert [u.action for u in plan_undo(RootHost(root), manifest)] == ["unlinked"]


# -- 4. normal users -------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to nobody needs root")


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Run the block with nobody's effective uid/gid and no groups; root again afterwards.

    In-process: this machine's Python lives under /root (mode 0700), where a real nobody process
    could not even start it. Every module the block needs is imported before.
    """
    groups = os.getgroups()
    os.setgroups([])
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A temp dir nobody can traverse (pytest's own tmp_path is 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="egpu-setup-rollback-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[str | int | None, str, str]:
    """egpu_setup.cli.main in this process (errors print there), as the console script would."""
    monkeypatch.setattr(sys, "argv", ["egpu-setup", *args])
    capsys.readouterr()
    code: str | int | None
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err


@needs_root
@pytest.mark.parametrize("yes", [False, True], ids=["preview", "yes"])
def test_rollback_as_a_normal_user_on_roots_state_is_an_error_with_a_hint(
    shared_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    yes: bool,
) -> None:
    root = _make_root(shared_tmp / "root")
    state = shared_tmp / "state"
    monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
    te.run(root)  # as root: the manifest is 0600 root
    before = snapshot(root, "etc"), snapshot(shared_tmp, "state")
    args = ("rollback", "--root", str(root), *(("--yes",) if yes else ()))
    with as_nobody():
        code, out, err = _main(monkeypatch, capsys, *args)
    assert code == 1, err
    assert f"error: {state}/manifest.json needs root to read" in err
    assert f"hint: sudo egpu-setup {' '.join(args)}" in err
    _no_traceback(err)
    assert out == ""
    assert (snapshot(root, "etc"), snapshot(shared_tmp, "state")) == before


@needs_root
def test_a_run_as_a_normal_user_against_roots_state_changes_nothing(
    shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _make_root(shared_tmp / "root")
    state = shared_tmp / "state"
    monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
    te.run(root)  # state and lock now exist, root-owned
    paths = StatePaths.for_root(root)
    plan = Plan((_write("/etc/modprobe.d/egpu-setup-extra.conf", "options nvidia X=1\n"),))
    before = snapshot(root, "etc"), snapshot(shared_tmp, "state")
    with as_nobody():
        with pytest.raises(StateAccessError) as lock_err:
            RunLock(paths.lock).acquire()
        with pytest.raises(StateAccessError) as run_err:
            execute(plan, RootHost(root), paths, ExecOptions(), progress=lambda _t: None)
    assert lock_err.value.message == f"{paths.lock} needs root to lock"
    assert run_err.value.message.endswith("needs root to write")
    for exc in (lock_err.value, run_err.value):
        assert exc.exit_code == 1 and (exc.hint or "").startswith("sudo egpu-setup")
    assert (snapshot(root, "etc"), snapshot(shared_tmp, "state")) == before


@needs_root
def test_a_user_only_plan_keeps_its_state_in_the_users_xdg_state_dir(
    shared_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch into the user's own venv (here a small wheel from a loopback index), as nobody."""
    home = shared_tmp / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("EGPU_SETUP_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    system_state = Path("/var/lib/egpu-setup")
    existed = system_state.exists()
    wheels = shared_tmp / "wheels"
    wheels.mkdir()
    wheel = build_wheel(wheels, "egpu-tiny", "1.0")
    wheel.chmod(0o644)
    venv = f"{home}/venv"
    with LocalIndex([wheel]) as index:
        index.dir.chmod(0o755)  # the server thread reads it as nobody too (setuid is per process)
        step = PipInstall(venv, ("egpu-tiny==1.0",), index.url, True, "/usr/bin/python3")
        plan = Plan((step,))
        assert not plan.needs_root
        with as_nobody():
            paths = StatePaths.for_root(Path("/"))
            with RunLock(paths.lock):
                result = execute(
                    plan, LiveHost(), paths, ExecOptions(installer="pip"), lambda _t: None
                )
            preview = _main(monkeypatch, capsys, "rollback", "--json")
            applied = _main(monkeypatch, capsys, "rollback", "--yes", "--packages", "--json")
    assert [s.status for s in result.steps] == ["done"]
    assert paths.state_dir == home / ".local/state/egpu-setup"
    assert paths.lock.parent == paths.state_dir
    assert paths.journal.stat().st_uid == NOBODY
    last = Journal(paths).last_run()
    assert last is not None and last.status == "ok"
    assert system_state.exists() == existed  # root's state was never touched
    assert preview[0] == 0, preview[2]
    assert json.loads(preview[1])["venvs"] == [venv]
    assert applied[0] == 0, applied[2]
    _no_traceback(applied[2])
    assert json.loads(applied[1])["packages_removed"] is True
    assert not Path(venv).exists()
    assert Manifest.load(paths).venvs == []


@needs_root
def test_the_users_state_dir_follows_xdg_state_home_only_when_absolute(
    shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EGPU_SETUP_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(shared_tmp))
    monkeypatch.setenv("XDG_STATE_HOME", str(shared_tmp / "xdg"))
    with as_nobody():
        absolute = StatePaths.for_root(Path("/"))
        monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # invalid per the spec
        relative = StatePaths.for_root(Path("/"))
    assert absolute.state_dir == shared_tmp / "xdg/egpu-setup"
    assert relative.state_dir == shared_tmp / ".local/state/egpu-setup"
    assert StatePaths.for_root(Path("/")).state_dir == Path("/var/lib/egpu-setup")  # root


# -- 5. the verify-after-reboot marker --------------------------------------------------------------


def _unit_lines(text: str) -> list[tuple[str, str]]:
    return [
        (k.strip(), v.strip())
        for k, _, v in (ln.partition("=") for ln in text.splitlines())
        if v and not k.startswith("#")
    ]


def test_a_reboot_needed_step_arms_the_verify_unit_and_the_unit_consumes_it(root: Path) -> None:
    facts, prof, opts, _ = CASES["debian12-tb3-rtx4090"]
    from egpu_setup.render.files import render_set

    files = {f.path: f for f in render_set(facts, prof, None, "compute", **opts).files}
    verify = files["/etc/systemd/system/egpu-setup-verify.service"]
    lines = _unit_lines(verify.content)
    assert ("ConditionPathExists", VERIFY_MARKER) in lines
    assert ("ExecStartPre", f"/bin/rm -f {VERIFY_MARKER}") in lines  # once, even after a hang
    assert any(k == "ExecStart" and " verify --json" in v for k, v in lines)  # saves its report

    marker = root / VERIFY_MARKER.lstrip("/")
    paths = StatePaths.for_root(root)
    step = WriteFile(verify.path, verify.content, verify.mode, "verify once", "create", "")
    with RunLock(paths.lock):
        result = execute(
            Plan((step, RebootNeeded("the NVIDIA driver takes effect at the next boot"))),
            RootHost(root),
            paths,
            ExecOptions(),
            progress=lambda _t: None,
        )
    assert result.reboot_required
    data = json.loads(marker.read_text())
    assert data["run"] == result.run_id and "next boot" in data["reason"]
    assert marker.stat().st_mode & 0o777 == 0o644
    assert not list(marker.parent.glob("*egpu-setup-tmp*"))
    # rollback takes the unit away, and the marker with it
    proc = _cli("rollback", "--root", str(root), "--yes")
    assert proc.returncode == 0, proc.stderr
    assert not (root / verify.path.lstrip("/")).exists() and not marker.exists()


# -- 6. what the restored files feed ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("os_release", "path", "argv", "detail"),
    [
        ("ID=debian\n", MODPROBE, ["update-initramfs", "-u"], "chroot {root} update-initramfs -u"),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', MODPROBE, ["dracut", "-f"], "chroot"),
        ("ID=gentoo\n", MODPROBE, [], "unknown distribution"),
        ("ID=ubuntu\nID_LIKE=debian\n", GRUB_DROPIN, ["update-grub"], "chroot {root} update-grub"),
        ("ID=fedora\n", GRUB_DROPIN, [], "regenerate the GRUB configuration"),
    ],
)
def test_rollback_names_the_rebuild_a_root_image_needs_when_the_tool_is_missing(
    root: Path, os_release: str, path: str, argv: list[str], detail: str
) -> None:
    (root / "etc/os-release").write_text(os_release)
    _execute(root, _write(path, "blacklist nouveau\n"))
    proc = _cli("rollback", "--root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    [cmd] = json.loads(proc.stdout)["commands"]
    assert cmd["argv"] == argv and cmd["status"] == ("would-run" if argv else "not-run")
    proc = _cli("rollback", "--root", str(root), "--yes", "--json")
    assert proc.returncode == 0, proc.stderr
    [cmd] = json.loads(proc.stdout)["commands"]
    assert cmd["argv"] == argv and cmd["status"] == "not-run"
    assert detail.format(root=root) in cmd["detail"]
    assert not (root / path.lstrip("/")).exists()


def test_rollback_without_those_files_runs_nothing(root: Path) -> None:
    (root / "etc/os-release").write_text("ID=debian\n")
    _execute(root, _write(UDEV, "# rule\n"))
    proc = _cli("rollback", "--root", str(root), "--yes", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["commands"] == []


@pytest.mark.debootstrap
def test_rollback_rebuilds_the_initramfs_inside_a_debian_root(tmp_path: Path) -> None:
    try:
        root = _debroot.copy_root("trixie", tmp_path / "trixie")
    except _debroot.DebrootUnavailable as exc:
        pytest.skip(str(exc))
    env = {"LC_ALL": "C.UTF-8", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    inst = subprocess.run(
        ["chroot", str(root), "apt-get", "install", "-y", "--no-install-recommends"]
        + ["initramfs-tools"],
        capture_output=True,
        text=True,
        env={**env, "DEBIAN_FRONTEND": "noninteractive"},
        check=False,
    )
    if inst.returncode != 0:
        pytest.skip(f"initramfs-tools could not be installed in the root: {inst.stdout[-300:]}")
    assert shutil.which("update-initramfs") is None  # so it can only have run in the root
    _execute(root, _write(MODPROBE, "blacklist nouveau\n"))
    proc = _cli("rollback", "--root", str(root), "--yes", "--json")
    assert proc.returncode == 0, proc.stderr
    [cmd] = json.loads(proc.stdout)["commands"]
    assert cmd == {
        "argv": ["update-initramfs", "-u"],
        "reason": cmd["reason"],
        "status": "done",
        "detail": "",
    }


_FAKE_BOLTCTL = """#!/bin/sh
# stands in for boltctl (needs boltd and a Thunderbolt controller); logs its argv. Its child gets
# a clean environment (host/process.py), so what it logs to and whether it fails are files.
echo "$*" >> {log}
[ -e {fail} ] && {{ echo "boltctl: error: device not found" >&2; exit 1; }}
case "$1" in
enroll) printf ' \\342\\227\\217 Razer Core X Chroma\\n   \\342\\224\\234\\342\\224\\200 uuid:   %s\\n' "$4"
        printf '   \\342\\224\\224\\342\\224\\200 status: authorized\\n' ;;
esac
"""

# egpu-setup starts a bare program name only from host/process.SYSTEM_PATH, never the caller's
# PATH: the stand-in's directory goes in front of it, in this process and in the command line's.
_CLI_WITH_PROGRAMS = (
    "import sys; import egpu_setup.host.process as p; "
    "p.SYSTEM_PATH = sys.argv[1] + ':' + p.SYSTEM_PATH; "
    "from egpu_setup.cli import main; main(sys.argv[2:])"
)


@pytest.mark.parametrize("fails", [False, True], ids=["forgotten", "forget-fails"])
def test_a_bolt_enrollment_is_recorded_and_forgotten_on_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    import egpu_setup.host.process

    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls, fail = tmp_path / "boltctl.log", tmp_path / "boltctl.fail"
    (bindir / "boltctl").write_text(_FAKE_BOLTCTL.format(log=calls, fail=fail))
    (bindir / "boltctl").chmod(0o755)
    system_path = f"{bindir}:{egpu_setup.host.process.SYSTEM_PATH}"
    monkeypatch.setattr(egpu_setup.host.process, "SYSTEM_PATH", system_path)
    env = {"EGPU_SETUP_STATE_DIR": str(tmp_path / "state")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _CLI_WITH_PROGRAMS, str(bindir), *args],
            capture_output=True, text=True, env={**os.environ, **env}, check=False,
        )  # fmt: skip

    enroll = ("boltctl", "enroll", "--policy", "iommu", UUID)
    _execute(
        Path("/"), RunCommand(enroll, "authorize this enclosure", live_only=True), host=LiveHost()
    )
    paths = StatePaths.for_root(Path("/"))
    [recorded] = Manifest.load(paths).commands
    assert recorded["argv"] == list(enroll) and recorded["undo"] == ["boltctl", "forget", UUID]
    proc = cli("rollback", "--json")
    assert json.loads(proc.stdout)["commands"][0]["status"] == "would-run"
    if fails:
        fail.touch()
    proc = cli("rollback", "--yes", "--json")
    print("STDOUT", proc.stdout, "STDERR", proc.stderr)
    [cmd] = json.loads(proc.stdout)["commands"]
    assert calls.read_text().splitlines() == [" ".join(enroll[1:]), f"forget {UUID}"]
    if fails:
        assert proc.returncode == 1 and cmd["status"] == "failed"
        assert "device not found" in cmd["detail"]
        assert Manifest.load(paths).commands  # kept: the next rollback tries again
    else:
        assert proc.returncode == 0 and cmd["status"] == "done", proc.stderr
        assert Manifest.load(paths).commands == []


def test_undo_commands_are_derived_only_for_what_outlives_the_files() -> None:
    assert undo_argv(("boltctl", "enroll", "--policy", "auto", UUID)) == ["boltctl", "forget", UUID]
    assert undo_argv(("grubby", "--update-kernel=ALL", "--args=pci=realloc pcie_ports=native")) == [
        "grubby",
        "--update-kernel=ALL",
        "--remove-args=pci=realloc pcie_ports=native",
    ]
    for argv in (("update-initramfs", "-u"), ("udevadm", "control", "--reload"), ("grubby",)):
        assert undo_argv(argv) is None
