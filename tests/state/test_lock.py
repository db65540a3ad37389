"""The run lock in a world-writable directory cannot be taken over by another user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from egpu_setup.errors import BusyError
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
