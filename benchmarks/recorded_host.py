"""The planning commands on a recorded host, side by side, against their goal.

Goal: `install --dry-run`, `doctor` and `render`, each read from a recorded host (`--from`, the
Thunderbolt 4 + RTX 4090 bundle in tests/fixtures/hosts), take at most 0.3 s each, the whole
process. They are what people wait on while planning a machine or a lab: they read, decide and
print, and change nothing (state goes to a temporary directory).

    python benchmarks/recorded_host.py [--rounds 9] [--smoke]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import _bench as b

GOAL_S = 0.3


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--host", default=str(b.REPO / "tests/fixtures/hosts/tb4-rtx4090-ubuntu2404"))
    args = ap.parse_args()
    rounds = 1 if args.smoke else args.rounds
    b.banner(f"planning commands on a recorded host ({Path(args.host).name})")
    tool = b.tool()
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(Path(tmp) / "state")}
        out = str(Path(tmp) / "render")
        commands = {
            "install --dry-run": [*tool, "install", "--profile", "rtx4090", "--dry-run"],
            "doctor": [*tool, "doctor"],
            "render": [*tool, "render", "--profile", "rtx4090", "--out", out],
        }
        cases = {"python -c pass": b.timed([sys.executable, "-c", "pass"], env)}
        for name, argv in commands.items():
            # doctor exits 1 when it finds an error: a finding, not a failure of the benchmark
            cases[name] = b.timed([*argv, "--from", args.host], env, ok=(0, 1))
        times = b.side_by_side(cases, rounds, warm=not args.smoke)
    print(f"\n{'command (--from the recording)':<40} {'median ms':>10}  ({rounds} rounds)")
    for name, t in times.items():
        print(f"{name:<40} {b.median(t) * 1000:>10.1f}")
    anchor = b.median(times["python -c pass"]) * 1000
    goals = [b.seconds_goal(name, b.median(times[name]), GOAL_S, anchor) for name in commands]
    return b.report(goals, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
