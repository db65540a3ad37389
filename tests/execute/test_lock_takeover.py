"""A run killed with SIGKILL while it holds the run lock: the kernel drops its flock, and the
next run takes the lock over saying whose it was (the dead run's pid and command line); a
live holder is still never broken (exit 5). Real processes, a real kill -9."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from egpu_setup.errors import EXIT_BUSY, BusyError
from egpu_setup.state.lock import RunLock

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from egpu_setup.state.lock import RunLock
    lock = RunLock(Path(sys.argv[1]))
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def _holder(lock: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_lock_whose_holder_was_killed_is_taken_over_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock = tmp_path / "egpu-setup.lock"
    child = _holder(lock)
    try:
        with pytest.raises(BusyError) as caught:  # alive: never broken
            RunLock(lock).acquire()
        assert caught.value.exit_code == EXIT_BUSY
        assert f"pid {child.pid}" in caught.value.message
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    with caplog.at_level(logging.WARNING, logger="egpu_setup.state"), RunLock(lock):
        pass
    (said,) = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert f"pid {child.pid}: -c" in said and str(lock) in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="egpu_setup.state"), RunLock(lock):
        pass  # released cleanly by the run before: nothing to say
    assert not [r for r in caplog.records if "taking over" in r.getMessage()]
