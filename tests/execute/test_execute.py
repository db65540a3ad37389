"""The executor on a real directory tree: atomic writes, manifest, journal, lock, kill -9, rollback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from egpu_setup.errors import BusyError, EgpuSetupError
from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.execute.undo import apply_undo, plan_undo
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.steps import WriteFile
from egpu_setup.state.journal import Journal
from egpu_setup.state.lock import RunLock
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import install_values as values
from helpers import kill_points
from helpers.debroot import snapshot
from helpers.execute_root import PRIOR_UDEV, USER_XORG, make_root, plan_for, run
from helpers.loopback import LoopbackServer


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path)


def test_files_land_atomically_with_modes_and_a_second_run_plans_nothing(root: Path) -> None:
    _, _, plan = plan_for(root)
    kinds = [s.kind for s in plan.steps]
    assert kinds.count("write-file") == 5 and "enable-unit" in kinds
    result = run(root)
    assert all(s.status in ("done", "skipped") for s in result.steps)
    hotplug = root / "usr/local/bin/egpu-hotplug"
    assert hotplug.stat().st_mode & 0o777 == 0o755
    link = root / "etc/systemd/system/multi-user.target.wants/egpu-setup-wait.service"
    assert os.readlink(link) == "/etc/systemd/system/egpu-setup-wait.service"
    assert (root / "etc/X11/xorg.conf").read_bytes() == USER_XORG
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    _, _, again = plan_for(root)
    assert again.steps == ()
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before
    assert not list(root.rglob("*egpu-setup-tmp*"))


def test_rollback_restores_etc_byte_for_byte(root: Path) -> None:
    udev = root / "etc/udev/rules.d/71-egpu-setup.rules"
    udev.write_bytes(PRIOR_UDEV + b"# egpu-setup\n")  # pre-existing, carries our name: replaced
    udev.chmod(0o600)
    before = snapshot(root, "etc"), snapshot(root, "usr")
    run(root)
    assert udev.read_bytes() != PRIOR_UDEV
    paths = StatePaths.for_root(root)
    manifest = Manifest.load(paths)
    undo = plan_undo(RootHost(root), manifest)
    assert {u.action for u in undo} == {"removed", "restored", "unlinked"}
    apply_undo(RootHost(root), manifest, undo)
    assert (snapshot(root, "etc"), snapshot(root, "usr")) == before
    assert Manifest.load(paths).files == {}


def test_a_users_edit_is_a_conflict_kept_by_rollback_and_replaced_only_with_force(
    root: Path,
) -> None:
    run(root)
    rules = root / "etc/udev/rules.d/71-egpu-setup.rules"
    rules.write_text(rules.read_text() + "# my tweak\n")
    _, _, plan = plan_for(root)
    conflicts = plan.conflicts
    assert [c.path for c in conflicts] == ["/etc/udev/rules.d/71-egpu-setup.rules"]
    assert isinstance(conflicts[0], WriteFile)
    assert "-# my tweak" in conflicts[0].diff
    with pytest.raises(EgpuSetupError, match="changed by someone"):
        run(root)
    assert rules.read_text().endswith("# my tweak\n")
    # rollback keeps the edited file, removes the rest
    paths = StatePaths.for_root(root)
    manifest = Manifest.load(paths)
    undo = {u.path: u.action for u in plan_undo(RootHost(root), manifest)}
    assert undo["/etc/udev/rules.d/71-egpu-setup.rules"] == "kept-edited"
    # --force replaces it and keeps the user's version as a backup
    run(root, force=True)
    manifest = Manifest.load(paths)
    entry = manifest.files["/etc/udev/rules.d/71-egpu-setup.rules"]
    assert b"# my tweak" in manifest.read_backup(entry["replaced_edits"][0])
    assert "my tweak" not in rules.read_text()


def test_a_foreign_file_without_our_header_is_not_overwritten(root: Path) -> None:
    target = root / "etc/X11/xorg.conf.d/90-egpu-setup.conf"
    target.parent.mkdir()
    target.write_text('Section "Screen"\nEndSection\n')
    _, _, plan = plan_for(root)
    assert [s.path for s in plan.conflicts] == ["/etc/X11/xorg.conf.d/90-egpu-setup.conf"]


def test_the_journal_records_each_step_before_and_after(root: Path) -> None:
    result = run(root)
    events = list(Journal(StatePaths.for_root(root)).events())
    mine = [e for e in events if e.get("run") == result.run_id]
    assert mine[0]["event"] == "run-begin" and mine[-1]["event"] == "run-end"
    begun = [e["step"] for e in mine if e["event"] == "step-begin"]
    done = [e["step"] for e in mine if e["event"] == "step-done"]
    assert begun == done == list(range(len(result.steps)))


_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from helpers import execute_root
    execute_root.run(Path({root!r}))
    """
)


