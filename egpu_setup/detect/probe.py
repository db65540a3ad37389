"""detect_host(host): every probe, merged into one HostFacts value.

Soft: a missing source gives None, never an exception; what decides which GPU is the eGPU is kept
with it as evidence."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from egpu_setup.detect.facts import Gpu, HostFacts, Link, ListedGpu, ThunderboltFacts, TimedOutTool
from egpu_setup.detect.sysfs import pcie_speed
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

TYPE_CHECKING = False  # typing costs 2 ms of every start; these names are for mypy only
if TYPE_CHECKING:
    from typing import Any

    # lspci's 27 patterns load only when a paste or `lspci` output is read
    from egpu_setup.detect.lspci import LspciEntry

log = get_logger("egpu_setup.detect")
NVIDIA = "10de"


def detect_host(host: Host, *, run_smi: bool = False) -> HostFacts:
    """Everything egpu-setup knows about `host`. Never raises for a missing or odd source."""
    from egpu_setup.detect.numa import probe_numa_nodes, with_numa_nodes
    from egpu_setup.detect.nvidia import probe_nvidia
    from egpu_setup.detect.system import probe_os, probe_python
    from egpu_setup.detect.thunderbolt import probe_thunderbolt

    os_facts = probe_os(host)
    tb = probe_thunderbolt(host)
    nvidia, smi = probe_nvidia(host, run_smi=run_smi)
    gpus = with_numa_nodes(host, probe_gpus(host, tb, smi))
    if nvidia.module_loaded is None and any(g.driver == "nvidia" for g in gpus):
        nvidia = replace(nvidia, module_loaded=True)  # a device bound to it proves it loaded
    return HostFacts(
        os=os_facts,
        python=probe_python(host),
        gpus=gpus,
        nvidia=nvidia,
        thunderbolt=tb,
        source=host.kind,
        numa_nodes=probe_numa_nodes(host),
        listed_gpus=listed_gpus(smi),
        timed_out=tuple(TimedOutTool(name, seconds) for name, seconds in host.timed_out),
    )


def _smi_identity(g: Any) -> Identity:
    """An nvidia-smi GPU identified by its device id, else by the name it printed."""
    from egpu_setup.compat import gpus

    who = _identify(NVIDIA, g.device_id, g.name, "NVIDIA")
    model = gpus.gpu_by_name(g.name) if g.name and not g.device_id else None
    if model is not None:
        who = Identity(
            g.name, model.codename, model.architecture, model.compute_capability, model.name
        )
    return who


def listed_gpus(smi: object | None) -> tuple[ListedGpu, ...]:
    """The GPUs nvidia-smi printed without their PCI address (`--query-gpu` without
    `pci.bus_id`), identified by name or device id where egpu-setup's GPU table knows them."""
    out = []
    for g in getattr(smi, "gpus", ()) or ():
        if g.pci_bus_id:
            continue
        who = _smi_identity(g)
        out.append(
            ListedGpu(
                "nvidia-smi",
                index=g.index,
                name=g.name,
                uuid=g.uuid,
                memory_total_mib=g.memory_total_mib,
                compute_capability=g.compute_capability or who.compute_capability,
                architecture=who.architecture,
                pci_bus=g.pci_bus,
                pci_device_id=g.pci_device_id,
            )
        )
    return tuple(out)


def probe_gpus(host: Host, tb: ThunderboltFacts, smi: object | None) -> tuple[Gpu, ...]:
    """Display-class PCI functions from sysfs; lspci, then nvidia-smi text, when sysfs is empty."""
    from egpu_setup.detect import pci

    functions = pci.probe_functions(host)
    by_addr = {f.address: f for f in functions}
    displays = [f for f in functions if f.is_display]
    # Command text is free in a recording; live, lspci runs only when sysfs shows no GPU.
    lspci_text = (
        host.command("lspci", ["lspci", "-Dnnk"])
        if (not displays or host.kind == "recorded")
        else None
    )
    lspci = _lspci_entries(lspci_text)
    if not displays:
        # A pasted report: what lspci and nvidia-smi name, else GPUs other text mentions with
        # their ids (inxi pasted as lspci.txt, NVRM lines of a kernel log).
        texts: tuple[str, ...] = (lspci_text or "",)
        if host.kind == "recorded":
            from egpu_setup.detect.kernel_log import recorded_kernel_log

            texts += (recorded_kernel_log(host) or "",)
        return _gpus_from_text(lspci, smi, texts)
    pci_ids = pci.pci_ids_text(host)
    chassis = host.read_attr("/sys/class/dmi/id/chassis_type")
    slots = pci.hotplug_slot_buses(host)
    authorized = sum(1 for d in tb.devices if d.authorized)
    out = []
    for fn in displays:
        vendor_name, pciids_name = _pciids_names(pci_ids, fn.vendor_id, fn.device_id)
        entry = lspci.get(fn.address)
        if entry is not None:
            pciids_name = pciids_name or _lspci_name(entry)
            vendor_name = vendor_name or entry.vendor_name
        who = _identify(fn.vendor_id, fn.device_id, pciids_name, vendor_name)
        tunnels = []
        for addr in fn.bridges:
            bridge = by_addr.get(addr) or pci.probe_function(host, addr)
            if bridge is None:
                continue
            _, bridge_name = _pciids_names(pci_ids, bridge.vendor_id, bridge.device_id)
            tunnel = pci.tunnel_of(bridge, bridge_name)
            if tunnel:
                tunnels.append((addr, tunnel))
        placement = pci.decide_placement(
            fn,
            who.name,
            tunnels,
            chassis_type=chassis,
            hotplug_buses=slots,
            tb_authorized=authorized,
        )
        out.append(
            pci.build_gpu(
                fn,
                name=who.name,
                vendor_name=vendor_name,
                architecture=who.architecture,
                compute_capability=who.compute_capability,
                placement=placement,
                codename=who.codename,
                table_name=who.table_name,
            )
        )
    return tuple(out)


