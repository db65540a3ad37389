"""PCI display devices from sysfs, and whether each sits in an external enclosure.

Sources, in order: /sys/bus/pci/devices (ids, driver, link, `removable`, `boot_vga`, the bridge
chain from the canonical path), then lspci text when sysfs has nothing (a pasted bug report).
The external/internal decision collects evidence rather than trusting one signal, because each
signal alone misleads (docs/sources.md, Thunderbolt): NVIDIA's own check misses TB4/TB5, USB4 and
OCuLink; `removable` is absent before Linux 5.16 and "unknown" on many OCuLink ports.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from egpu_setup.compat.gpus import is_mobile_name
from egpu_setup.detect.facts import Gpu, Link
from egpu_setup.detect.sysfs import parse_hex_id, parse_int, parse_link_speed
from egpu_setup.host.machine import Host

PCI_DEVICES = "/sys/bus/pci/devices"
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")
_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
VENDORS = {"10de": "nvidia", "1002": "amd", "8086": "intel"}
# SMBIOS chassis types that are portable (DMTF DSP0134, "Chassis Types"): Portable, Laptop,
# Notebook, Sub Notebook, Convertible, Detachable.
LAPTOP_CHASSIS = {"8", "9", "10", "14", "31", "32"}


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs shows it."""

    address: str
    path: str  # canonical sysfs path
    class_id: str | None
    vendor_id: str | None
    device_id: str | None
    subsystem_vendor_id: str | None
    subsystem_device_id: str | None
    revision: str | None
    driver: str | None
    link: Link
    removable: str | None
    boot_vga: bool | None
    bridges: tuple[str, ...]

    @property
    def is_display(self) -> bool:
        return self.class_id is not None and self.class_id.startswith("03")


@dataclass(frozen=True)
class Tunnel:
    """A bridge known to carry Thunderbolt/USB4."""

    connection: str
    name: str


@functools.cache
def _tunnel_table() -> dict[tuple[str, str], Tunnel]:
    from importlib.resources import files

    import yaml

    text = files("egpu_setup.data").joinpath("pcie_tunnels.yaml").read_text()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(text, Loader=loader)
    return {
        (row["vendor"], row["device"]): Tunnel(row["connection"], row["name"])
        for row in data["bridges"]
    }


def probe_function(host: Host, address: str) -> PciFunction | None:
    """Read one PCI function's attributes; None when it is not a PCI device directory."""
    base = f"{PCI_DEVICES}/{address}"
    canonical = host.resolve(base) or base
    parts = canonical.split("/")
    chain = tuple(p for p in parts[:-1] if _ADDR.match(p))
    driver_link = host.readlink(f"{canonical}/driver")
    attr = lambda name: host.read_attr(f"{canonical}/{name}")  # noqa: E731
    cls = attr("class")
    class_id = parse_hex_id(cls, 6)
    return PciFunction(
        address=address,
        path=canonical,
        class_id=class_id,
        vendor_id=parse_hex_id(attr("vendor")),
        device_id=parse_hex_id(attr("device")),
        subsystem_vendor_id=parse_hex_id(attr("subsystem_vendor")),
        subsystem_device_id=parse_hex_id(attr("subsystem_device")),
        revision=parse_hex_id(attr("revision"), 2),
        driver=driver_link.rstrip("/").rsplit("/", 1)[-1] if driver_link else None,
        link=Link(
            speed_gts=parse_link_speed(attr("current_link_speed")),
            width=parse_int(attr("current_link_width")),
            max_speed_gts=parse_link_speed(attr("max_link_speed")),
            max_width=parse_int(attr("max_link_width")),
        ),
        removable=attr("removable"),
        boot_vga=_bool_attr(attr("boot_vga")),
        bridges=chain,
    )


def _bool_attr(text: str | None) -> bool | None:
    return {"1": True, "0": False}.get(text or "")


def probe_functions(host: Host) -> tuple[PciFunction, ...]:
    """Every PCI function listed under /sys/bus/pci/devices."""
    out = []
    for address in host.listdir(PCI_DEVICES):
        if _ADDR.match(address):
            fn = probe_function(host, address)
            if fn is not None:
                out.append(fn)
    return tuple(out)


def hotplug_slot_buses(host: Host) -> frozenset[str]:
    """Bus addresses ("0000:3c:00") of PCIe slots registered by pciehp (hot-plug capable)."""
    buses = set()
    for slot in host.listdir("/sys/bus/pci/slots"):
        addr = host.read_attr(f"/sys/bus/pci/slots/{slot}/address")
        if addr:
            buses.add(addr.lower())
    return frozenset(buses)


