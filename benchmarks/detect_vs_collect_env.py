"""Startup and live detection, side by side in one run, against their goals (docs/testing.md).

Goals, on the installed tool of an idle machine:
- `egpu-setup --help` under 100 ms;
- `egpu-setup detect --json` (this machine) under 150 ms, and at least 15x faster than `python -m
  torch.utils.collect_env` (what PyTorch asks for in bug reports).
`python -c pass` is shown beside them: the part of each figure no code of ours can remove.
Also shown: the peak memory of detect and collect_env, and `detect --json --from` a recorded
host.

`python` is the interpreter the measured egpu-setup runs on; collect_env runs on this one (it
needs torch: in a lab that is the torch venv, not the tool's). What a lab runs is measured with
the tool scripts/install.sh made (not an editable install, whose import hook every start pays):

    python benchmarks/detect_vs_collect_env.py [--rounds 9] [--smoke] [--tool PATH]
"""

from __future__ import annotations

import subprocess
import sys

import _bench as b

HELP_MS = 100.0  # egpu-setup --help
DETECT_MS = 150.0  # egpu-setup detect --json
DETECT_GOAL = 15.0  # x faster than collect_env


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    rounds = 1 if args.smoke else args.rounds
    b.banner("startup and detection")
    tool = b.tool()
    py = b.tool_python()
    fixture = b.REPO / "tests/fixtures/hosts/tb4-rtx4090-ubuntu2404"
    cases = {
        "python -c pass": b.timed([py, "-c", "pass"]),
        "egpu-setup --help": b.timed([*tool, "--help"]),
        "egpu-setup detect --json": b.timed([*tool, "detect", "--json"]),
    }
    if fixture.is_dir():
        cases["egpu-setup detect --json --from <tb4 bundle>"] = b.timed(
            [*tool, "detect", "--json", "--from", str(fixture)]
        )
    torch_py = sys.executable
    collect_env = [torch_py, "-m", "torch.utils.collect_env"]
    have_torch = (
        not args.smoke
        and subprocess.run(
            [torch_py, "-c", "import torch.utils.collect_env"], check=False
        ).returncode
        == 0
    )
    if have_torch:
        cases["python -m torch.utils.collect_env"] = b.timed(collect_env)
    times = b.side_by_side(cases, rounds, warm=not args.smoke)
    med = {name: b.median(t) for name, t in times.items()}
    print(f"\n{'command':<48} {'median ms':>10}  ({rounds} interleaved rounds)")
    for name, seconds in med.items():
        print(f"{name:<48} {seconds * 1000:>10.1f}")
    bare = med["python -c pass"]
    print(
        f"side by side: --help {med['egpu-setup --help'] / bare:.1f}x and detect --json "
        f"{med['egpu-setup detect --json'] / bare:.1f}x a bare python -c pass"
    )
    _, detect_mib, _ = b.peak_rss([*tool, "detect", "--json"])
    print(f"peak memory: egpu-setup detect --json {detect_mib:.0f} MiB", end="")
    help_ms = med["egpu-setup --help"] * 1000
    detect_ms = med["egpu-setup detect --json"] * 1000
    goals = [
        b.Goal("egpu-setup --help", f"{help_ms:.1f} ms", f"< {HELP_MS:g} ms", help_ms < HELP_MS),
        b.Goal(
            "egpu-setup detect --json",
            f"{detect_ms:.1f} ms",
            f"< {DETECT_MS:g} ms",
            detect_ms < DETECT_MS,
        ),
    ]
    if have_torch:
        _, env_mib, _ = b.peak_rss(collect_env)
        print(f", python -m torch.utils.collect_env {env_mib:.0f} MiB")
        speedup = med["python -m torch.utils.collect_env"] / med["egpu-setup detect --json"]
        goals.append(
            b.Goal(
                "detect --json faster than torch.utils.collect_env",
                f"{speedup:.1f}x",
                f">= {DETECT_GOAL:g}x",
                speedup >= DETECT_GOAL,
            )
        )
    else:
        print()
        why = "--smoke" if args.smoke else "torch is not installed in this interpreter"
        goals.append(b.Goal("detect --json faster than collect_env", "not measured", "", True, why))
    return b.report(goals, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
