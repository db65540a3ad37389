"""Suspend with the eGPU in display mode: NVIDIA's video-memory preservation and its units.

The driver keeps all of video memory over a suspend only with
NVreg_PreserveVideoMemoryAllocations=1 *and* its own systemd units driving
/proc/driver/nvidia/suspend; the option without the units makes every suspend fail. So both come
together, and only where the driver's packages ship the units (data/sleep.yaml): the option in
our modprobe drop-in, and each unit enabled as `systemctl enable` would, a link
/etc/systemd/system/<target>.requires/<unit> to the unit where the package puts it. NVIDIA's
units are never written by egpu-setup.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from egpu_setup.host.machine import Host
from egpu_setup.render.checks import check_choice, check_path

# systemd.unit(5): enabling a unit with RequiredBy=X links it into X.requires/.
SYSTEMD_UNIT_DIR = "/etc/systemd/system"


@dataclass(frozen=True)
class SleepUnit:
    name: str  # "nvidia-suspend.service"
    required_by: tuple[str, ...]  # its [Install] RequiredBy=


@dataclass(frozen=True)
class ShippedBy:
    scheme: str  # "debian" / "ubuntu" (data/distros.yaml)
    package: str  # may hold "{branch}"
    unit_dir: str
    pulled_in_by: str | None  # the resolved driver package that depends on `package`


@dataclass(frozen=True)
class SleepGuard:
    """What egpu-setup-sleep-guard.service runs with (install/sleep_guard.py)."""

    inhibitor: str  # /usr/bin/systemd-inhibit
    node: str  # the CUDA node, /dev/nvidia-uvm
    mode: str  # "block" / "delay"


@dataclass(frozen=True)
class SleepData:
    units: tuple[SleepUnit, ...]
    temporary_file_path: str
    shipped_by: tuple[ShippedBy, ...]
    inhibitor: str
    cuda_node: str
    inhibit_modes: tuple[str, ...]


@dataclass(frozen=True)
class SleepSetup:
    """What display mode renders for suspend: the module options, and the links that enable the
    units in `unit_dir`."""

    unit_dir: str
    temporary_file_path: str
    units: tuple[SleepUnit, ...]

    def links(self) -> tuple[tuple[str, str], ...]:
        """(link path, target) for every unit and every unit that requires it."""
        return tuple(
            (f"{SYSTEMD_UNIT_DIR}/{target}.requires/{u.name}", f"{self.unit_dir}/{u.name}")
            for u in self.units
            for target in u.required_by
        )


@functools.cache
def load_sleep_data() -> SleepData:
    """data/sleep.yaml, validated (a wrong row is a bug in the data: ValueError)."""
    from egpu_setup.compat.shipped import load

    data = load("sleep.yaml")
    units = tuple(
        SleepUnit(str(u["name"]), tuple(str(t) for t in u["required_by"])) for u in data["units"]
    )
    shipped = tuple(
        ShippedBy(
            str(s["scheme"]),
            str(s["package"]),
            check_path(str(s["unit_dir"]), "sleep.yaml unit_dir"),
            str(s["pulled_in_by"]) if s.get("pulled_in_by") else None,
        )
        for s in data["shipped_by"]
    )
    if not units or not all(u.name.endswith(".service") and u.required_by for u in units):
        raise ValueError("sleep.yaml: every unit needs a .service name and required_by")
    path = check_path(str(data["temporary_file_path"]), "sleep.yaml temporary_file_path")
    modes = tuple(str(m) for m in data["inhibit_modes"])
    if not modes or not set(modes) <= {"block", "delay"}:
        raise ValueError("sleep.yaml: inhibit_modes are logind's block and delay")
    return SleepData(
        units,
        path,
        shipped,
        check_path(str(data["inhibitor"]), "sleep.yaml inhibitor"),
        check_path(str(data["cuda_node"]), "sleep.yaml cuda_node"),
        modes,
    )


def plan_sleep_guard(inhibit: str) -> SleepGuard | None:
    """The sleep guard a profile's hotplug.sleep_inhibit asks for; None for "off" (UsageError
    for anything else the schema would not have let through)."""
    data = load_sleep_data()
    mode = check_choice(inhibit, (*data.inhibit_modes, "off"), "profile hotplug.sleep_inhibit")
    if mode == "off":
        return None
    return SleepGuard(data.inhibitor, data.cuda_node, mode)


def sleep_unit_paths() -> tuple[str, ...]:
    """Where each distribution's package puts nvidia-suspend.service (what the plan probes)."""
    data = load_sleep_data()
    first = data.units[0].name
    return tuple(dict.fromkeys(f"{s.unit_dir}/{first}" for s in data.shipped_by))


def plan_sleep(
    mode: str,
    family: str | None,
    branch: int | None,
    packages: tuple[str, ...],
    installed_dir: str | None,
    notes: list[str],
) -> SleepSetup | None:
    """The suspend setup display mode gets, or None (compute mode; no units to drive it).

    installed_dir: the directory the target already has nvidia-suspend.service in (probed),
    else None; packages: the resolved driver packages, which install the units when the data
    says one of them pulls their package in."""
    if mode != "display":
        return None
    data = load_sleep_data()
    unit_dir = installed_dir
    rows = [s for s in data.shipped_by if s.scheme == family]
    if unit_dir is None and branch is not None:
        for row in rows:
            wanted = (row.pulled_in_by or row.package).format(branch=branch)
            if any(p == wanted or p.startswith(wanted + "-") for p in packages):
                unit_dir = row.unit_dir
    if unit_dir is None:
        which = (rows[0].pulled_in_by or rows[0].package) if rows else "the driver's packages"
        notes.append(
            "display mode: the driver's suspend services (nvidia-suspend/resume/hibernate) are "
            "not installed here, so video memory is not preserved over a suspend (install "
            f"{which.format(branch=branch or 'N')}, then run install again to enable them)"
        )
        return None
    return SleepSetup(check_path(unit_dir, "unit directory"), data.temporary_file_path, data.units)


def probe_sleep_units(host: Host) -> str | None:
    """The directory where the target has NVIDIA's nvidia-suspend.service, or None."""
    for path in sleep_unit_paths():
        if host.exists(path):
            return path.rsplit("/", 1)[0]
    return None
