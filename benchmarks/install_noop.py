"""No-op re-run of `egpu-setup install`: goal < 3 s, and no package manager or installer started.

A first run provisions the configuration into a scratch system image (`--root`); then the same
command runs again N times (the installed egpu-setup, from an empty directory). Each re-run must
print "Nothing to do" and add no run to the journal (the executor, hence apt/pip, is never
reached: an empty plan stops before it).

    python benchmarks/install_noop.py [--runs 5] [--profile rtx4090] [--smoke]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import _bench as b

GOAL_S = 3.0


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", default=str(b.REPO / "profiles" / "rtx4090.yaml"))
    args = ap.parse_args()
    runs = 1 if args.smoke else args.runs
    b.banner("a no-op re-run of install")
    with tempfile.TemporaryDirectory(prefix="egpu-noop-") as tmp:
        root = Path(tmp) / "root"
        (root / "etc").mkdir(parents=True)
        env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(Path(tmp) / "state")}
        argv = [*b.tool(), "install", "--profile", args.profile, "--root", str(root)]
        argv += ["--only", "config", "--yes"]
        _, first = b.run(argv, env)
        if first.returncode != 0:
            print(first.stderr, file=sys.stderr)
            return 2
        journal = Path(tmp) / "state" / "journal.jsonl"
        runs_before = journal.read_text().count('"run-begin"')
        times = []
        for _ in range(runs):
            seconds, proc = b.run(argv, env)
            times.append(seconds)
            if proc.returncode != 0 or "Nothing to do" not in proc.stdout:
                print(f"re-run was not a no-op:\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
                return 2
        started = journal.read_text().count('"run-begin"') - runs_before
    med = b.median(times)
    print(f"no-op re-run: median {med:.2f} s, min {min(times):.2f} s, max {max(times):.2f} s")
    goals = [
        b.Goal(
            "install re-run with nothing to do",
            f"{med:.2f} s",
            f"< {GOAL_S:g} s",
            med < GOAL_S,
            of_target=med / GOAL_S,
        ),
        b.Goal("executor runs started by the re-runs", str(started), "0", started == 0),
    ]
    return b.report(goals, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