def _argv(root: Path) -> list[str]:
    code = _CHILD.format(tests=str(Path(__file__).parents[1]), root=str(root))
    return [sys.executable, "-c", code]


def _env(state: Path) -> dict[str, str]:
    # no .pyc written: the run's calls are counted, and must be the same in every run
    return {**os.environ, "EGPU_SETUP_STATE_DIR": str(state), "PYTHONDONTWRITEBYTECODE": "1"}


def _child(root: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(root), env=_env(state), capture_output=True, text=True, check=False)


def _files_are_whole(root: Path) -> None:
    wanted = {rf.path: rf.content.encode() for rf in values.rendered()}
    for path, content in wanted.items():
        p = root / path.lstrip("/")
        assert not p.exists() or p.read_bytes() == content, f"half-written {path}"


# kill points per test, each kind spread over the whole run (kill_points.spread): a kill as a
# rename is entered leaves the temp file written and synced; one at an fsync, a record or a file
# not yet durable
KILLS = {"fsync": 10, "rename": 6}
KILL_POINTS = sum(KILLS.values())  # docs/testing.md's table of kill points shows it


@pytest.mark.slow  # 16 killed runs, each run again and rolled back (strace)
def test_kill_9_at_every_kind_of_point_converges_and_rolls_back(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL as the run enters an fsync or a rename (each journal record, each file written,
    each put in place), at KILLS points of each kind spread over the run; the same run again
    ends where an uninterrupted run ends, and rollback takes it back to before."""
    before = snapshot(root, "etc")
    ref = tmp_path / "ref"
    shutil.copytree(root, ref, symlinks=True)
    done, found = kill_points.points(_argv(ref), env=_env(tmp_path / "state-ref"))
    assert done.returncode == 0, done.stderr
    ours = [p for p in found if str(tmp_path) in p.args]  # not the interpreter's own calls
    steps = len(plan_for(root)[2].steps)
    assert sum(p.syscall.startswith("rename") for p in ours) >= steps - 1, ours  # files, links
    expected = snapshot(ref, "etc")
    killed_mid_write = 0
    chosen = [
        point
        for kind, most in KILLS.items()
        for point in kill_points.spread([p for p in ours if p.syscall.startswith(kind)], most)
    ]
    for k, point in enumerate(chosen):
        r, state = tmp_path / f"r{k}", tmp_path / f"state{k}"
        shutil.copytree(root, r, symlinks=True)
        monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
        res = kill_points.kill_at(point, _argv(r), env=_env(state))
        assert kill_points.killed(res), f"{point}: {res.returncode} {res.stderr[-2000:]}"
        _files_are_whole(r)
        killed_mid_write += bool(list(r.rglob("*egpu-setup-tmp*")))
        assert RunLock(StatePaths.for_root(r).lock).holder() is None  # died with the process
        last = Journal(StatePaths.for_root(r)).last_run()
        proc = _child(r, state)
        assert proc.returncode == 0, f"{point}: {proc.stderr}"
        if last is not None and last.status == "running":
            assert f"run {last.run_id} was interrupted" in proc.stderr, point
        assert not list(r.rglob("*egpu-setup-tmp*"))
        assert snapshot(r, "etc") == expected, f"kill at {point} did not converge"
        assert plan_for(r)[2].steps == (), f"kill at {point} left work for a third run"
        # and what was done in pieces rolls back exactly
        manifest = Manifest.load(StatePaths.for_root(r))
        apply_undo(RootHost(r), manifest, plan_undo(RootHost(r), manifest))
        assert snapshot(r, "etc") == before, f"kill at {point}: rollback"
    assert killed_mid_write > 0  # some kills left a temp file, which the next run removed


def test_interrupted_run_is_named_on_the_next_run(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    ref = tmp_path / "ref"
    shutil.copytree(root, ref, symlinks=True)
    _, found = kill_points.points(_argv(ref), env=_env(tmp_path / "state-ref"))
    renames = [p for p in found if p.syscall.startswith("rename") and str(ref) in p.args]
    res = kill_points.kill_at(renames[len(renames) // 2], _argv(root), env=_env(state))
    assert kill_points.killed(res), res.stderr
    monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
    last = Journal(StatePaths.for_root(root)).last_run()
    assert last is not None and last.status == "running" and last.interrupted_at is not None
    result = run(root)
    assert result.resumed_from and f"interrupted at step {last.interrupted_at}" in (
        result.resumed_from
    )


def test_a_second_concurrent_run_is_busy_and_names_the_holder(root: Path) -> None:
    paths = StatePaths.for_root(root)
    code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from egpu_setup.state.lock import RunLock
        lock = RunLock(Path({str(paths.lock)!r}))
        lock.acquire()
        print("held", flush=True)
        time.sleep(30)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(BusyError, match=f"pid {holder.pid}") as exc:
            run(root)
        assert exc.value.exit_code == 5
        assert not (root / "etc/udev/rules.d/71-egpu-setup.rules").exists()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.05)
    run(root)  # free again


def test_the_dpkg_lock_held_by_another_process_is_busy_after_the_timeout(root: Path) -> None:
    from egpu_setup.plan.steps import AptInstall, Plan

    lock = root / "var/lib/dpkg/lock-frontend"
    lock.parent.mkdir(parents=True)
    lock.touch()
    code = textwrap.dedent(
        f"""
        import fcntl, os, time
        fd = os.open({str(lock)!r}, os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(30)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        paths = StatePaths.for_root(root)
        started = time.monotonic()
        with pytest.raises(BusyError, match=f"pid {holder.pid} \\(python") as exc:
            execute(
                Plan((AptInstall(("nvidia-driver",), lock_timeout=1),)),
                RootHost(root),
                paths,
                ExecOptions(),
                lambda _t: None,
            )
        assert 1 <= time.monotonic() - started < 5
        assert exc.value.exit_code == 5 and "never delete the lock" in (exc.value.hint or "")
        assert lock.exists()  # never deleted
    finally:
        holder.kill()
        holder.wait()


def _serve(directory: Path) -> LoopbackServer:
    return LoopbackServer(root=directory)


def _make_key(tmp_path: Path) -> tuple[Path, str]:
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--no-tty"]
    subprocess.run(
        [
            *gpg,
            "--passphrase",
            "",
            "--quick-gen-key",
            "Test Repo <repo@test.invalid>",
            "ed25519",
            "sign",
            "never",
        ],
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True
    )
    fpr = next(line.split(":")[9] for line in out.stdout.splitlines() if line.startswith("fpr:"))
    key = tmp_path / "srv" / "repo.asc"
    key.parent.mkdir()
    key.write_bytes(
        subprocess.run([*gpg, "--armor", "--export", fpr], check=True, capture_output=True).stdout
    )
    return key, fpr


@pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg not installed")
def test_a_repo_key_that_is_not_the_pinned_one_adds_nothing(root: Path, tmp_path: Path) -> None:
    from egpu_setup.plan.steps import AptRepository, Plan

    key, fpr = _make_key(tmp_path)
    server = _serve(key.parent)
    try:
        url = f"{server.url}repo.asc"
        before = snapshot(root, "etc")
        wrong = "EB693B3035CD5710E231E123A4B469963BF863CC"  # a different (NVIDIA's 2022) key
        step = AptRepository(
            "nvidia-cuda",
            "/etc/apt/sources.list.d/egpu-setup-nvidia-cuda.sources",
            "Types: deb\n",
            "test",
            "/etc/apt/keyrings/egpu-setup-nvidia-cuda.gpg",
            url,
            wrong,
        )
        paths = StatePaths.for_root(root)
        with pytest.raises(EgpuSetupError, match=f"fingerprint {fpr}, not the pinned {wrong}"):
            execute(Plan((step,)), RootHost(root), paths, ExecOptions(), lambda _t: None)
        assert snapshot(root, "etc") == before
        # the right key passes the check; apt-get update cannot run in this bare tree, so the
        # step's files are taken back out: a source apt cannot use never stays behind
        right = AptRepository(
            step.name, step.sources_path, step.content, "test", step.keyring_path, url, fpr
        )
        with pytest.raises(EgpuSetupError, match="apt-get"):
            execute(Plan((right,)), RootHost(root), paths, ExecOptions(), lambda _t: None)
        assert snapshot(root, "etc") == before
        assert Manifest.load(paths).files == {}
    finally:
        server.close()
