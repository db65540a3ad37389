"""Benchmark: the CPU verify against its goals, measured side by side, printed as ratios.

Goals:
1. `egpu-setup verify --device cpu --quick` takes at most 3x `python -c 'import torch'` in the
   same Python (the rest of a quick verify must cost less than two more torch imports).
2. The full `egpu-setup verify --device cpu` finishes inside its default timeout, and passes,
   while two busy processes per core load the machine (started here, stopped at the end).

Runs from anywhere against the installed egpu-setup (started from an empty directory), with the
state in a temporary directory. Not a test: the numbers depend on the machine and its load.

    python benchmarks/verify_cpu.py [--python PATH] [--runs N] [--no-load] [--smoke]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _bench as b

QUICK_GOAL = 3.0  # x import torch
LOAD_PER_CORE = 2


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=b.NEUTRAL)
    return time.perf_counter() - t0, res


def verify_argv(python: str, *extra: str) -> list[str]:
    return [*b.tool(), "verify", "--device", "cpu", "--python", python, "--json", *extra]


def start_load(n: int) -> list[subprocess.Popen[bytes]]:
    """n processes that spin forever (pure Python, no torch): the load of a busy CI machine."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]


def stop_load(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--python", default=sys.executable, help="target Python with torch")
    ap.add_argument("--runs", type=int, default=3, help="runs of import torch and --quick")
    ap.add_argument("--no-load", action="store_true", help="skip the full run under load")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.no_load = 1, True
    b.banner("verify --device cpu")
    from egpu_setup.verify.session import TIMEOUT_FULL_S

    ok = True
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "EGPU_SETUP_STATE_DIR": state}
        imports, quicks = [], []
        for _ in range(args.runs):  # interleaved, so both see the same background load
            imports.append(timed([args.python, "-c", "import torch"], env)[0])
            seconds, res = timed(verify_argv(args.python, "--quick"), env)
            if res.returncode != 0:
                print(res.stdout + res.stderr, file=sys.stderr)
                return res.returncode
            quicks.append(seconds)
        imp, quick = statistics.median(imports), statistics.median(quicks)
        ratio = quick / imp
        ok &= ratio <= QUICK_GOAL
        print(f"import torch            median {imp:6.2f} s of {args.runs}")
        print(f"verify --quick          median {quick:6.2f} s of {args.runs}")
        print(f"  ratio {ratio:.2f}x import torch (goal <= {QUICK_GOAL:g}x): "
              f"{'ok' if ratio <= QUICK_GOAL else 'MISSED'}")  # fmt: skip
        if args.smoke:
            print(f"load average after: {b.load()}")
            print("(--smoke: one run, no load; the figures above mean nothing)")
            return 0
        if args.no_load:
            return 0 if ok else 1
        cores = os.cpu_count() or 1
        load = start_load(LOAD_PER_CORE * cores)
        try:
            time.sleep(1.0)  # let the load settle in
            seconds, res = timed(verify_argv(args.python), env)
        finally:
            stop_load(load)
        passed = res.returncode == 0
        try:
            report = json.loads(res.stdout)
        except ValueError:
            report = {"checks": []}
        share = seconds / TIMEOUT_FULL_S
        ok &= passed and share < 1.0
        print(f"full verify, {LOAD_PER_CORE * cores} busy processes on {cores} cores: "
              f"{seconds:.1f} s, {share:.2f}x the {TIMEOUT_FULL_S:g} s default timeout "
              f"(goal < 1x), {'passed' if passed else 'FAILED'}")  # fmt: skip
        for c in report["checks"]:
            print(f"  {c['status']:4}  {c['id']:<14} {c.get('seconds') or 0:6.1f} s  {c['detail']}")
        if not passed:
            print(res.stderr, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
