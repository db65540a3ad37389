"""What every benchmark shares: the installed egpu-setup, side-by-side timing, goal verdicts.

- The command measured is the installed one: the `egpu-setup` script next to this interpreter
  (a venv's bin/), else the one on PATH, else `python -m egpu_setup`; children always start in an
  empty directory, so the source tree of a checkout is never imported by accident (from the repo
  root, `python -m egpu_setup` would import ./egpu_setup, which is not what a user runs).
- Bytecode: pip compiles a package when it installs it. An editable install (or a checkout with
  PYTHONDONTWRITEBYTECODE=1) may have none, which would time the compiler on every start; when
  the package directory is writable and lacks it, it is compiled once first, and said so.
- Side by side: every command of a comparison runs once to warm the page cache, then all of them
  once per round, in a rotated order, and the medians are compared, so each sees the same load.
- Every run prints the machine's load average (1 minute) before and after.
"""

from __future__ import annotations

import argparse
import atexit
import compileall
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
NEUTRAL = Path(tempfile.mkdtemp(prefix="egpu-bench-cwd-"))  # children start here: no source tree
atexit.register(shutil.rmtree, NEUTRAL, True)
# The interpreter anchor the goals were set against (`python -c pass`, the interpreter
# egpu-setup runs on, on the 2-core development machine): 18 ms. An absolute goal also prints as a
# multiple of it, which holds when the machine is busier or faster.
ANCHOR_MS = 18.0
K = TypeVar("K", bound=Hashable)  # a case's name: what side_by_side reports it under


_TOOL: list[str] = []  # --tool PATH, when given


class _SetTool(argparse.Action):
    def __call__(self, ap: object, ns: object, value: object, option: object = None) -> None:
        path = Path(str(value))
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise SystemExit(f"error: --tool {value}: not an executable file")
        _TOOL[:] = [str(path)]
        setattr(ns, self.dest, str(path))


