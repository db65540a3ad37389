"""torch 2.13.0 CPU from a PEP 503 index on 127.0.0.1 into a fresh venv: uv vs pip doing the same
work, side by side, and what an uncompiled venv costs later.

Every install goes through the executor's own PipInstall step (the argv the installer runs: both
compile bytecode, pip by default and uv with --compile-bytecode), from the same local index, into
a fresh venv, with the installer's cache (<state>/cache, execute/pip.py) emptied first; "uv,
second venv" keeps it, as a second venv of root's finds it (no download); the timer stops after
`sync`, so disk writeback counts for both (docs/sources.md, "Measured here"). Rounds are
interleaved (the order rotates). Shown too: uv without --compile-bytecode, as the installer ran it
before, which is faster only because it leaves the compiling to every later start; and the floor
under both, the wheels' files written out by zipfile and synced, which no installer can beat,
with the system CPU time it took.

Then `import torch` in each resulting venv where __pycache__ cannot be written: as root this runs
as `nobody` in the root-owned venvs (the lab's shared /opt/egpu-setup/venv); otherwise as this
user with PYTHONDONTWRITEBYTECODE=1, which has the same effect.

Goal: the uv path at least 1.4x faster than pip doing the same work.

    python benchmarks/torch_uv_vs_pip.py [--rounds 2] [--imports 3] [--smoke]
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import _bench as b

sys.path.insert(0, str(b.REPO / "tests"))

from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.execute.pip import commands, installer_env
from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.steps import PipInstall, Plan
from egpu_setup.state.paths import StatePaths
from helpers import pypi_index as _pypi_index

P = ParamSpec("P")
R = TypeVar("R")
GOAL = 1.4  # pip seconds / uv seconds, both compiling
SECOND = "uv, second venv (cache warm)"


def _quiet(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` with stderr sent to /dev/null: the installers' progress lines are not the result."""

    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        with open(os.devnull, "w") as sink:
            saved, sys.stderr = sys.stderr, sink
            try:
                return fn(*args, **kwargs)
            finally:
                sys.stderr = saved

    return wrapped


@_quiet
def install(how: str, requirement: str, index: str, venv: Path, python: str) -> float:
    """Seconds to create `venv` and install `requirement` into it, the way `how` says."""
    shutil.rmtree(venv, ignore_errors=True)
    cache = StatePaths.for_root(Path("/")).wheel_cache
    shutil.rmtree(cache, ignore_errors=True)  # cold, every case
    if how == SECOND:  # a first venv fills the cache (untimed), as the one before would
        first = venv.with_name(venv.name + "-first")
        _execute(PipInstall(str(first), (requirement,), index, True, python), "uv")
        shutil.rmtree(first)
    step = PipInstall(str(venv), (requirement,), index, True, python)
    start = time.perf_counter()
    if how in ("pip", "uv", SECOND):
        _execute(step, "pip" if how == "pip" else "uv")
    else:  # "uv, no bytecode": the executor's own uv argv without --compile-bytecode
        uv = b.which("uv")
        env = {**installer_env(), "UV_CACHE_DIR": str(cache)}  # the same cold cache
        for argv in commands(step, uv):
            argv = [a for a in argv if a != "--compile-bytecode"]
            subprocess.run(argv, env=env, capture_output=True, check=True)
    os.sync()
    return time.perf_counter() - start


def _execute(step: PipInstall, installer: str) -> None:
    paths = StatePaths.for_root(Path("/"))
    execute(Plan((step,)), LiveHost(), paths, ExecOptions(installer=installer), lambda _t: None)


KERNEL_S: list[float] = []  # the floor's system CPU time, per round


def unpack_seconds(wheels: list[Path], dest: Path) -> float:
    """The floor under every installer: the wheels' files written out (zipfile), then sync."""
    import zipfile

    shutil.rmtree(dest, ignore_errors=True)
    start, cpu = time.perf_counter(), os.times().system
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(dest)
    os.sync()
    seconds = time.perf_counter() - start
    KERNEL_S.append(os.times().system - cpu)
    shutil.rmtree(dest, ignore_errors=True)
    return seconds


