"""kill -9 inside the apt step of `install --root`, for real: dpkg killed midway through
unpacking, egpu-setup killed as it starts apt. The same command again converges and rollback
--packages takes back every package, however far the killed run got.

The image is a copy of the Debian 12 debootstrap root whose only apt source is a local
repository of small packages named as the driver plan names them (nvidia-driver and the
rest, helpers/local_apt.py), so apt and dpkg run for real with no mirror and in seconds. The
kill points come from one uninterrupted run traced with strace -f (helpers/kill_points.py):
dpkg's renames and fsyncs (each file it puts in place, each record of its own journal in
/var/lib/dpkg/updates/) spread over the unpack, and egpu-setup's own start of apt-get.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from egpu_setup.state.journal import Journal
from egpu_setup.state.paths import StatePaths
from helpers import debroot as _debroot
from helpers import kill_points
from helpers.local_apt import build_deb, local_repository
from helpers.loop_ext4 import loop_ext4

pytestmark = [
    pytest.mark.debootstrap,
    pytest.mark.skipif(kill_points.STRACE is None, reason="strace missing (.ci/run installs it)"),
]

# what `install --profile rtx3080 --only driver` asks apt for in a Debian 12 image, and one
# dependency apt brings with them (recorded as pulled_in)
NAMED = ("linux-headers-amd64", "nvidia-kernel-dkms", "nvidia-driver", "firmware-nvidia-gsp")
BROUGHT = "lab-nvidia-libs"
KILLS = {"rename": 3, "fsync": 2}  # dpkg's, spread over its unpack
# and egpu-setup as it starts apt-get and as it saves the manifest after (docs/testing.md's
# table of kill points shows these counts)
KILL_POINTS = sum(KILLS.values()) + 2
EXPECTED = dict.fromkeys((*NAMED, BROUGHT), "ii")  # dpkg-query's abbreviation: configured


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = _debroot.copy_or_skip("bookworm", tmp_path_factory.mktemp("apt-kill") / "image")
    (root / "etc/apt/sources.list").unlink()  # the local repository is apt's only source
    debs = []
    for name in (*NAMED, BROUGHT):
        files = tuple(f"usr/lib/lab/{name}/f{i}" for i in range(3))
        depends = f"nvidia-kernel-dkms, {BROUGHT}" if name == "nvidia-driver" else ""
        debs.append(build_deb(root, name, depends=depends, files=files))
    local_repository(root, debs)
    return root


def _argv(root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "egpu_setup", *extra, "--root", str(root), "--yes"]


def _install(root: Path) -> list[str]:
    return _argv(root, "install", "--profile", "rtx3080", "--only", "driver")


def _env() -> dict[str, str]:
    # the state lives in each image; no .pyc written, so every run makes the same calls
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("EGPU_SETUP_STATE_DIR", None)
    return env


def _statuses(root: Path) -> dict[str, str]:
    out = _debroot.chroot(root, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n")
    return {ln.split()[0]: ln.split()[1] for ln in out.stdout.splitlines() if ln.split()}


def _recorded(root: Path) -> dict[str, bool]:
    manifest = json.loads((root / "var/lib/egpu-setup/manifest.json").read_text())
    return {p["name"]: bool(p.get("pulled_in")) for p in manifest["packages"]}


def _in_dpkg(found: list[kill_points.Point]) -> list[kill_points.Point]:
    """dpkg's renames and fsyncs, KILLS of each spread over its unpack (strace -f)."""
    return [
        point
        for kind, most in KILLS.items()
        for point in kill_points.spread(
            [p for p in found if p.program == "dpkg" and p.syscall == kind], most
        )
    ]


def _in_egpu_setup(found: list[kill_points.Point]) -> list[kill_points.Point]:
    """egpu-setup's own (strace without -f): as it starts apt-get install, the packages just
    recorded; and as it puts the manifest in place after apt finished."""
    etc = next(i for i, p in enumerate(found) if "/etc/" in p.args)  # the first file after apt
    start = max(i for i, p in enumerate(found[:etc]) if p.syscall in kill_points.STARTS)
    saved = next(p for p in found[start:] if p.syscall.startswith("rename"))
    assert "manifest.json" in saved.args, saved
    return [found[start], saved]


