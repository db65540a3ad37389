"""What the RECORD check costs a plan: venv_contents on a real torch venv, side by side with the
check it replaced (METADATA, RECORD and INSTALLER there, the console scripts RECORD lists
present: no file of site-packages looked at). Goal: the whole check <= 100 ms idle.

Both read through the same LiveHost, in this process, rounds alternating so each sees the same
load; the first round of each warms the page cache and is not counted.

    python benchmarks/record_check.py [--venv DIR] [--rounds 7] [--smoke]

--venv defaults to the venv of the Python running this (the checkout's .ci/venv holds torch
2.13.0+cpu: 12,251 files in 727 folders).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import _bench as b

from egpu_setup.host.machine import Host, LiveHost
from egpu_setup.plan.installed import _dist_infos, parse_record, venv_contents

GOAL_S = 0.100


def metadata_only(host: Host, venv: str) -> int:
    """The check before RECORD's sizes were compared (egpu-setup at f48dc67's parent): per
    distribution its three files read and RECORD's bin/ entries looked up. Returns how many
    distributions it judged complete."""
    complete = 0
    for info in _dist_infos(host, venv):
        if not all(host.read(f"{info}/{name}", 4096) for name in ("METADATA", "INSTALLER")):
            continue
        site = info.rpartition("/")[0]
        scripts = [
            os.path.normpath(f"{site}/{path}")
            for path, _size in parse_record(host.read(f"{info}/RECORD") or "")
            if path.startswith("../") and "/bin/" in path
        ]
        if all(host.exists(s) for s in scripts):
            complete += 1
    return complete


def record_check(host: Host, venv: str) -> int:
    contents = venv_contents(host, venv)
    return len(contents.versions or {})


def _time(fn: Callable[[Host, str], int], venv: str) -> tuple[float, int]:
    host = LiveHost()
    start = time.perf_counter()
    n = fn(host, venv)
    return time.perf_counter() - start, n


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--venv", default=sys.prefix)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rounds = 1 if args.smoke else args.rounds
    b.banner(f"the RECORD check of {args.venv}")
    _time(metadata_only, args.venv)  # warm the page cache
    _time(record_check, args.venv)
    old: list[float] = []
    new: list[float] = []
    for k in range(rounds):
        pair = [(metadata_only, old), (record_check, new)]
        for fn, into in pair if k % 2 == 0 else pair[::-1]:
            seconds, _ = _time(fn, args.venv)
            into.append(seconds)
    _, dists = _time(record_check, args.venv)
    before, now = b.median(old), b.median(new)
    print(f"distributions judged complete: {dists}; {rounds} rounds, load {b.load()} after")
    for what, xs in (("metadata only", old), ("RECORD sizes ", new)):
        ms = [x * 1000 for x in xs]
        print(f"{what}: median {b.median(ms):.1f} ms ({min(ms):.1f}-{max(ms):.1f})")
    print(f"ratio: {now / before:.2f}x the metadata-only check")
    goal = b.Goal(
        "venv_contents on the venv",
        f"{now * 1000:.0f} ms",
        f"<= {GOAL_S * 1000:.0f} ms idle",
        now <= GOAL_S,
        f"load {b.load()}",
        now / GOAL_S,
    )
    return b.report([goal], args.smoke)


if __name__ == "__main__":
    sys.exit(main())