def import_seconds(venv: Path, module: str) -> float:
    """Wall seconds of `python -c "import <module>"` in `venv`, __pycache__ not writable."""
    argv = [str(venv / "bin" / "python"), "-c", f"import {module}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if os.geteuid() == 0:  # the venv is root's: another user cannot write its __pycache__
        argv = ["runuser", "-u", "nobody", "--", *argv]
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd="/", check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--imports", type=int, default=3)
    ap.add_argument(
        "--python",
        default="/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3",
        help="the interpreter the venvs are made from (default: the distribution's, as in a lab)",
    )
    args = ap.parse_args()
    rounds, imports = (1, 1) if args.smoke else (args.rounds, args.imports)
    if b.which("uv") is None:
        print("uv is not on PATH (pip install uv)", file=sys.stderr)
        return 2
    b.banner("torch CPU from a loopback index: pip vs uv, both compiling bytecode")
    print(f"   venvs made from {args.python}")
    logging.getLogger("egpu_setup").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp_s:
        tmp = Path(tmp_s)
        os.chmod(tmp, 0o755)  # `nobody` must reach the venvs to import from them
        os.environ.update(
            EGPU_SETUP_STATE_DIR=str(tmp / "state")
        )  # the executor's children get a clean environment: the cache is emptied instead
        if args.smoke:  # a small pure-Python wheel stands in for torch: proves the script runs
            (tmp / "wheels").mkdir()
            wheels = [_pypi_index.build_wheel(tmp / "wheels", "egpu-probe", "1.0")]
            requirement, module = "egpu-probe==1.0", "egpu_probe"
        else:
            wheels = _pypi_index.download_torch(_pypi_index.cache_dir())
            requirement, module = "torch==2.13.0+cpu", "torch"
        hows = ["pip", "uv", "uv, no bytecode", SECOND]
        venvs = {how: tmp / f"venv-{i}" for i, how in enumerate(hows)}
        floor = "unpack the wheels only (zipfile)"
        with _pypi_index.LocalIndex(wheels) as idx:
            cases: dict[str, Callable[[], float]] = {
                h: functools.partial(install, h, requirement, idx.url, venvs[h], args.python)
                for h in hows
            }
            cases[floor] = functools.partial(unpack_seconds, wheels, tmp / "unpacked")
            installs = b.side_by_side(cases, rounds, warm=False)
        print(f"\n{'install ' + requirement:<40} {'median s':>9}  ({rounds} interleaved rounds)")
        for how, t in installs.items():
            print(f"{how:<40} {b.median(t):>9.1f}   {' '.join(f'{x:.1f}' for x in t)}")
        loads = b.side_by_side(
            {h: functools.partial(import_seconds, venvs[h], module) for h in hows}, imports
        )
        who = "as nobody, root-owned venv" if os.geteuid() == 0 else "PYTHONDONTWRITEBYTECODE=1"
        print(f"\n{'import ' + module + ' (' + who + ')':<40} {'median s':>9}  ({imports} rounds)")
        for how, t in loads.items():
            print(f"{how:<40} {b.median(t):>9.2f}")
    pip_s, uv_s = b.median(installs["pip"]), b.median(installs["uv"])
    floor_s = b.median(installs[floor])
    cold, warm = b.median(loads["uv, no bytecode"]), b.median(loads["uv"])
    second_s = b.median(installs[SECOND])
    goals = [
        b.Goal(
            "uv vs pip, both compiling bytecode",
            f"{pip_s / uv_s:.2f}x",
            f">= {GOAL:g}x",
            pip_s / uv_s >= GOAL,
            f"pip {pip_s:.1f} s, uv {uv_s:.1f} s; uv without bytecode "
            f"{b.median(installs['uv, no bytecode']):.1f} s, but then import {module} takes "
            f"{cold:.2f} s instead of {warm:.2f} s on every start; writing the wheels' files "
            f"alone takes {floor_s:.1f} s here ({b.median(KERNEL_S):.1f} s of it in the kernel), "
            "so above that floor pip spends "
            f"{pip_s - floor_s:.1f} s and uv {uv_s - floor_s:.1f} s",
        ),
        b.Goal(
            "a second venv from the state cache vs pip",
            f"{pip_s / second_s:.2f}x",
            f">= {GOAL:g}x",
            pip_s / second_s >= GOAL,
            f"uv from <state>/cache {second_s:.1f} s (no wheel downloaded), pip {pip_s:.1f} s",
        ),
    ]
    return b.report(goals, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
