"""Benchmark: `egpu-setup verify --device cpu --quick` wall time (target: under 10 s here).

Runs the real command line three times against this interpreter's torch, with the state in a
temporary directory, and prints each time and the median. Not a test: numbers depend on load.

    python benchmarks/verify_cpu.py [--python PATH] [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_S = 10.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="target Python with torch")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "EGPU_SETUP_STATE_DIR": state}
        for i in range(args.runs):
            t0 = time.perf_counter()
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "egpu_setup",
                    "verify",
                    "--device",
                    "cpu",
                    "--quick",
                    "--python",
                    args.python,
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            elapsed = time.perf_counter() - t0
            if res.returncode != 0:
                print(res.stdout + res.stderr, file=sys.stderr)
                return res.returncode
            times.append(elapsed)
            print(f"run {i + 1}: {elapsed:.2f} s")
    median = statistics.median(times)
    verdict = "ok" if median < TARGET_S else "SLOW"
    print(
        f"verify --device cpu --quick: median {median:.2f} s of {len(times)} "
        f"({verdict}, target < {TARGET_S:g} s)"
    )
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
