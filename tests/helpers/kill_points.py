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

`follow_points()` and `kill_in()` trace the children too (-f), to kill a program egpu-setup
started (dpkg, midway through unpacking) as it enters its Nth call. strace counts the calls
of each tracee apart (`when=N` is the Nth rename *of that process*), so a point is the first
call in the run at which any process reaches its Nth: the reference run says which process
that is and where it was.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
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

    program: str = ""  # with -f: what the process that makes it runs (dpkg, apt-get, python3)

    def __str__(self) -> str:
        who = f" in {self.program}" if self.program else ""
        return f"{self.syscall}#{self.n}{who} {self.args[:120]}"


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


# with -f: `123 renameat2(...) = 0`, or `123 fsync(5</x> <unfinished ...>` when another
# process's line came between its entry and its end; `123 execve("/usr/bin/dpkg", ...`
_FOLLOWED = re.compile(
    r"^(?P<pid>\d+)\s+(?P<call>\w+)\((?P<args>.*?)(?:\)\s+=\s+-?\d+|\s*<unfinished)"
)


def follow_points(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Point]]:
    """Run `argv` once to the end under strace -f. Every (syscall, n) at which some process
    first reaches its nth call of that syscall, with that process's program and arguments."""
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "trace"
        res = subprocess.run(
            [STRACE or "strace", "-f", "-qq", "-e", f"trace={','.join((*SYSCALLS, 'execve'))}",
             "-y", "-s", "256", "-o", str(log), "--", *argv],
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        lines = log.read_text(errors="replace").splitlines()
    program: dict[str, str] = {}
    counts: dict[tuple[str, str], int] = {}
    reached: dict[tuple[str, int], Point] = {}
    for line in lines:
        m = _FOLLOWED.match(line)
        if m is None:
            continue
        pid, call = m["pid"], m["call"]
        if call == "execve":
            program[pid] = m["args"].split(",", 1)[0].strip('"').rsplit("/", 1)[-1]
            continue
        n = counts[pid, call] = counts.get((pid, call), 0) + 1
        reached.setdefault((call, n), Point(call, n, m["args"], program.get(pid, "?")))
    return res, list(reached.values())


def kill_in(
    point: Point, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `argv` again under strace -f: the first process to enter its `point.n`th call of
    `point.syscall` (in the reference run, `point.program`) gets SIGKILL there."""
    inject = f"inject={point.syscall}:signal=KILL:when={point.n}"
    return subprocess.run(
        _strace(["-f", "-o", os.devnull, "-e", inject], argv),
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        check=False,
    )


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


def stop_in(
    point: Point, argv: Sequence[str], env: Mapping[str, str] | None = None, *, follow: bool
) -> subprocess.Popen[str]:
    """Start `argv` under strace (follow: -f, its children too) and stop with SIGSTOP the
    first process to enter its `point.n`th call of `point.syscall`, leaving it there (and the
    others running) for the test to cut the power under it; `stopped` waits for it and
    `end_tree` ends them all."""
    inject = f"inject={point.syscall}:signal=STOP:when={point.n}"
    return subprocess.Popen(
        _strace([*(["-f"] if follow else []), "-o", os.devnull, "-e", inject], argv),
        env=dict(env) if env is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc's parent links), parents first."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat_line = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat_line.rpartition(")")[2].split()[1])
    out = [pid]
    for p in out:
        out.extend(c for c, pp in parent.items() if pp == p)
    return out


def stopped(proc: subprocess.Popen[str], program: str, timeout: float = 600) -> bool:
    """Wait (at most `timeout` s) until a process named `program` below `proc` is stopped;
    False when `proc` ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in _tree(proc.pid)[1:]:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                continue
            if comm == program and state in ("T", "t"):
                return True
        time.sleep(0.05)
    return False


def end_tree(proc: subprocess.Popen[str]) -> str:
    """SIGKILL `proc` and everything below it at once (the power went), and its output."""
    for pid in reversed(_tree(proc.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    return out


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
