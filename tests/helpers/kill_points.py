"""kill -9 at a real point of a real run, with no hook in the code under test.

strace's fault injection delivers a signal to a process as it enters its Nth call of a system
call (strace(1), `-e inject=SYSCALL:signal=KILL:when=N`). Every point where a run's durable
state changes passes through one of a few calls: fsync (each journal record, each file written,
each directory after a rename), rename (each file put in place) and clone or vfork (each
program egpu-setup starts: apt, pip, a command in an image). `points()` lists them for
one uninterrupted run (with the path each one touched, strace's -y), and `kill_at()` runs the
same command again and kills it there.

Only the process started is traced (no -f): the kill lands in egpu-setup itself, and whatever
it started must end with it (host/process.py's parent-death signal).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SYSCALLS = ("fsync", "rename", "renameat", "renameat2", "clone", "clone3", "vfork")
STARTS = ("clone", "clone3", "vfork")  # a process (or thread) begins: kill as it is started
STRACE = shutil.which("strace")
# `fsync(5</root/etc/x.egpu-setup-tmp-1>) = 0`; `renameat(3</etc>, "a", 3</etc>, "b") = 0`
_LINE = re.compile(r"^(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<rc>-?\d+)")


@dataclass(frozen=True)
class Point:
    """The `n`th call (from 1) of `syscall` in the run, and what it was called on."""

    syscall: str
    n: int
    args: str

    def __str__(self) -> str:
        return f"{self.syscall}#{self.n} {self.args[:120]}"


def _strace(extra: Sequence[str], argv: Sequence[str]) -> list[str]:
    if STRACE is None:
        raise RuntimeError("strace is not installed (.ci/run installs it)")
    return [STRACE, "-qq", "-e", f"trace={','.join(SYSCALLS)}", *extra, "--", *argv]


def points(
    argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Point]]:
    """Run `argv` once to the end under strace; its result and every fsync and rename it made."""
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "trace"
        res = subprocess.run(
            _strace(["-y", "-s", "256", "-o", str(log)], argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
        )
        lines = log.read_text(errors="replace").splitlines()
    counts: dict[str, int] = {}
    found: list[Point] = []
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        call = m["call"]
        counts[call] = counts.get(call, 0) + 1
        found.append(Point(call, counts[call], m["args"]))
    return res, found


def kill_at(
    point: Point,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` again and SIGKILL it as it enters `point` (that call is never made)."""
    inject = f"inject={point.syscall}:signal=KILL:when={point.n}"
    return subprocess.run(
        _strace(["-o", os.devnull, "-e", inject], argv),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def spread(found: list[Point], most: int) -> list[Point]:
    """At most `most` of `found`, evenly spaced, the first and the last among them: a bound on
    the test's time that still kills at every kind of moment of the run."""
    if len(found) <= most:
        return found
    step = (len(found) - 1) / (most - 1)
    return [found[round(i * step)] for i in range(most)]


def killed(res: subprocess.CompletedProcess[str]) -> bool:
    """strace ends with its tracee's signal (it kills itself with it): -9 from subprocess."""
    return res.returncode == -9
