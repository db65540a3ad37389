"""detect_host(host): every probe, merged into one HostFacts value.

Soft: a missing source gives None, never an exception; what decides which GPU is the eGPU is kept
with it as evidence."""

from __future__ import annotations

import logging
from dataclasses import replace

from egpu_setup.detect.facts import Gpu, HostFacts, Link, ThunderboltFacts
from egpu_setup.detect.lspci import LspciEntry
from egpu_setup.detect.sysfs import pcie_speed
from egpu_setup.host.machine import Host

log = logging.getLogger("egpu_setup.detect")


def detect_host(host: Host, *, run_smi: bool = False) -> HostFacts:
    """Everything egpu-setup knows about `host`. Never raises for a missing or odd source."""
    from egpu_setup.detect.nvidia import probe_nvidia
    from egpu_setup.detect.system import probe_os, probe_python
    from egpu_setup.detect.thunderbolt import probe_thunderbolt

    os_facts = probe_os(host)
    tb = probe_thunderbolt(host)
    nvidia, smi = probe_nvidia(host, run_smi=run_smi)
    gpus = probe_gpus(host, tb, smi)
    if nvidia.module_loaded is None and any(g.driver == "nvidia" for g in gpus):
        nvidia = replace(nvidia, module_loaded=True)  # a device bound to it proves it loaded
    return HostFacts(
        os=os_facts,
        python=probe_python(host),
        gpus=gpus,
        nvidia=nvidia,
        thunderbolt=tb,
        source=host.kind,
    )


def probe_gpus(host: Host, tb: ThunderboltFacts, smi: object | None) -> tuple[Gpu, ...]:
    """Display-class PCI functions from sysfs; lspci, then nvidia-smi text, when sysfs is empty."""
    from egpu_setup.detect import pci

    functions = pci.probe_functions(host)
    by_addr = {f.address: f for f in functions}
    displays = [f for f in functions if f.is_display]
    # Command text is free in a recording; live, lspci runs only when sysfs shows no GPU.
    lspci = _lspci_entries(host) if (not displays or host.kind == "recorded") else {}
    if not displays:
        return _gpus_from_text(lspci, smi)
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
        name, arch, cc = _identify(fn.vendor_id, fn.device_id, pciids_name)
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
            fn, name, tunnels, chassis_type=chassis, hotplug_buses=slots, tb_authorized=authorized
        )
        out.append(
            pci.build_gpu(
                fn,
                name=name,
                vendor_name=vendor_name,
                architecture=arch,
                compute_capability=cc,
                placement=placement,
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


def _identify(
    vendor_id: str | None, device_id: str | None, text_name: str | None
) -> tuple[str | None, str | None, str | None]:
    """(name, architecture, compute capability): our GPU table first, then names and codenames."""
    if vendor_id != "10de":
        return text_name, None, None
    from egpu_setup.compat import gpus

    model = gpus.gpu_by_id(device_id) if device_id else None
    if model is not None:
        return model.name, model.architecture, model.compute_capability
    found = (gpus.arch_from_text(text_name) if text_name else None) or (
        gpus.arch_from_device_id(device_id) if device_id else None
    )
    arch, cc = found if found else (None, None)
    return text_name, arch, cc


def _lspci_name(entry: LspciEntry) -> str | None:
    # An old pci.ids prints "Device 2b85": that is an id, not a name.
    name = entry.device_name
    if not name or name == "Device" or name.startswith("Device "):
        return None
    return name


def _lspci_entries(host: Host) -> dict[str, LspciEntry]:
    from egpu_setup.detect.lspci import parse_lspci

    text = host.command("lspci", ["lspci", "-Dnnk"])
    return {e.address: e for e in parse_lspci(text)} if text else {}


def _gpus_from_text(lspci: dict, smi: object | None) -> tuple[Gpu, ...]:
    """GPUs from command text alone (a pasted report, WSL2): ids and names, placement unknown
    unless the name itself says laptop GPU."""
    from egpu_setup.compat.gpus import is_mobile_name
    from egpu_setup.detect.pci import VENDORS, on_root_bus

    out: dict[str, Gpu] = {}
    for entry in lspci.values():
        if not entry.is_display:
            continue
        name, arch, cc = _identify(entry.vendor_id, entry.device_id, _lspci_name(entry))
        mobile = is_mobile_name(name)
        integrated = on_root_bus(entry.address)
        internal = mobile or integrated
        why = (
            f"name {name!r} is a laptop (mobile) GPU"
            if mobile
            else "on the root bus with no PCIe port above it: integrated"
        )
        out[entry.address] = Gpu(
            pci_address=entry.address,
            vendor=VENDORS.get(entry.vendor_id or "") or _vendor_from_name(entry.vendor_name),
            vendor_id=entry.vendor_id,
            device_id=entry.device_id,
            name=name,
            architecture=arch,
            compute_capability=cc,
            driver=entry.driver,
            external=False if internal else None,
            connection="pcie" if internal else "unknown",
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
            evidence=(why,) if internal else (),
        )
    for g in getattr(smi, "gpus", ()) or ():
        if not g.pci_bus_id or g.pci_bus_id in out:
            continue
        from egpu_setup.compat import gpus

        model = gpus.gpu_by_name(g.name) if g.name else None
        found = gpus.arch_from_text(g.name) if g.name else None
        arch, cc = found if found else (None, None)
        out[g.pci_bus_id] = Gpu(
            pci_address=g.pci_bus_id,
            vendor="nvidia",
            vendor_id="10de",
            name=model.name if model else g.name,
            architecture=arch,
            compute_capability=cc,
            link=Link(
                pcie_speed(g.link_gen_current),
                g.link_width_current,
                pcie_speed(g.link_gen_max),
                g.link_width_max,
            ),
        )
    return tuple(out[k] for k in sorted(out))


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
