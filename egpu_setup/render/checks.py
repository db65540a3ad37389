r"""Validators: every value that reaches a template, checked against the one shape it may have.

Templates write these values into udev rules, shell scripts and unit files, where a quote, a
newline, `$(...)`, `RUN+=` or `"; ` would become code, so a value that does not match is a
UsageError (exit 2) and nothing is rendered. Patterns are anchored with \Z so a trailing newline
never slips through `$`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from egpu_setup.errors import UsageError

# -- patterns (anchored with \Z so a trailing newline never slips through `$`) ------------------
_PCI_ADDRESS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])\Z")


_DEVICE_ID = re.compile(r"[0-9a-f]{4}\Z")


# The kernel prints a router's unique_id with %pUb: always a canonical UUID
# (Documentation/ABI/testing/sysfs-bus-thunderbolt).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


_SAFE_PATH = re.compile(r"/(?:[A-Za-z0-9._+-]+/)*[A-Za-z0-9._+-]+\Z")


# Kernel parameters the GRUB drop-in may carry (Linux kernel-parameters.txt): a closed list of
# shapes, so a profile or finding can never smuggle shell into /etc/default/grub.d.
_KERNEL_PARAM = re.compile(
    r"(pci=realloc|pci=assign-busses|pci=hpbussize=\d{1,3}|pci=hpmmiosize=\d{1,5}[KMG]"
    r"|pci=hpmmioprefsize=\d{1,5}[KMG]|pci=hpmemsize=\d{1,5}[KMG]|pcie_ports=native"
    r"|pcie_aspm=off|pcie_port_pm=off|thunderbolt\.host_reset=0)\Z"
)


@dataclass(frozen=True)
class PciAddress:
    """A parsed PCI address: every number the templates need, in both notations."""

    domain: int
    bus: int
    device: int
    function: int

    @classmethod
    def parse(cls, text: str, what: str) -> PciAddress:
        m = _PCI_ADDRESS.match(str(text).lower())
        if not m:
            raise UsageError(
                f"{what}: {text!r} is not a PCI address",
                "expected the sysfs form DOMAIN:BUS:DEVICE.FUNCTION, e.g. 0000:3c:00.0",
            )
        return cls(*(int(g, 16) for g in m.groups()))

    @property
    def sysfs(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    @property
    def slot(self) -> str:
        """The address without the function: every function of the card shares it."""
        return self.sysfs.rsplit(".", 1)[0]

    @property
    def xorg_busid(self) -> str:
        """Xorg's BusID: decimal bus@domain:device:function, @domain only when non-zero.

        xorg.conf(5) parses decimal; lspci prints hex, the classic eGPU mistake (NVIDIA README FAQ):
        0000:0a:00.0 -> PCI:10:0:0, 10000:e1:00.0 -> PCI:225@65536:0:0.
        """
        domain = f"@{self.domain}" if self.domain else ""
        return f"PCI:{self.bus}{domain}:{self.device}:{self.function}"


def check_profile_name(name: object) -> str:
    if not isinstance(name, str) or not _PROFILE_NAME.match(name):
        raise UsageError(
            f"profile name {name!r} cannot be written into configuration files",
            "use letters, digits, '.', '_' and '-' only (at most 64 characters)",
        )
    return name


def check_device_id(value: object, what: str) -> str:
    text = str(value).lower().removeprefix("0x") if isinstance(value, str) else ""
    if not _DEVICE_ID.match(text):
        raise UsageError(
            f"{what}: {value!r} is not a PCI device id", "expected 4 hex digits, e.g. 2684"
        )
    return text


def check_uuid(value: object, what: str) -> str:
    text = value.lower() if isinstance(value, str) else ""
    if not _UUID.match(text):
        raise UsageError(
            f"{what}: {value!r} is not a Thunderbolt unique_id",
            "copy the UUID that `boltctl list` prints for the enclosure (8-4-4-4-12 hex digits)",
        )
    return text


def check_path(value: object, what: str) -> str:
    text = value if isinstance(value, str) else ""
    if not _SAFE_PATH.match(text) or "/../" in f"{text}/" or "/./" in f"{text}/":
        raise UsageError(
            f"{what}: {value!r} is not a safe absolute path",
            "use an absolute path of letters, digits, '.', '_', '+', '-' and '/'",
        )
    return text


def check_kernel_params(params: Iterable[str]) -> tuple[str, ...]:
    out = []
    for p in params:
        if not isinstance(p, str) or not _KERNEL_PARAM.match(p):
            raise UsageError(
                f"kernel parameter {p!r} is not one egpu-setup may add",
                "allowed: pci=realloc, pci=hpmmioprefsize=SIZE, pci=assign-busses, "
                "pcie_ports=native, pcie_aspm=off, pcie_port_pm=off, thunderbolt.host_reset=0",
            )
        if p not in out:
            out.append(p)
    return tuple(out)


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{what}: {value!r} is not true or false", "write true or false")
    return value


def check_choice(value: object, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise UsageError(f"{what}: {value!r} is not one of {', '.join(choices)}", "fix the profile")
    return str(value)


def check_temperature(value: object, what: str) -> str:
    """A temperature limit in degrees C, 40 to 110 (profile.schema.json expect.max_temp_c), as
    the digits a unit's command line gets: "88", "87.5"."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 40 <= value <= 110
    if not ok:
        raise UsageError(
            f"{what}: {value!r} is not a temperature between 40 and 110 C", "fix the profile"
        )
    return f"{float(value):g}"  # type: ignore[arg-type]
