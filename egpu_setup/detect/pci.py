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
from collections.abc import Iterable
from dataclasses import dataclass

from egpu_setup.compat.gpus import is_mobile_name
from egpu_setup.detect.facts import Gpu, Link, TbDevice
from egpu_setup.detect.sysfs import parse_hex_id, parse_int, parse_link_speed
from egpu_setup.host.machine import Host

PCI_DEVICES = "/sys/bus/pci/devices"
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")
_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")  # \Z: no final "\n"
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
    generation: str | None = None  # "TB3" / "TB4" / "TB5" / "USB4" (data/pcie_tunnels.yaml)


# A link through parts of two generations runs at the older one; TB4 and USB4 (40 Gb/s) are
# one step (Thunderbolt 4 is a USB4 implementation).
GENERATION_RANK = {"TB1": 1, "TB2": 2, "TB3": 3, "USB4": 4, "TB4": 4, "TB5": 5}
# Thunderbolt's sysfs `generation` (Documentation/ABI/testing/sysfs-bus-thunderbolt: 1-3 for
# Thunderbolt 1-3, 4 for USB4) and bolt's generation line ("Thunderbolt 3", "USB4").
_SYSFS_GENERATION = {1: "TB1", 2: "TB2", 3: "TB3", 4: "USB4"}


@functools.cache
def _tunnel_table() -> dict[tuple[str, str], Tunnel]:
    from egpu_setup.compat.shipped import load

    data = load("pcie_tunnels.yaml")
    return {
        (row["vendor"], row["device"]): Tunnel(
            row["connection"], row["name"], row.get("generation")
        )
        for row in data["bridges"]
    }


def generation_from_name(name: str | None) -> str | None:
    """ "JHL7540 Thunderbolt 3 Bridge" -> "TB3", "PCIe USB4 Bridge" -> "USB4", else None."""
    if not name:
        return None
    if re.search(r"\bUSB ?4\b", name, re.I):
        return "USB4"
    m = re.search(r"\bThunderbolt (\d)\b", name, re.I)
    return f"TB{m.group(1)}" if m else None


def oldest_generation(generations: Iterable[str | None]) -> str | None:
    """The generation a chain of tunnel parts runs at: the oldest (the last listed on a tie)."""
    known = [g for g in generations if g is not None and g in GENERATION_RANK]
    if not known:
        return None
    low = min(GENERATION_RANK[g] for g in known)
    return [g for g in known if GENERATION_RANK[g] == low][-1]


def generation_from_devices(devices: Iterable[TbDevice]) -> str | None:
    """The generation of the Thunderbolt/USB4 link from the authorized devices (sysfs or bolt):
    a 40 Gb/s lane is Thunderbolt 5 / USB4 v2 (80 Gb/s over 2 lanes; rx_speed is per lane,
    the kernel's Documentation/ABI/testing/sysfs-bus-thunderbolt); else the devices'
    generation number, when they agree."""
    authorized = [d for d in devices if d.authorized]
    if any((d.rx_speed_gbps or 0) >= 40 for d in authorized):
        return "TB5"
    gens = {_SYSFS_GENERATION.get(d.generation or 0) for d in authorized} - {None}
    return gens.pop() if len(gens) == 1 else None


def probe_function(host: Host, address: str) -> PciFunction | None:
    """Read one PCI function's attributes; None when it is not a PCI device directory."""
    base = f"{PCI_DEVICES}/{address}"
    canonical = host.resolve(base) or base
    parts = canonical.split("/")
    chain = tuple(p for p in parts[:-1] if _ADDR.match(p))
    driver_link = host.readlink(f"{canonical}/driver")

    def attr(name: str) -> str | None:
        return host.read_attr(f"{canonical}/{name}")

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
    return tunnel_by_name(name)


def tunnel_by_name(name: str | None) -> Tunnel | None:
    """A bridge whose name says Thunderbolt or USB4 (a part newer than our id list)."""
    if (
        name
        and re.search(r"thunderbolt", name, re.IGNORECASE)
        and not re.search(r"\bUSB ?4\b", name, re.I)
    ):
        return Tunnel("thunderbolt", name, generation_from_name(name))
    if name and re.search(r"\bUSB ?4\b", name, re.I):
        return Tunnel("usb4", name, "USB4")
    return None


