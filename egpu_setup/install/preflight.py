"""Checks before anything changes: root, disk space, the run lock, the venv path, and what a
person must undo first (another GPU manager: install/attention.py).

Each check either passes, warns (logged), or raises the documented error with one next step. The
run lock and the dpkg lock are checked here too so a busy machine is reported before any work;
the executor re-checks the dpkg lock right before apt runs.
"""

from __future__ import annotations

import os

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


def _check_space(plan: Plan, host: Host) -> None:
    needs: list[tuple[str, int]] = []
    for step in plan.steps:
        if isinstance(step, AptInstall) and any("nvidia" in p for p in step.packages):
            needs.append(("/var/cache/apt/archives", DRIVER_BYTES))
        if isinstance(step, PipInstall):
            cpu = all("+cpu" in r or not r.startswith("torch") for r in step.requirements)
            needs.append((step.venv, TORCH_CPU_BYTES if cpu else TORCH_CUDA_BYTES))
    for path, need in needs:
        free = host.free_bytes(path)
        if free is not None and free < need:
            raise EgpuSetupError(
                f"{free / 1024**3:.1f} GiB free for {path}, about {need / 1024**3:.0f} GiB needed",
                "free some space (apt-get clean, old kernels, pip caches), then run again",
            )