def _pciids_names(
    text: str | None, vendor: str | None, device: str | None
) -> tuple[str | None, str | None]:
    if not text or not vendor or not device:
        return None, None
    from egpu_setup.detect.pciids import lookup_pciids

    return lookup_pciids(text, vendor, device)


@dataclass(frozen=True)
class Identity:
    """What a GPU is: its name, chip codename, architecture and compute capability."""

    name: str | None  # as the source printed it
    codename: str | None = None
    architecture: str | None = None
    compute_capability: str | None = None
    table_name: str | None = None  # the same product as egpu-setup's GPU table names it


_NVIDIA_TEXT = re.compile(r"^(?:nvidia|nVidia)\b", re.I)
_NVIDIA_PRODUCT = re.compile(r"\b(?:GeForce|Quadro|Tesla|TITAN|NVIDIA|Jetson)\b|\bRTX\b", re.I)


def is_nvidia(vendor_id: str | None, vendor_name: str | None, name: str | None = None) -> bool:
    """Vendor 10de; else, where no id was printed, "NVIDIA Corporation" or an NVIDIA product."""
    if vendor_id is not None:
        return vendor_id == NVIDIA
    if vendor_name:
        return bool(_NVIDIA_TEXT.match(vendor_name.strip()))
    return bool(name and _NVIDIA_PRODUCT.search(name))


def _identify(
    vendor_id: str | None,
    device_id: str | None,
    text_name: str | None,
    vendor_name: str | None = None,
) -> Identity:
    """Our GPU table by id first, then the codename and product name the text shows.

    pci.ids and lspci print "CODENAME [Product]" ("GA102 [GeForce RTX 3080]"); without numeric
    ids the vendor is text ("NVIDIA Corporation"), so NVIDIA is recognised by name as well."""
    from egpu_setup.compat import gpus

    codename, product = gpus.split_name(text_name)
    name = product or text_name
    if not is_nvidia(vendor_id, vendor_name, text_name):
        return Identity(name, codename)
    model = gpus.gpu_by_id(device_id) if device_id else None
    if model is not None:
        # The name as the text printed it ("H100 80GB HBM3"), the table's beside it ("H100
        # SXM5 80GB"); the table's alone only where the text prints no product name at all.
        return Identity(
            product or model.name,
            model.codename or codename,
            model.architecture,
            model.compute_capability,
            model.name,
        )
    by_name = gpus.gpu_by_name(product) if product else None
    found = (
        gpus.arch_from_codename(codename)
        or ((by_name.architecture, by_name.compute_capability) if by_name else None)
        or (gpus.arch_from_text(product) if product else None)
        or (gpus.arch_from_device_id(device_id) if device_id else None)
    )
    arch, cc = found if found else (None, None)
    return Identity(
        name,
        codename or (by_name.codename if by_name and not product else None),
        arch,
        cc,
        by_name.name if by_name else None,
    )


def _lspci_name(entry: LspciEntry) -> str | None:
    # An old pci.ids prints "Device 2b85": that is an id, not a name.
    name = entry.device_name
    if not name or name == "Device" or name.startswith(("Device ", "Unknown device")):
        return None
    return name


@dataclass(frozen=True)
class PastedGpu:
    """A GPU that pasted text names, identified; `pci_address` is None where the text gives none
    (a Windows device list, an nvidia-smi CSV without pci.bus_id)."""

    pci_address: str | None
    vendor: str | None
    vendor_id: str | None
    device_id: str | None
    name: str | None
    codename: str | None
    architecture: str | None
    compute_capability: str | None
    driver: str | None = None
    bridges: tuple[str, ...] = ()  # upstream bridges, root port first, where the text draws them
    table_name: str | None = None  # egpu-setup's GPU table's name for it


