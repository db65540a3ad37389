"""The run lock in a world-writable directory cannot be taken over by another user."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from egpu_setup.errors import BusyError
from egpu_setup.host.process import spawn
from egpu_setup.state.lock import RunLock

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="replacing another user's file needs root"
)
HOLD = "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_SH)\nprint('held', flush=True)\ntime.sleep(30)\n"


@needs_root
def test_a_users_lock_file_in_run_lock_is_replaced_not_obeyed(tmp_path: Path) -> None:
    run_lock = tmp_path / "lock"
    run_lock.mkdir()
    run_lock.chmod(0o1777)  # as /run/lock
    path = run_lock / "egpu-setup.lock"
    path.write_text("pid 1: pretend\n")
    os.chown(path, 65534, 65534)  # nobody made it first ...
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"  # ... and holds a flock on it
        lock = RunLock(path)
        lock.acquire()  # not blocked: that file was not root's lock
        try:
            st = path.stat()
            assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600
            with pytest.raises(BusyError):  # a second root run is still refused
                RunLock(path).acquire()
        finally:
            lock.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_symlink_as_lock_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    path = tmp_path / "egpu-setup.lock"
    path.symlink_to(target)
    lock = RunLock(path)
    if os.geteuid() == 0:
        lock.acquire()  # root replaces the link with its own file
        lock.release()
        assert not path.is_symlink()
    else:
        with pytest.raises(OSError):
            lock.acquire()
    assert target.read_text() == "keep me\n"


# A run that holds the lock and starts, through the one gateway, a child whose own child outlives
# it (as a `pip wheel`'s build backend outlives pip): the child prints the grandchild's pid, then
# the run waits to be killed.
ORPHANING_RUN = """
import sys, time
from pathlib import Path
from egpu_setup.host.process import spawn
from egpu_setup.state.lock import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire()
res = spawn(["sh", "-c", "sleep 300 & echo $!"])
print(res.out.strip(), flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_next_run_ends_what_a_killed_run_left_and_names_that_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "egpu-setup.lock"
    run = subprocess.Popen(
        [sys.executable, "-c", ORPHANING_RUN, str(path)], stdout=subprocess.PIPE, text=True
    )
    grandchild = 0
    try:
        assert run.stdout is not None
        grandchild = int(run.stdout.readline())
        assert _alive(grandchild)
        run.kill()  # kill -9: nothing of the run's own code runs after this
        run.wait(timeout=10)
        assert _alive(grandchild)  # the kernel does not end a grandchild (no parent-death signal)
        assert f"pid {run.pid}:" in path.read_text()  # the lock file says who held it

        lock = RunLock(path)
        with caplog.at_level("WARNING", logger="egpu_setup.state"):
            lock.acquire()
        lock.release()
        for _ in range(100):
            if not _alive(grandchild):
                break
            time.sleep(0.05)
        assert not _alive(grandchild)
        assert f"from a run that ended without releasing it (pid {run.pid}:" in caplog.text
        assert f"pid {grandchild}" in caplog.text
        assert path.read_text() == ""  # released: the next run takes over nothing
    finally:
        run.kill()
        if grandchild and _alive(grandchild):
            os.kill(grandchild, 9)


def test_a_released_lock_leaves_nothing_to_take_over_and_a_reused_session_id_is_spared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "egpu-setup.lock"
    with RunLock(path):
        spawn(["true"])
        assert "session " in path.read_text()  # the child's session was written down
    assert path.read_text() == ""
    # A killed run's record of a session whose leader's pid a later process now has (same id,
    # another start time: the kernel reused the number once the old session was empty).
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        path.write_text(f"pid 1: egpu-setup install\nsession {bystander.pid} 1\n")
        with caplog.at_level("WARNING", logger="egpu_setup.state"), RunLock(path):
            pass
        assert bystander.poll() is None  # not ours: left running
        assert "ended without releasing it (pid 1: egpu-setup install)" in caplog.text
        assert "ended 0" not in caplog.text and "process(es) it left" not in caplog.text
    finally:
        bystander.kill()
        bystander.wait()