@dataclass(frozen=True)
class Placement:
    """Where a GPU sits: outside the laptop or not, over what link, and the evidence."""

    external: bool | None
    connection: str
    evidence: tuple[str, ...]
    generation: str | None = None  # "TB3" / "TB4" / "TB5" / "USB4" for a tunnelled link


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
        generation = oldest_generation(t.generation for _, t in tunnels)
        return Placement(True, connection, tuple(evidence), generation)
    if not gpu.bridges:
        # Directly on a root bus, with no port above it: graphics integrated in the CPU/SoC.
        return Placement(False, "pcie", ("on the root bus with no PCIe port above it: integrated",))
    if _laptop_part(name):
        return Placement(False, "pcie", (f"name {name!r} is a laptop (mobile) GPU",))
    if gpu.removable == "removable":
        return Placement(
            True, "unknown", ("sysfs removable=removable, no Thunderbolt bridge known",)
        )
    laptop = chassis_type in LAPTOP_CHASSIS
    # pciehp names a slot by the address below its port: "0000:3c:00" for a GPU at 0000:3c:00.0,
    # or for the upstream port of a switch on the card itself (Radeon cards carry one: 1002:1478)
    below = (*gpu.bridges[1:], gpu.address)
    on_hotplug_slot = any(a.rsplit(".", 1)[0] in hotplug_buses for a in below)
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


def _laptop_part(name: str | None) -> bool:
    """A laptop GPU's name. pci.ids names a chip for all its cards ("Navi 31 [Radeon RX 7900
    XT/7900 XTX/7900 GRE/7900M]"): that is a laptop part only when every card it lists is one."""
    inner = re.findall(r"\[([^\]]+)\]", name or "")
    return all(is_mobile_name(p) for p in (inner[-1] if inner else name or "").split("/"))


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
    codename: str | None = None,
    table_name: str | None = None,
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
        codename=codename,
        table_name=table_name,
        connection_generation=placement.generation,
    )


# -- the link as pasted text shows it -------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionInfo:
    """What text about a GPU's link says: the tunnel kind and generation, and the PCIe link."""

    connection: str | None = None  # "thunderbolt" / "usb4" / None (the text does not say)
    generation: str | None = None  # "TB3" / "TB4" / "TB5" / "USB4"
    link_speed_gts: float | None = None
    link_width: int | None = None
    evidence: tuple[str, ...] = ()


_TEXT_IDS_RE = re.compile(r"[\[(](?P<ven>[0-9a-fA-F]{4}):(?P<dev>[0-9a-fA-F]{4})[\])]")
# lspci's LnkSta, macOS system_profiler's "Link Speed: 16.0 GT/s" / "Link Width: x4".
_LNKSTA_RE = re.compile(r"LnkSta:\s*Speed (?P<speed>[0-9.]+)\s*GT/s[^,]*,\s*Width x(?P<width>\d+)")
_MAC_SPEED_RE = re.compile(r"^\s*Link Speed:\s*(?P<speed>[0-9.]+)\s*GT/s", re.M)
_MAC_WIDTH_RE = re.compile(r"^\s*Link Width:\s*x(?P<width>\d+)", re.M)


def connection_in_text(text: str | None) -> ConnectionInfo:
    """The Thunderbolt/USB4 tunnel and PCIe link that pasted text shows (lspci of the bridges,
    lshw, a bug report naming the controller, macOS system_profiler's "Slot: Thunderbolt@..."):
    tunnel parts by PCI id (data/pcie_tunnels.yaml) or by their name; the generation only where
    an id or a name states it. Pure; an empty ConnectionInfo when the text says nothing."""
    if not isinstance(text, str):
        return ConnectionInfo()
    tunnels: list[Tunnel] = []
    for line in text.splitlines():
        by_id = [
            _tunnel_table().get((m["ven"].lower(), m["dev"].lower()))
            for m in _TEXT_IDS_RE.finditer(line)
        ]
        found = [t for t in by_id if t] or [t for t in [tunnel_by_name(line)] if t]
        tunnels.extend(found)
    speed = width = None
    if (m := _LNKSTA_RE.search(text)) is not None:
        speed, width = float(m["speed"]), int(m["width"])
    else:
        ms, mw = _MAC_SPEED_RE.search(text), _MAC_WIDTH_RE.search(text)
        speed = float(ms["speed"]) if ms else None
        width = int(mw["width"]) if mw else None
    if not tunnels:
        return ConnectionInfo(None, None, speed, width)
    connection = "thunderbolt" if any(t.connection == "thunderbolt" for t in tunnels) else "usb4"
    return ConnectionInfo(
        connection,
        oldest_generation(t.generation for t in tunnels),
        speed,
        width,
        tuple(dict.fromkeys(t.name for t in tunnels)),
    )
