"""A racer: a real process as `nobody` that attacks a folder root works in, while root works.

The script runs under the system Python (stdlib only: nobody cannot reach the venv under /work)
with argv `FD ARGS...`, FD a descriptor of the folder it attacks (nobody cannot walk root's
tmp_path to reach it by name). A racer prints `ready` before its loop, so the attack is running
when `start` returns, and its last line is how many times it struck; `finish` collects that
(the caller asserts it is above 0: a race that raced nothing proves nothing).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from helpers.sentinel import SYSTEM_PYTHON, drop_to_nobody


@contextlib.contextmanager
def _on(folder: Path, script: str, args: tuple[str, ...]) -> Iterator[tuple[list[str], int]]:
    """The argv of `script` under the system Python, and the descriptor of `folder` it takes
    first (held open until the child has started)."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield [str(SYSTEM_PYTHON), "-c", script, str(dfd), *args], dfd
    finally:
        os.close(dfd)


def start(script: str, folder: Path, *args: str) -> subprocess.Popen[str]:
    """`script` as nobody on a descriptor of `folder`, once it has printed `ready`."""
    with _on(folder, script, args) as (argv, fd):
        proc = subprocess.Popen(
            argv,
            pass_fds=(fd,),
            preexec_fn=drop_to_nobody,
            stdout=subprocess.PIPE,
            text=True,
        )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        proc.wait()
        raise AssertionError(f"the racer did not start: {script.splitlines()[:3]}")
    return proc


def finish(proc: subprocess.Popen[str], timeout: float) -> int:
    """Wait `timeout` seconds at most for the racer; the count on its last line."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return int(out.split()[-1])


def run(script: str, folder: Path, *args: str) -> str:
    """`script` as nobody on a descriptor of `folder`, to its end (one strike, not a race):
    its stdout. A failed script fails the test."""
    with _on(folder, script, args) as (argv, fd):
        done = subprocess.run(
            argv,
            pass_fds=(fd,),
            preexec_fn=drop_to_nobody,
            capture_output=True,
            text=True,
            check=True,
        )
    return done.stdout.strip()
