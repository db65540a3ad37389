"""No-op re-run of `egpu-setup install`: goal < 3 s, and no package manager or installer started.

A first run provisions the configuration into a scratch system image (`--root`); then the same
command runs again N times. Each re-run must print "Nothing to do" and add no run to the journal
(the executor, hence apt/pip, is never reached: an empty plan stops before it).

    python benchmarks/install_noop.py [--runs 5] [--profile rtx4090]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOAL_S = 3.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", default=str(REPO / "profiles" / "rtx4090.yaml"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-noop-") as tmp:
        root = Path(tmp) / "root"
        (root / "etc").mkdir(parents=True)
        env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(Path(tmp) / "state")}
        argv = [
            sys.executable,
            "-m",
            "egpu_setup",
            "install",
            "--profile",
            args.profile,
            "--root",
            str(root),
            "--only",
            "config",
            "--yes",
        ]
        first = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if first.returncode != 0:
            print(first.stderr, file=sys.stderr)
            return 1
        journal = Path(tmp) / "state" / "journal.jsonl"
        runs_before = journal.read_text().count('"run-begin"')
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            times.append(time.perf_counter() - t)
            if proc.returncode != 0 or "Nothing to do" not in proc.stdout:
                print(f"re-run was not a no-op:\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
                return 1
        started = journal.read_text().count('"run-begin"') - runs_before
    med = statistics.median(times)
    print(
        f"no-op re-run: median {med:.2f} s, min {min(times):.2f} s, max {max(times):.2f} s "
        f"over {args.runs} runs; executor runs started: {started} (goal < {GOAL_S:g} s, 0 runs)"
    )
    return 0 if med < GOAL_S and started == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