def parser(doc: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument(
        "--smoke", action="store_true", help="tiny inputs, one round: proves it runs, times nothing"
    )
    ap.add_argument(
        "--tool",
        action=_SetTool,
        metavar="PATH",
        help="the egpu-setup to measure, e.g. /usr/local/bin/egpu-setup as scripts/install.sh "
        "makes it (default: the one beside this interpreter: a checkout's editable install)",
    )
    return ap


def tool() -> list[str]:
    """argv of the command line measured: --tool, else the one installed beside this
    interpreter, else `python -m egpu_setup`."""
    if _TOOL:
        return list(_TOOL)
    found = which("egpu-setup")
    return [found] if found else [sys.executable, "-m", "egpu_setup"]


def tool_python() -> str:
    """The interpreter the measured egpu-setup runs on (its script's #! line): what
    `python -c pass` is timed with, as the goals' anchor."""
    script = Path(os.path.realpath(tool()[0]))
    with script.open("rb") as f:
        head = f.read(512)
    if head.startswith(b"#!"):
        first = head.split(b"\n", 1)[0][2:].decode(errors="replace").strip()
        if first and Path(first).is_file():
            return first
    return sys.executable


def which(name: str) -> str | None:
    """`name` beside this interpreter (a venv's bin/, not always on PATH), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)


def installed() -> str:
    """One line on what is measured: version, package path, editable or not, bytecode."""
    probe = subprocess.run(
        [tool_python(), "-c", "import egpu_setup, os; print(egpu_setup.__version__);"
         "print(os.path.dirname(egpu_setup.__file__))"],
        cwd=NEUTRAL, capture_output=True, text=True, check=True,
    )  # fmt: skip
    version, package = probe.stdout.split()
    where = Path(package)
    editable = not any(p in ("site-packages", "dist-packages") for p in where.parts)
    note = _ensure_bytecode(where)
    kind = "editable install of a checkout" if editable else "installed"
    return f"egpu-setup {version} ({kind}: {where}); {' '.join(tool())}; {note}"


def _ensure_bytecode(package: Path) -> str:
    tag = sys.implementation.cache_tag
    sources = [p for p in package.rglob("*.py") if "__pycache__" not in p.parts]
    missing = [
        p for p in sources if not (p.parent / "__pycache__" / f"{p.stem}.{tag}.pyc").is_file()
    ]
    if not missing:
        return "bytecode present"
    if not os.access(package, os.W_OK):
        return f"bytecode MISSING for {len(missing)} modules (not writable): timing the compiler"
    compileall.compile_dir(package, quiet=1)
    return f"bytecode compiled first for {len(missing)} modules (as pip does at install)"


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def banner(title: str) -> None:
    cores = os.cpu_count() or 1
    print(f"== {title}")
    print(f"   {installed()}")
    print(f"   python {sys.version.split()[0]} ({sys.executable}); {cores} cores; load {load()}")


def run(
    argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall seconds of one whole process (interpreter start included), and what it left."""
    start = time.perf_counter()
    done = subprocess.run(
        list(argv), cwd=cwd or NEUTRAL, env=env, capture_output=True, text=True, check=False
    )
    return time.perf_counter() - start, done


def peak_rss(argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall seconds, peak resident memory in MiB, exit status) of one process (getrusage of
    that child alone, through wait4: ru_maxrss is in KiB on Linux)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(argv), cwd=NEUTRAL, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss / 1024, proc.returncode


def side_by_side(
    cases: Mapping[K, Callable[[], float]], rounds: int, *, warm: bool = True
) -> dict[K, list[float]]:
    """Each case's times over `rounds` interleaved rounds (the order rotates every round)."""
    names = list(cases)
    if warm:
        for name in names:
            cases[name]()
    times: dict[K, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(cases[name]())
    return times


def timed(
    argv: Sequence[str], env: dict[str, str] | None = None, ok: Sequence[int] = (0,)
) -> Callable[[], float]:
    """A case for side_by_side: runs argv, fails loudly unless it exits with one of `ok`."""

    def case() -> float:
        seconds, done = run(argv, env)
        if done.returncode not in ok:
            sys.exit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr.strip()[-2000:]}")
        return seconds

    return case


@contextlib.contextmanager
def steady_load(n: int) -> Iterator[None]:
    """`n` busy loops (one process each, at nice 0) for the length of the block: the same
    synthetic CPU load under both sides of a comparison, so a ratio taken under load compares
    like with like on a machine whose own load comes and goes. Each is ended by its pid."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], cwd=NEUTRAL) for _ in range(n)
    ]
    try:
        yield
    finally:
        for proc in loops:
            proc.kill()
            proc.wait()


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


@dataclass(frozen=True)
class Goal:
    what: str
    measured: str
    goal: str
    met: bool
    note: str = ""  # why, or what it is when scaled to the anchor
    of_target: float | None = None  # an absolute goal: measured / target (1.00x is the limit)


def seconds_goal(what: str, seconds: float, limit: float, anchor_ms: float) -> Goal:
    """An absolute time goal, judged as measured; the note scales it to the issue's anchor (this
    machine's `python -c pass` now vs ANCHOR_MS), which tells load from a slow command."""
    scaled = seconds * ANCHOR_MS / anchor_ms
    return Goal(
        what,
        f"{seconds * 1000:.0f} ms",
        f"<= {limit * 1000:.0f} ms",
        seconds <= limit,
        f"{scaled * 1000:.0f} ms at an {ANCHOR_MS:g} ms python -c pass (now {anchor_ms:.0f} ms)",
        seconds / limit,
    )


def report(goals: Sequence[Goal], smoke: bool) -> int:
    """Print each goal and whether it is met; the exit status (0 when all are, or in --smoke)."""
    print(f"\n{'goal':<52} {'measured':<18} {'target':<12} verdict")
    for g in goals:
        verdict = "met" if g.met else "MISSED"
        share = f" ({g.of_target:.2f}x the target)" if g.of_target is not None else ""
        print(f"{g.what:<52} {g.measured:<18} {g.goal:<12} {verdict}{share}")
        if g.note:
            print(f"{'':<52}   {g.note}")
    print(f"load average after: {load()}")
    if smoke:
        print("(--smoke: tiny inputs and one round; the figures above mean nothing)")
        return 0
    return 0 if all(g.met for g in goals) else 1


def max_rss_self() -> float:
    """Peak resident memory of this process so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