@pytest.fixture(scope="module")
def dpkg_points(image: Path, tmp_path_factory: pytest.TempPathFactory) -> list[kill_points.Point]:
    """Every call of the uninterrupted install, children included (strace -f); it ends with
    each package installed."""
    ref = tmp_path_factory.mktemp("apt-kill-ref") / "image"
    _debroot.layered_copy(image, ref)  # an overlay on the module's image: a mount, no copy
    done, found = kill_points.follow_points(_install(ref), env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert {n: s for n, s in _statuses(ref).items() if n in EXPECTED} == EXPECTED
    return found


def test_killed_in_the_apt_step_the_same_install_converges_and_rollback_purges(
    image: Path, dpkg_points: list[kill_points.Point], tmp_path: Path
) -> None:
    env = _env()
    before = _statuses(image)
    assert not set(before) & {*NAMED, BROUGHT}
    ref = tmp_path / "ref"
    _debroot.layered_copy(image, ref)  # an overlay on the module's image: a mount, no copy
    done, own = kill_points.points(_install(ref), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = [*_in_dpkg(dpkg_points), *_in_egpu_setup([p for p in own if str(ref) in p.args
                                                       or p.syscall in kill_points.STARTS])]  # fmt: skip
    assert len(chosen) == KILL_POINTS, [str(p) for p in dpkg_points if p.program]
    failures = 0
    for k, point in enumerate(chosen):
        r = tmp_path / f"r{k}"
        _debroot.layered_copy(image, r)
        dpkg = point.program == "dpkg"
        if dpkg:
            res = kill_points.kill_in(point, _install(r), env=env)
        else:
            res = kill_points.kill_at(point, _install(r), env=env)
        # dpkg killed: apt says so and the install fails, named (exit 1); or, at an fsync,
        # egpu-setup is killed next as it journals that failure (each process has its own
        # count, and its own Nth fsync comes then)
        failed = res.returncode == 1 and "error:" in res.stderr and "hint:" in res.stderr
        if failed:
            failures += 1
        assert failed or kill_points.killed(res), f"{point}: {res.returncode} {res.stderr[-2000:]}"
        assert dpkg or not failed, point
        # recorded before dpkg started: rollback would know every package, whatever got in
        assert _recorded(r) == {**dict.fromkeys(NAMED, False), BROUGHT: True}, point
        again = subprocess.run(_install(r), env=env, capture_output=True, text=True, check=False)
        assert again.returncode == 0, f"{point}: {again.stderr[-3000:]}"
        # dpkg's unfinished work is finished in the image first, as on a running system
        assert not dpkg or "run dpkg --configure -a" in again.stderr, point
        audit = _debroot.chroot(r, "dpkg", "--audit")
        assert audit.returncode == 0 and audit.stdout == "", f"{point}: {audit.stdout}"
        assert {n: s for n, s in _statuses(r).items() if n in EXPECTED} == EXPECTED, point
        assert _recorded(r) == {**dict.fromkeys(NAMED, False), BROUGHT: True}, point
        back = subprocess.run(
            _argv(r, "rollback", "--packages"), env=env, capture_output=True, text=True
        )
        assert back.returncode == 0, f"{point}: {back.stderr[-3000:]}"
        assert _statuses(r) == before, f"{point}: rollback --packages left packages"
        assert _recorded(r) == {}, point
        _debroot.release(r)
    assert failures >= KILLS["rename"]  # every kill at a rename of dpkg's ended in an error


def test_rollback_right_after_dpkg_was_killed_purges_what_it_left(
    image: Path, dpkg_points: list[kill_points.Point], tmp_path: Path
) -> None:
    """No second install: dpkg's journal of the killed run is still in /var/lib/dpkg/updates/
    (apt, which reads only the status file, sees none of its packages), one package unpacked
    and one half-installed. rollback --packages finishes dpkg's work first and purges both."""
    env = _env()
    before = _statuses(image)
    renames = [p for p in dpkg_points if p.program == "dpkg" and p.syscall == "rename"]
    point = renames[len(renames) // 3]  # in the unpack of the second package
    r = tmp_path / "r"
    _debroot.layered_copy(image, r)
    res = kill_points.kill_in(point, _install(r), env=env)
    assert res.returncode == 1 and "hint:" in res.stderr, f"{point}: {res.stderr[-2000:]}"
    assert [n for n in (r / "var/lib/dpkg/updates").iterdir() if n.name.isdigit()]
    left = {n: s for n, s in _statuses(r).items() if n in EXPECTED}
    assert set(left.values()) >= {"iU", "iHR"}, left  # unpacked; half-installed, reinstreq
    back = subprocess.run(
        _argv(r, "rollback", "--packages"), env=env, capture_output=True, text=True
    )
    assert back.returncode == 0, back.stderr[-3000:]
    assert "running dpkg --configure -a first" in back.stderr
    assert _statuses(r) == before
    audit = _debroot.chroot(r, "dpkg", "--audit")
    assert audit.returncode == 0 and audit.stdout == "", audit.stdout
    assert _recorded(r) == {}


POWER_CUTS = 3  # dpkg midway through its unpack, at its last fsync, egpu-setup right after apt


def test_power_cut_in_the_apt_step_the_same_install_converges_and_rollback_purges(
    image: Path, dpkg_points: list[kill_points.Point], tmp_path: Path
) -> None:
    """The image on a small loop ext4 whose power is cut (EXT4_IOC_SHUTDOWN, nothing its
    journal had not committed kept, helpers/loop_ext4.py) while dpkg is stopped at one of its
    renames or fsyncs, or egpu-setup as it saves the manifest after apt; every process killed,
    e2fsck, mounted again. The same install then ends as an uninterrupted one (dpkg's audit
    empty, each package installed, the journal's run ok, the same files), and rollback
    --packages takes the packages back."""
    env = _env()
    before = _statuses(image)
    ref = tmp_path / "ref"
    subprocess.run(["cp", "-a", str(image), str(ref)], check=True)
    done, own = kill_points.points(_install(ref), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {sub: _debroot.snapshot(ref, sub) for sub in ("etc", "usr/lib/lab")}
    renames, fsyncs = (
        [p for p in dpkg_points if p.program == "dpkg" and p.syscall == kind]
        for kind in ("rename", "fsync")
    )
    saved = _in_egpu_setup(
        [p for p in own if str(ref) in p.args or p.syscall in kill_points.STARTS]
    )
    chosen = [(renames[len(renames) // 2], "dpkg"), (fsyncs[-1], "dpkg"), (saved[1], "python")]
    assert len(chosen) == POWER_CUTS
    python = Path(sys.executable).name[:15]  # /proc/PID/comm: the name egpu-setup runs as
    for k, (point, program) in enumerate(chosen):
        (tmp_path / f"p{k}").mkdir()
        with loop_ext4(tmp_path / f"p{k}", size_mib=2600) as fs:
            r = fs.mount / "image"
            subprocess.run(["cp", "-a", str(image), str(r)], check=True)
            subprocess.run(["sync", "-f", str(r)], check=True)  # the base image is durable
            follow = program == "dpkg"
            proc = kill_points.stop_in(point, _install(r), env=env, follow=follow)
            try:
                reached = kill_points.stopped(proc, "dpkg" if follow else python)
                fs.shut_down()
            finally:
                out = kill_points.end_tree(proc)
            assert reached, f"{point}: never stopped there: {out[-2000:]}"
            fs.remount(fsck=True)
            again = subprocess.run(_install(r), env=env, capture_output=True, text=True)
            assert again.returncode == 0, f"{point}: {again.stderr[-3000:]}"
            audit = _debroot.chroot(r, "dpkg", "--audit")
            assert audit.returncode == 0 and audit.stdout == "", f"{point}: {audit.stdout}"
            assert {n: s for n, s in _statuses(r).items() if n in EXPECTED} == EXPECTED, point
            assert _recorded(r) == {**dict.fromkeys(NAMED, False), BROUGHT: True}, point
            last = Journal(StatePaths.system(r)).last_run()
            journal = (r / "var/lib/egpu-setup/journal.jsonl").read_text(errors="replace")
            assert last is not None and last.status == "ok", f"{point}: {journal[-3000:]}"
            for sub, want in expected.items():
                assert _debroot.snapshot(r, sub) == want, f"{point}: {sub} differs"
            back = subprocess.run(
                _argv(r, "rollback", "--packages"), env=env, capture_output=True, text=True
            )
            assert back.returncode == 0, f"{point}: {back.stderr[-3000:]}"
            assert _statuses(r) == before, f"{point}: rollback --packages left packages"


PURGE_KILLS = 3  # dpkg's fsyncs while `rollback --packages` purges, spread over the purge


def test_rollback_killed_while_dpkg_purges_the_same_rollback_finishes(
    image: Path, tmp_path: Path
) -> None:
    """Was: `rollback --packages` killed while apt-get purged exited 5 (the lock) on the next
    run and left the packages half-removed. dpkg is killed at PURGE_KILLS of its fsyncs (its
    journal records in /var/lib/dpkg/updates/, the status file); the same rollback then
    finishes dpkg's work and purges them all."""
    env = _env()
    before = _statuses(image)
    installed = tmp_path / "installed"
    subprocess.run(["cp", "-a", str(image), str(installed)], check=True)
    done = subprocess.run(_install(installed), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    ref = tmp_path / "ref"
    subprocess.run(["cp", "-a", str(installed), str(ref)], check=True)
    back, found = kill_points.follow_points(_argv(ref, "rollback", "--packages"), env=env)
    assert back.returncode == 0, back.stderr[-3000:]
    fsyncs = [p for p in found if p.program == "dpkg" and p.syscall == "fsync"]
    chosen = kill_points.spread(fsyncs, PURGE_KILLS)
    assert len(chosen) == PURGE_KILLS, [str(p) for p in found if p.program == "dpkg"]
    for k, point in enumerate(chosen):
        r = tmp_path / f"r{k}"
        subprocess.run(["cp", "-a", str(installed), str(r)], check=True)
        res = kill_points.kill_in(point, _argv(r, "rollback", "--packages"), env=env)
        failed = res.returncode != 0 and "error:" in res.stderr and "hint:" in res.stderr
        assert failed or kill_points.killed(res), f"{point}: {res.returncode} {res.stderr[-2000:]}"
        again = subprocess.run(
            _argv(r, "rollback", "--packages"), env=env, capture_output=True, text=True
        )
        assert again.returncode == 0, f"{point}: {again.stderr[-3000:]}"
        audit = _debroot.chroot(r, "dpkg", "--audit")
        assert audit.returncode == 0 and audit.stdout == "", f"{point}: {audit.stdout}"
        assert _statuses(r) == before, f"{point}: packages left"
        assert _recorded(r) == {}, point
        shutil.rmtree(r)