def pci_ids_text(host: Host) -> str | None:
    for path in PCI_IDS_PATHS:
        text = host.read(path)
        if text:
            return text
    return None


def tunnel_of(fn: PciFunction, name: str | None) -> Tunnel | None:
    """The Thunderbolt/USB4 tunnel a bridge carries, by id, else by its pci.ids name."""
    known = _tunnel_table().get((fn.vendor_id or "", fn.device_id or ""))
    if known:
        return known
    if name and re.search(r"thunderbolt", name, re.IGNORECASE):
        return Tunnel("thunderbolt", name)
    if name and re.search(r"\bUSB4\b", name):
        return Tunnel("usb4", name)
    return None


@dataclass(frozen=True)
class Placement:
    external: bool | None
    connection: str
    evidence: tuple[str, ...]


def decide_placement(
    gpu: PciFunction,
    name: str | None,
    tunnels: list[tuple[str, Tunnel]],
    *,
    chassis_type: str | None,
    hotplug_buses: frozenset[str],
    tb_authorized: int,
) -> Placement:
    """Weigh the evidence for "this GPU is in an external enclosure" (pure).

    `tunnels` are (bridge address, Tunnel) for the bridges in the GPU's chain that carry
    Thunderbolt/USB4. Stronger evidence first; None when nothing decides.
    """
    evidence: list[str] = []
    if tunnels:
        intel = [t for _, t in tunnels if t.connection == "thunderbolt"]
        connection = "thunderbolt" if intel else "usb4"
        for addr, tunnel in tunnels:
            evidence.append(f"bridge {addr} in the chain is {tunnel.name}")
        if tb_authorized:
            evidence.append(f"{tb_authorized} authorized Thunderbolt/USB4 device(s)")
        if gpu.removable == "removable":
            evidence.append("sysfs removable=removable")
        return Placement(True, connection, tuple(evidence))
    if not gpu.bridges:
        # Directly on a root bus, with no port above it: graphics integrated in the CPU/SoC.
        return Placement(False, "pcie", ("on the root bus with no PCIe port above it: integrated",))
    if is_mobile_name(name):
        return Placement(False, "pcie", (f"name {name!r} is a laptop (mobile) GPU",))
    if gpu.removable == "removable":
        return Placement(
            True, "unknown", ("sysfs removable=removable, no Thunderbolt bridge known",)
        )
    laptop = chassis_type in LAPTOP_CHASSIS
    # pciehp names a slot by the address below its port: "0000:3c:00" for a GPU at 0000:3c:00.0.
    on_hotplug_slot = gpu.address.rsplit(".", 1)[0] in hotplug_buses
    if laptop and on_hotplug_slot:
        return Placement(
            True,
            "oculink",
            (
                f"chassis type {chassis_type} is a laptop",
                "GPU sits below a hot-plug capable PCIe port with no Thunderbolt/USB4 bridge",
            ),
        )
    if gpu.removable == "fixed":
        return Placement(False, "pcie", ("sysfs removable=fixed",))
    if gpu.boot_vga:
        # The firmware brought this one up as the boot display, and no tunnel leads to it:
        # the laptop's own GPU. (A desktop chassis alone decides nothing: an M.2-to-OCuLink
        # adapter looks like any slot.)
        return Placement(
            False, "pcie", ("boot VGA device with no Thunderbolt/USB4 bridge above it",)
        )
    return Placement(None, "unknown", ())


def on_root_bus(address: str) -> bool:
    """Bus 00 of domain 0000 holds only the root complex's own functions: nothing external."""
    return address.startswith("0000:00:")


def vendor_key(vendor_id: str | None, vendor_name: str | None) -> str | None:
    if vendor_id in VENDORS:
        return VENDORS[vendor_id]
    if vendor_id is None:
        return None
    return (vendor_name or "other").split()[0].lower()


def build_gpu(
    fn: PciFunction,
    *,
    name: str | None,
    vendor_name: str | None,
    architecture: str | None,
    compute_capability: str | None,
    placement: Placement,
) -> Gpu:
    return Gpu(
        pci_address=fn.address,
        vendor=vendor_key(fn.vendor_id, vendor_name),
        vendor_id=fn.vendor_id,
        device_id=fn.device_id,
        name=name,
        architecture=architecture,
        compute_capability=compute_capability,
        driver=fn.driver,
        external=placement.external,
        connection=placement.connection,
        link=fn.link,
        subsystem_vendor_id=fn.subsystem_vendor_id,
        subsystem_device_id=fn.subsystem_device_id,
        class_id=fn.class_id,
        revision=fn.revision,
        removable=fn.removable,
        boot_vga=fn.boot_vga,
        bridges=fn.bridges,
        evidence=placement.evidence,
    )
