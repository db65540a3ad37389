"""Compare egpu-setup's resolver with a driver-only rule, and time `egpu-setup resolve`.

The driver-only rule is what uv's `--torch-backend=auto` does (astral-sh/uv
`crates/uv-torch/src/backend.rs`): read the driver version, keep every CUDA backend whose minimum
driver is met (LINUX_CUDA_DRIVERS; the Windows table under WSL2), search those indexes newest CUDA
first, then CPU; take the newest torch the first index with a match offers. No PCI id, no compute
capability, no distro; no driver loaded means CPU. Both sides read the same wheel data (our
matrix), so every difference comes from the rule, not the data.

Goal: `resolve --gpu 10de:2684 --driver 550.54.14 --distro ubuntu-22.04 --python 3.11 --json`
(every fact given, so nothing is detected) in at most 0.1 s, the whole process. Also timed, side
by side: fewer flags (this machine is read for the rest), this machine, and a recorded host.

    python benchmarks/resolve_vs_driver_only.py            # table + timing
    python benchmarks/resolve_vs_driver_only.py --rounds 15 [--no-timing] [--smoke]
"""

from __future__ import annotations

import sys

import _bench as b

ROOT = b.REPO
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "resolve")]  # conftest, test_resolve

from test_resolve import CASES, Case

from egpu_setup.compat.matrix import load_snapshot
from egpu_setup.compat.versions import ArchList, DriverVersion, PythonVersion, variant_cuda
from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolution import Notes
from egpu_setup.resolve.resolver import resolve
from egpu_setup.resolve.target import identify_gpu

M = load_snapshot()


def driver_only(case: Case) -> tuple[str, str]:
    """(choice "2.9.1+cu128" or "-", note) under the driver-only rule."""
    c = Constraints(**case.c)
    facts = case.facts
    text = c.driver or (facts.nvidia.driver_version if facts else None)
    python = c.python or (facts.python.version if facts else None) or "3.12"
    python = str(PythonVersion.from_str(python))
    wsl = c.platform == "wsl" or bool(facts and facts.os.wsl)
    if text:
        driver = DriverVersion.from_str(text.splitlines()[0])
        backends = [
            cv.variant
            for cv in M.cuda
            if driver >= (cv.min_driver_windows if wsl else cv.min_driver)
        ]
        backends.sort(key=lambda v: variant_cuda(v) or (0, 0), reverse=True)
    else:
        backends = []
    if c.cuda:  # a pinned backend (--torch-backend=cu128)
        backends = [c.cuda] if c.cuda != "cpu" else []
    from egpu_setup.resolve.constraints import spec_filter

    matches, _local, _ = spec_filter(c.torch_spec)
    for variant in [*backends, "cpu"]:
        for release in M.torch:  # newest first
            v = release.variant(variant)
            if v and matches(release.version) and python in release.pythons(v):
                return f"{release.version}+{variant}", "" if text else "no driver loaded"
    return "-", "no wheel"


def arch_of(choice: str) -> ArchList | None:
    """The arch list of a "VERSION+VARIANT" the matrix lists (None: no such wheel, or unknown)."""
    version, variant = choice.split("+")
    release = M.torch_version(version)
    wheel = release.variant(variant) if release else None
    return wheel.arch if wheel else None


def runs_on_gpu(case: Case, choice: str) -> str:
    """Would `choice` have kernels for the case's GPU? ('' when it does or nothing is known)."""
    if choice == "-" or choice.endswith("+cpu"):
        return "CPU build" if choice.endswith("+cpu") else ""
    c = Constraints(**case.c)
    target = None
    if c.gpu:
        try:
            target = identify_gpu(c.gpu, M, Notes())
        except EgpuSetupError:
            return ""
    elif case.facts and case.facts.egpu:
        g = case.facts.egpu
        from egpu_setup.compat.versions import ComputeCapability

        if g.compute_capability:
            cc = ComputeCapability.from_str(g.compute_capability)
            arch = arch_of(choice)
            if arch is None or arch.runs(cc):
                return ""
            return f"no kernels for sm_{cc.major}{cc.minor}"
        return ""
    if target is None or target.cc is None:
        return ""
    arch = arch_of(choice)
    if arch is None or arch.runs(target.cc):
        return ""
    return f"no kernels for sm_{target.cc.major}{target.cc.minor}"


