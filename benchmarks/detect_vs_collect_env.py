"""Startup and detection speed, side by side in one run.

Compares `egpu-setup detect --json` with `python -m torch.utils.collect_env` (what PyTorch asks
for in bug reports) on this machine, several rounds each, and prints medians and the ratio.
Also times `egpu-setup --help` and `detect --json --from` a recorded host. Goals (issue 2):
--help < 150 ms, detect < 250 ms, detect >= 7x faster than collect_env.

    python benchmarks/detect_vs_collect_env.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def median_ms(argv: list[str], rounds: int) -> float:
    wall(argv)  # warm the page cache; the first run of anything measures the disk
    return 1000 * statistics.median(wall(argv) for _ in range(rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    exe = shutil.which("egpu-setup")
    tool = [exe] if exe else [sys.executable, "-m", "egpu_setup"]
    fixture = REPO / "tests/fixtures/hosts/tb4-rtx4090-ubuntu2404"
    rows = [
        ("egpu-setup --help", tool + ["--help"]),
        ("egpu-setup detect --json", tool + ["detect", "--json"]),
    ]
    if fixture.is_dir():
        rows.append(
            (
                "egpu-setup detect --json --from <tb4 bundle>",
                tool + ["detect", "--json", "--from", str(fixture)],
            )
        )
    have_torch = (
        subprocess.run(
            [sys.executable, "-c", "import torch.utils.collect_env"],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if have_torch:
        rows.append(
            ("python -m torch.utils.collect_env", [sys.executable, "-m", "torch.utils.collect_env"])
        )
    results = {}
    print(f"{'command':<50} {'median ms':>10}   ({args.rounds} rounds)")
    for label, argv in rows:
        results[label] = median_ms(argv, args.rounds)
        print(f"{label:<50} {results[label]:>10.1f}")
    if have_torch:
        ratio = results["python -m torch.utils.collect_env"] / results["egpu-setup detect --json"]
        print(f"\ncollect_env / detect: {ratio:.1f}x  (goal >= 7x)")
    else:
        print(
            "\ntorch is not installed here: no collect_env comparison (pip install torch==2.13.0)"
        )


if __name__ == "__main__":
    main()
