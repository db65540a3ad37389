"""Checks before anything changes: root, disk space, package manager, PEP 668, Secure Boot.

Each check either passes, warns (logged), or raises the documented error with one next step. The
run lock and the dpkg lock are checked here too so a busy machine is reported before any work;
the executor re-checks the dpkg lock right before apt runs.
"""

from __future__ import annotations

import logging
import os

from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import ActionRequired, BusyError, EgpuSetupError, UsageError
from egpu_setup.host.machine import Host
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, PipInstall, Plan
from egpu_setup.state.paths import StatePaths

log = logging.getLogger("egpu_setup.preflight")

# Measured on Debian 12/13 (docs/sources.md, "Measured here"): the driver with its
# dependencies installs ~1.3 GB; a CPU torch venv ~0.8 GB, a CUDA one ~5 GB. Margins added.
DRIVER_BYTES = 2 * 1024**3
TORCH_CPU_BYTES = 1 * 1024**3
TORCH_CUDA_BYTES = 7 * 1024**3


# Where the key that signs DKMS modules lives: dkms's own (Debian, dkms >= 3) and Ubuntu's
# shim-signed key (update-secureboot-policy); dkms(8), mokutil(1).
MOK_KEYS = ("/var/lib/dkms/mok.pub", "/var/lib/shim-signed/mok/MOK.der")


def preflight(
    plan: Plan, host: Host, paths: StatePaths, facts: HostFacts, options: PlanOptions
) -> list[str]:
    """Raise on what must stop the run; return warnings for what should be known."""
    from egpu_setup.state.lock import RunLock

    warnings: list[str] = []
    if host.kind == "recorded":
        raise UsageError("a recorded host cannot be changed", "use --dry-run, or --root DIR")
    if plan.needs_root and os.geteuid() != 0:
        raise EgpuSetupError(
            "installing the driver and system files needs root; nothing was changed",
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
    warnings += _competing_managers(plan, host)
    warnings += _secure_boot(plan, facts, host)
    for w in warnings:
        log.warning("%s", w)
    return warnings


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


def _competing_managers(plan: Plan, host: Host) -> list[str]:
    """Other GPU managers rewrite the same configuration: the same markers doctor reports
    (`competing-gpu-manager`), so the two can never disagree."""
    from egpu_setup.doctor.collect import probe_manager_files
    from egpu_setup.doctor.rules import competing_managers

    if not any(s.part_name == "config" for s in plan.steps):
        return []
    hits = competing_managers(probe_manager_files(host))
    return [
        f"{h.tool} ({h.path}: {h.detail}) also manages GPUs: switch it off or remove it "
        "(see `egpu-setup doctor`)"
        for h in hits
    ]


def _secure_boot(plan: Plan, facts: HostFacts, host: Host) -> list[str]:
    """Secure Boot: DKMS-built modules must be signed by a key the firmware trusts (dkms(8)).

    A key that dkms generated but nobody enrolled yet is a console step for a person: exit 4
    with the steps; the next run continues (the packages are already in place).
    """
    if not facts.os.secure_boot or host.kind != "live":
        return []
    if not builds_dkms_module(plan):
        return []  # no module built here (torch/config only, or Ubuntu's signed prebuilt ones)
    require_enrolled_key(host)
    return [
        "Secure Boot is on: dkms signs the NVIDIA module with its own key, which must be "
        "enrolled once at the console (egpu-setup says how once the key exists)"
    ]


def builds_dkms_module(plan: Plan) -> bool:
    """The plan installs a driver whose module dkms builds (and signs with a local key).

    Ubuntu's linux-modules-nvidia-* are prebuilt and signed by Canonical's key, which the
    firmware already trusts: no MOK enrolment (docs/sources.md, "Secure Boot")."""
    packages = [
        p
        for s in plan.steps
        if isinstance(s, AptInstall) and s.part_name == "driver"
        for p in s.packages
    ]
    return bool(packages) and not any(p.startswith("linux-modules-nvidia-") for p in packages)


def require_enrolled_key(host: Host) -> None:
    """Exit 4 with the console steps when the module signing key exists but is not enrolled.

    Called before installing and again after the driver packages went in (dkms makes the key
    on its first build), so the person at the laptop learns it before the reboot, not after."""
    pub = next((k for k in MOK_KEYS if host.exists(k)), None)
    if not pub or not host.which("mokutil"):
        return
    res = host.run(["mokutil", "--test-key", pub], timeout=30)
    if "not enrolled" in (res.out + res.err).lower():
        raise ActionRequired(
            f"Secure Boot is on and the module signing key {pub} is not enrolled",
            f"run `sudo mokutil --import {pub}`, choose a one-time password, reboot, "
            "pick 'Enroll MOK' in the blue MokManager screen, then run this command again",
        )