def _vendor_key(vendor_id: str | None, vendor_name: str | None, nvidia: bool) -> str | None:
    from egpu_setup.detect.pci import VENDORS

    if nvidia:
        return "nvidia"
    return VENDORS.get(vendor_id or "") or _vendor_from_name(vendor_name)


def gpus_in_text(text: str | None) -> tuple[PastedGpu, ...]:
    """Every GPU a pasted text names, identified: lspci in any variant, nvidia-smi (table, -q,
    CSV), or text that only mentions GPUs with their ids (inxi, NVRM lines, a Windows device
    list). Pure and soft: () for text that names none. detect uses it for command text."""
    if not isinstance(text, str) or not text.strip():
        return ()
    from egpu_setup.detect.lspci import parse_gpu_mentions, parse_lspci
    from egpu_setup.detect.nvidia_smi import parse_nvidia_smi

    out: list[PastedGpu] = []
    entries = [e for e in parse_lspci(text) if e.is_display]
    for e in entries:
        name = _lspci_name(e)
        who = _identify(e.vendor_id, e.device_id, name, e.vendor_name)
        nvidia = is_nvidia(e.vendor_id, e.vendor_name, name)
        out.append(
            _pasted(e.address, e.vendor_id, e.device_id, who, e.driver, e.vendor_name, nvidia)
        )
    if out:
        return tuple(out)
    for g in parse_nvidia_smi(text).gpus:
        device = g.device_id
        who = _identify(NVIDIA, device, g.name, "NVIDIA")
        if device is None and g.name:
            model = None
            from egpu_setup.compat import gpus

            model = gpus.gpu_by_name(g.name)
            if model is not None:
                who = Identity(
                    g.name, model.codename, model.architecture, model.compute_capability, model.name
                )
        out.append(_pasted(g.pci_bus_id, NVIDIA, device, who, None, "NVIDIA", True))
    if out:
        return tuple(out)
    out = _tree_gpus(text)
    if out:
        return tuple(out)
    for m in parse_gpu_mentions(text):
        nvidia = is_nvidia(m.vendor_id, m.vendor_name, m.device_name)
        who = _identify(
            m.vendor_id or (NVIDIA if nvidia else None), m.device_id, m.device_name, m.vendor_name
        )
        out.append(
            _pasted(m.address, m.vendor_id, m.device_id, who, m.driver, m.vendor_name, nvidia)
        )
    return tuple(out)


# Functions of a graphics card that are not its GPU (an `lspci -tv` tree names no class): the
# HDMI audio, USB-C and UCSI functions NVIDIA and AMD cards carry beside the GPU.
_COMPANION_RE = re.compile(r"\b(?:Audio|USB|UCSI|Serial bus|SMBus)\b", re.I)
# A non-NVIDIA device in a tree is a GPU only when its name says so.
_DISPLAY_NAME_RE = re.compile(r"\b(?:Graphics|VGA|Radeon|GeForce|Quadro|Arc)\b")


def _tree_gpus(text: str) -> list[PastedGpu]:
    """GPUs of an `lspci -tv` tree: known by name only (the tree prints no ids or classes)."""
    from egpu_setup.detect.lspci_tree import looks_like_tree, parse_lspci_tree

    if not looks_like_tree(text):
        return []
    out = []
    for d in parse_lspci_tree(text):
        name = d.device_name
        if d.is_bridge or not name or _COMPANION_RE.search(name):
            continue
        nvidia = is_nvidia(None, d.vendor_name, name)
        # pci.ids without the model prints "Device 2b85" (or "Device" with no id at all): the
        # id is all there is, and it counts only where the GPU table knows it as a GPU.
        unnamed = re.fullmatch(r"Device(?: (?P<id>[0-9a-fA-F]{4}))?", name)
        device_id = unnamed["id"].lower() if unnamed and unnamed["id"] else None
        if unnamed:
            who = _identify(NVIDIA if nvidia else None, device_id, None, d.vendor_name)
            if who.architecture is None:
                continue
        elif not nvidia and not _DISPLAY_NAME_RE.search(name):
            continue
        elif nvidia:
            who = _smi_identity_by_name(name)
        else:
            who = _identify(None, None, name, d.vendor_name)
        vendor_id = NVIDIA if nvidia and device_id else None
        p = _pasted(d.address, vendor_id, device_id, who, None, d.vendor_name, nvidia)
        out.append(replace(p, bridges=d.bridges))
    return out


