"""The driver hold's step: planned when the profile (or `--hold-driver`) asks for it and the
hold on the host is not already the one dpkg's status calls for, so a second run plans nothing."""

from __future__ import annotations

from collections.abc import Sequence

from egpu_setup.detect.dpkg_status import HOLD_PIN, driver_packages, parse_pins
from egpu_setup.host.machine import Host
from egpu_setup.plan.installed import dpkg_entries
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, HoldDriver, Step
from egpu_setup.profile.types import Profile
from egpu_setup.render.hold import hold_files
from egpu_setup.resolve.resolution import Resolution


def hold_steps(
    resolution: Resolution,
    profile: Profile,
    host: Host,
    options: PlanOptions,
    driver: Sequence[Step],
) -> tuple[list[Step], list[Step]]:
    """(before, after) the driver's steps: [HoldDriver] after them when the driver is to be held
    and its hold is missing or stale; before them, the hold released when an apt step is planned
    and egpu-setup's pin holds something (apt would otherwise keep the pinned versions and the
    upgrade or reinstall would do nothing), or for good when the driver is no longer to be held.

    After an apt step the versions are known only once it ran (the step reads them then);
    without one, the hold is what dpkg's status says now, and planned only when the two files
    on the host differ from it."""
    # the driver's own packages (not the kernel headers); none when an installed driver is
    # kept, and then the NVIDIA driver's source packages by name (detect/dpkg_status.py)
    named = tuple(p for p in resolution.driver.packages if "nvidia" in p or "cuda" in p)
    if "driver" not in options.only:
        return [], []
    pinned = parse_pins(host.read(HOLD_PIN) or "")
    if not options.hold_driver:
        # the profile (or --no-hold-driver) holds nothing: a hold an earlier run left goes
        if not pinned:
            return [], []
        return [HoldDriver(named, profile.name, profile.mode, release=True, for_good=True)], []
    if resolution.driver.action in ("host-managed", "in-kernel"):
        return [], []  # WSL's driver is Windows'; amdgpu is the kernel's: no packages to hold
    step = HoldDriver(named, profile.name, profile.mode)
    if any(isinstance(s, AptInstall) for s in driver):
        release: list[Step] = [HoldDriver(named, profile.name, profile.mode, release=True)]
        return (release if pinned else []), [step]
    held = driver_packages(dpkg_entries(host), named)
    if not held:
        return [], []  # no driver installed and none planned: nothing to hold
    wanted = hold_files(held, profile.name, profile.mode)
    if all(host.read(path) == content for path, content, _ in wanted):
        return [], []
    return [], [HoldDriver(named, profile.name, profile.mode, tuple(sorted(held.items())))]
