"""The driver hold's step: planned when the profile (or `--hold-driver`) asks for it and the
hold on the host is not already the one dpkg's status calls for, so a second run plans nothing."""

from __future__ import annotations

from collections.abc import Sequence

from egpu_setup.detect.dpkg_status import driver_packages
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
) -> list[Step]:
    """[HoldDriver] when the driver is to be held and its hold is missing or stale; [] else.

    After an apt step in `driver` the versions are known only once it ran (the step reads them
    then); without one, the hold is what dpkg's status says now, and planned only when the two
    files on the host differ from it."""
    named = tuple(p for p in resolution.driver.packages if "nvidia" in p or "cuda" in p)
    if not options.hold_driver or "driver" not in options.only or not named:
        return []
    step = HoldDriver(named, profile.name, profile.mode)
    if any(isinstance(s, AptInstall) for s in driver):
        return [step]
    held = driver_packages(dpkg_entries(host), named)
    if not held:
        return []  # no driver installed and none planned (host-managed, in-kernel): nothing held
    wanted = hold_files(held, profile.name, profile.mode)
    if all(host.read(path) == content for path, content, _ in wanted):
        return []
    return [HoldDriver(named, profile.name, profile.mode, tuple(sorted(held.items())))]