def _smi_identity_by_name(name: str) -> Identity:
    who = _identify(NVIDIA, None, name, "NVIDIA")
    from egpu_setup.compat import gpus

    model = gpus.gpu_by_name(name)
    if model is not None and who.architecture is None:
        who = Identity(
            who.name, model.codename, model.architecture, model.compute_capability, model.name
        )
    return who


def _pasted(
    address: str | None,
    vendor_id: str | None,
    device_id: str | None,
    who: Identity,
    driver: str | None,
    vendor_name: str | None,
    nvidia: bool,
) -> PastedGpu:
    return PastedGpu(
        pci_address=address,
        vendor=_vendor_key(vendor_id, vendor_name, nvidia),
        vendor_id=vendor_id or (NVIDIA if nvidia and device_id else None),
        device_id=device_id,
        name=who.name,
        codename=who.codename,
        table_name=who.table_name,
        architecture=who.architecture,
        compute_capability=who.compute_capability,
        driver=driver,
    )


def _lspci_entries(text: str | None) -> dict[str, LspciEntry]:
    if not text:
        return {}
    from egpu_setup.detect.lspci import parse_lspci

    return {e.address: e for e in parse_lspci(text)}


def _gpus_from_text(
    lspci: dict[str, LspciEntry], smi: object | None, texts: tuple[str, ...] = ()
) -> tuple[Gpu, ...]:
    """GPUs from command text alone (a pasted report, WSL2): ids and names, placement unknown
    unless the name itself says laptop GPU. `texts` are other pasted outputs (an lspci.txt that is
    inxi output, a kernel log) whose GPU mentions count when lspci and nvidia-smi name none."""
    out: dict[str, Gpu] = {}
    for entry in lspci.values():
        if not entry.is_display:
            continue
        name = _lspci_name(entry)
        who = _identify(entry.vendor_id, entry.device_id, name, entry.vendor_name)
        nvidia = is_nvidia(entry.vendor_id, entry.vendor_name, name)
        out[entry.address] = _text_gpu(
            entry.address,
            vendor=_vendor_key(entry.vendor_id, entry.vendor_name, nvidia),
            vendor_id=entry.vendor_id,
            device_id=entry.device_id,
            who=who,
            driver=entry.driver,
            link=Link(
                entry.link_speed_gts,
                entry.link_width,
                entry.max_link_speed_gts,
                entry.max_link_width,
            ),
            subsystem_vendor_id=entry.subsystem_vendor_id,
            subsystem_device_id=entry.subsystem_device_id,
            class_id=(entry.class_id + "00")
            if entry.class_id and len(entry.class_id) == 4
            else entry.class_id,
            revision=entry.revision,
        )
    for g in getattr(smi, "gpus", ()) or ():
        if not g.pci_bus_id or g.pci_bus_id in out:
            continue
        who = _smi_identity(g)
        out[g.pci_bus_id] = _text_gpu(
            g.pci_bus_id,
            vendor="nvidia",
            vendor_id=NVIDIA,
            device_id=g.device_id,
            who=who,
            link=Link(
                pcie_speed(g.link_gen_current),
                g.link_width_current,
                pcie_speed(g.link_gen_max),
                g.link_width_max,
            ),
        )
    if not out:
        for text in texts:
            for p in gpus_in_text(text):
                if p.pci_address and p.pci_address not in out:
                    out[p.pci_address] = _text_gpu(
                        p.pci_address,
                        vendor=p.vendor,
                        vendor_id=p.vendor_id,
                        device_id=p.device_id,
                        who=Identity(
                            p.name, p.codename, p.architecture, p.compute_capability, p.table_name
                        ),
                        driver=p.driver,
                        bridges=p.bridges,
                    )
    return tuple(out[k] for k in sorted(out))


def _text_gpu(address: str, *, who: Identity, **fields: Any) -> Gpu:
    """A Gpu known from text: placement only where the name or the address decides it."""
    from egpu_setup.compat.gpus import is_mobile_name
    from egpu_setup.detect.pci import on_root_bus

    mobile = is_mobile_name(who.name)
    integrated = on_root_bus(address)
    internal = mobile or integrated
    why = (
        f"name {who.name!r} is a laptop (mobile) GPU"
        if mobile
        else "on the root bus with no PCIe port above it: integrated"
    )
    return Gpu(
        pci_address=address,
        name=who.name,
        codename=who.codename,
        table_name=who.table_name,
        architecture=who.architecture,
        compute_capability=who.compute_capability,
        external=False if internal else None,
        connection="pcie" if internal else "unknown",
        evidence=(why,) if internal else (),
        **fields,
    )


def _vendor_from_name(name: str | None) -> str | None:
    if not name:
        return None
    low = name.lower()
    for key in ("nvidia", "amd", "intel"):
        if key in low:
            return key
    if "ati" in low.split():
        return "amd"
    return "other"