def ours(case: Case) -> str:
    try:
        r = resolve(case.facts, None, Constraints(**case.c), matrix=M)
    except UsageError:
        return "bad input"
    except EgpuSetupError as exc:
        return f"refused: {exc.message[:60]}"
    return f"{r.torch.version}+{r.torch.variant}" + (
        f" (driver {r.driver.action} {r.driver.branch})"
        if r.driver.action in ("install", "upgrade")
        else ""
    )


def compare() -> int:
    rows = []
    for case in CASES:
        mine = ours(case)
        if mine == "bad input":
            continue
        theirs, note = driver_only(case)
        broken = runs_on_gpu(case, theirs)
        same = mine.split(" ")[0] == theirs
        rows.append((case.id, theirs, broken or note, mine, same))
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  {'driver-only (uv auto)':<22} {'problem':<26} egpu-setup")
    for cid, theirs, problem, mine, same in rows:
        mark = " " if same else "*"
        print(f"{cid:<{width}}{mark} {theirs:<22} {problem:<26} {mine}")
    differ = [r for r in rows if not r[4]]
    no_kernels = [r for r in rows if r[2].startswith("no kernels")]
    print(
        f"\n{len(rows)} cases: {len(differ)} differ (*); the driver-only choice has no kernels for "
        f"the GPU in {len(no_kernels)}, installs a CPU build in "
        f"{sum(1 for r in rows if r[2] in ('CPU build', 'no driver loaded'))}"
    )
    return len(differ)


RESOLVE_GOAL_S = 0.15  # the budget in docs/testing.md: resolve with every fact given, idle
ALL_GIVEN = ["--gpu", "10de:2684", "--driver", "550.54.14", "--distro", "ubuntu-22.04"]
ALL_GIVEN += ["--python", "3.11"]


def time_cli(rounds: int, smoke: bool) -> list[b.Goal]:
    """Whole-process medians of `egpu-setup resolve --json`, interleaved with `python -c pass`."""
    tool = [*b.tool(), "resolve", "--json"]
    fixture = ROOT / "tests/fixtures/hosts/tb4-rtx4090-ubuntu2404"
    cases = {
        "python -c pass": b.timed([sys.executable, "-c", "pass"]),
        "every fact given (--gpu --driver --distro --python)": b.timed([*tool, *ALL_GIVEN]),
        "what-if, the rest read here (--gpu --distro)": b.timed(
            [*tool, "--gpu", "2684", "--distro", "ubuntu-24.04"]
        ),
        "this machine": b.timed(tool),
        "recorded host (--from <tb4 bundle>)": b.timed([*tool, "--from", str(fixture)]),
    }
    times = b.side_by_side(cases, rounds, warm=not smoke)
    print(f"\n{'egpu-setup resolve --json':<52} {'median ms':>10}  ({rounds} interleaved rounds)")
    for name, t in times.items():
        print(f"{name:<52} {b.median(t) * 1000:>10.1f}")
    anchor = b.median(times["python -c pass"]) * 1000
    given = b.median(times["every fact given (--gpu --driver --distro --python)"])
    return [b.seconds_goal("resolve, every fact given", given, RESOLVE_GOAL_S, anchor)]


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (median)")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    b.banner("resolve: our rule vs a driver-only rule; resolve's wall time")
    compare()
    if args.no_timing:
        return 0
    return b.report(time_cli(1 if args.smoke else args.rounds, args.smoke), args.smoke)


if __name__ == "__main__":
    sys.exit(main())
