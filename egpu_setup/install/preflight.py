"""Checks before anything changes: root, disk space, the run lock, the venv path, and what a
person must undo first (another GPU manager: install/attention.py).

Each check either passes, warns (logged), or raises the documented error with one next step. The
run lock and the dpkg lock are checked here too so a busy machine is reported before any work;
the executor re-checks the dpkg lock right before apt runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from egpu_setup.compat.matrix import pip_temp_bytes
from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import BusyError, EgpuSetupError, UsageError
from egpu_setup.host.machine import Host
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, PipInstall, Plan
from egpu_setup.state.paths import StatePaths

# Measured on Debian 12/13 (docs/sources.md, "Measured here"): the driver with its
# dependencies installs ~1.3 GB; a CPU torch venv ~0.8 GB, a CUDA one ~5 GB. Margins added.
DRIVER_BYTES = 2 * 1024**3
TORCH_CPU_BYTES = 1 * 1024**3
TORCH_CUDA_BYTES = 7 * 1024**3
# What pip holds in its TMPDIR while it installs, beside the venv (execute/pip.py points TMPDIR
# into the venv: PipInstall.temp_dir): every wheel it downloaded, their own sizes, measured for
# the CPU build and summed from the index for the CUDA ones (torch.yaml, `pip_temp`).
TORCH_CPU_WHEELS, TORCH_CUDA_WHEELS = (pip_temp_bytes(cpu) for cpu in (True, False))
APT_CACHE = "/var/cache/apt/archives"  # where apt-get downloads the .debs it installs


def preflight(
    plan: Plan, host: Host, paths: StatePaths, facts: HostFacts, options: PlanOptions
) -> None:
    """Raise on what must stop the run, before anything changes."""
    from egpu_setup.state.lock import RunLock

    if host.kind == "recorded":
        raise UsageError("a recorded host cannot be changed", "use --dry-run, or --root DIR")
    if plan.needs_root and os.geteuid() != 0:
        raise EgpuSetupError(
            f"{_what_needs_root(plan)} needs root; nothing was changed",
            "run it with sudo, or see the plan first with --dry-run",
        )
    holder = RunLock(paths.lock).holder()
    if holder:
        raise BusyError(
            f"another egpu-setup run is in progress ({holder})",
            "wait for it to finish; never delete the lock file",
        )
    _check_venv(plan, host)
    _check_space(plan, host)


def _what_needs_root(plan: Plan) -> str:
    """What a normal user cannot do: the driver and system files, or (for a torch-only plan)
    the python3-venv package the venv needs."""
    parts = {s.part_name for s in plan.steps if not isinstance(s, PipInstall)}
    if parts == {"torch"}:
        packages = [p for s in plan.steps if isinstance(s, AptInstall) for p in s.packages]
        return f"installing {' '.join(packages)} (for the torch venv)"
    return "installing the driver and system files"


def _check_venv(plan: Plan, host: Host) -> None:
    for step in plan.steps:
        if not isinstance(step, PipInstall):
            continue
        venv = step.venv
        if venv and host.exists(venv) and not host.exists(f"{venv}/pyvenv.cfg"):
            raise UsageError(
                f"--venv {step.venv} exists and is not a virtual environment (no pyvenv.cfg)",
                "egpu-setup never installs into a system Python (PEP 668): pass a new path",
            )


@dataclass(frozen=True)
class SpaceNeed:
    """What the plan will write on one filesystem: the paths on it, the bytes they take (the
    sizes above, summed when the apt cache and the venv share a filesystem), and its free
    bytes now (None when that cannot be told: a recorded host)."""

    paths: tuple[str, ...]
    need: int
    free: int | None

    @property
    def short(self) -> bool:
        return self.free is not None and self.free < self.need

    def describe(self) -> str:
        free = "free space unknown" if self.free is None else f"{_gib(self.free)} GiB free"
        return f"about {_gib(self.need)} GiB in {' and '.join(self.paths)} ({free})"

    def to_json(self) -> dict[str, object]:
        return {"paths": list(self.paths), "bytes": self.need, "free_bytes": self.free}


def space_needs(plan: Plan, host: Host) -> tuple[SpaceNeed, ...]:
    """The disk space the plan's downloads and installs take, per filesystem: the driver's
    packages in the apt cache, torch in its venv (a CPU or a CUDA wheel) and the wheels pip
    downloads into its temporary directory first (inside the venv, so on its filesystem)."""
    needs: dict[str, int] = {}
    beside: dict[str, str] = {}  # a path -> the one whose filesystem it is on by construction
    for step in plan.steps:
        if isinstance(step, AptInstall) and any("nvidia" in p for p in step.packages):
            needs[APT_CACHE] = needs.get(APT_CACHE, 0) + DRIVER_BYTES
        if isinstance(step, PipInstall):
            cpu = all("+cpu" in r or not r.startswith("torch") for r in step.requirements)
            need = TORCH_CPU_BYTES if cpu else TORCH_CUDA_BYTES
            needs[step.venv] = needs.get(step.venv, 0) + need
            wheels = TORCH_CPU_WHEELS if cpu else TORCH_CUDA_WHEELS
            needs[step.temp_dir] = needs.get(step.temp_dir, 0) + wheels
            beside[step.temp_dir] = step.venv
    live = host.kind != "recorded"  # a recording's folder is not the machine's disk
    by_fs: dict[object, tuple[list[str], int, int | None]] = {}
    for path, need in needs.items():
        on = beside.get(path, path)
        key = (host.filesystem_of(on) if live else None) or on  # unknown: its own
        paths, total, _ = by_fs.get(key, ([], 0, None))
        by_fs[key] = ([*paths, path], total + need, host.free_bytes(path) if live else None)
    return tuple(SpaceNeed(tuple(p), need, free) for p, need, free in by_fs.values())


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f}"


def _check_space(plan: Plan, host: Host) -> None:
    for need in space_needs(plan, host):
        if need.short:
            raise EgpuSetupError(
                f"not enough disk space: {need.describe()}; nothing was changed",
                "free some space (apt-get clean, old kernels, pip caches) on the filesystem "
                f"of {need.paths[0]}, or pass --venv PATH on another one, then run again",
            )
