"""Host-side checks, run in the tool process without torch: is the driver there and consistent?

Pure functions over HostFacts and command text, plus one thin `probe_host_checks` that fetches
that text through the Host. A kernel module and a userspace library of different versions is
the classic state after a driver upgrade without a reboot: nvidia-smi then prints "Failed to
initialize NVML: Driver/library version mismatch" and, on recent drivers, "NVML library version:
570.124" (tests/data/real/ has users' pastes of it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.host.machine import Host
from egpu_setup.verify.checks import Check

SMI_ARGV = ("nvidia-smi", "--query-gpu=pci.bus_id,driver_version,name", "--format=csv")
SMI_TIMEOUT = 20.0  # nvidia-smi initialises every GPU; a wedged one can take long or hang

_BUS = re.compile(r"\b([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\b")
_DRIVER = re.compile(r"Driver Version\s*:?\s*(\d+\.\d+(?:\.\d+)?)")
_NVML_LIB = re.compile(r"NVML library version:\s*(\d+\.\d+(?:\.\d+)?)")
_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")


@dataclass(frozen=True)
class SmiView:
    """What verify needs from any nvidia-smi output (CSV query, table or `-q`)."""

    driver_version: str | None = None
    bus_ids: tuple[str, ...] = ()
    error: str | None = None
    nvml_library: str | None = None  # from the version-mismatch message


def normalize_bus_id(domain: str, bus: str, dev: str, fn: str) -> str:
    """nvidia-smi's 8-digit upper-case domain -> the sysfs form "0000:3c:00.0"."""
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def parse_smi(text: str | None) -> SmiView | None:
    """Driver version, GPU bus ids and any error from nvidia-smi text; None for no text."""
    if text is None or not text.strip():
        return None
    buses = tuple(dict.fromkeys(normalize_bus_id(*m.groups()) for m in _BUS.finditer(text)))
    driver = None
    m = _DRIVER.search(text)
    if m:
        driver = m.group(1)
    else:  # CSV: find the driver_version column by its header
        lines = [ln for ln in text.splitlines() if ln.strip()]
        header = [h.strip() for h in lines[0].split(",")] if lines else []
        if "driver_version" in header:
            col = header.index("driver_version")
            for ln in lines[1:]:
                cells = [c.strip() for c in ln.split(",")]
                if len(cells) > col and _VERSION.match(cells[col]):
                    driver = cells[col]
                    break
    error = None
    for line in text.splitlines():
        low = line.lower()
        if (
            "failed to initialize nvml" in low
            or "couldn't communicate with the nvidia driver" in low
            or "no devices were found" in low
            or "unable to determine the device handle" in low
        ):
            error = line.strip()
            break
    lib = _NVML_LIB.search(text)
    return SmiView(driver, buses, error, lib.group(1) if lib else None)


def _amd_gpus(facts: HostFacts) -> tuple[Gpu, ...]:
    """With no NVIDIA GPU, the AMD ones a ROCm torch runs on (verify's device, session.py)."""
    return () if facts.nvidia_gpus else tuple(g for g in facts.gpus if g.vendor == "amd")


def check_gpu_present(facts: HostFacts | None) -> Check:
    if facts is None:
        return Check("gpu-present", "skip", "host detection is unavailable")
    gpus = facts.nvidia_gpus
    amd = _amd_gpus(facts)
    if amd:
        names = ", ".join(f"{g.name or g.device_id or '?'} at {g.pci_address}" for g in amd)
        external = [g for g in amd if g.external]
        detail = f"{len(amd)} AMD GPU(s): {names}"
        if len(external) == 1:
            detail += f"; the eGPU is {external[0].pci_address} ({external[0].connection})"
        return Check("gpu-present", "pass", detail, value=[g.pci_address for g in amd])
    if not gpus:
        return Check(
            "gpu-present",
            "fail",
            "no NVIDIA GPU on the PCI bus",
            value=[],
            hint="connect and authorize the enclosure (`egpu-setup doctor` says why it is "
            "missing), or check the CPU path with `egpu-setup verify --device cpu`",
        )
    egpu = facts.egpu
    names = ", ".join(f"{g.name or g.device_id or '?'} at {g.pci_address}" for g in gpus)
    detail = f"{len(gpus)} NVIDIA GPU(s): {names}"
    if egpu is not None:
        detail += f"; the eGPU is {egpu.pci_address} ({egpu.connection})"
    return Check("gpu-present", "pass", detail, value=[g.pci_address for g in gpus])


def check_amdgpu_bound(facts: HostFacts, amd: tuple[Gpu, ...]) -> Check:
    """driver-loaded on an AMD machine: amdgpu (part of the kernel) bound to the GPU verify uses
    (the external one, else all of them); no module version to compare, no nvidia-smi."""
    external = [g for g in amd if g.external]
    judged = external or list(amd)
    unbound = [g for g in judged if g.driver != "amdgpu"]
    if unbound:
        which = ", ".join(f"{g.pci_address} ({g.driver or 'no driver'})" for g in unbound)
        return Check(
            "driver-loaded",
            "fail",
            f"amdgpu is not bound to {which}",
            value=False,
            hint="run `egpu-setup doctor` (amdgpu-init-failed names missing firmware; a "
            "kernel too old for the GPU binds nothing)",
        )
    return Check(
        "driver-loaded",
        "pass",
        f"amdgpu (in the kernel) drives {', '.join(g.pci_address for g in judged)}",
        value=True,
    )


def check_driver_loaded(facts: HostFacts | None) -> Check:
    if facts is None:
        return Check("driver-loaded", "skip", "host detection is unavailable")
    nv = facts.nvidia
    if nv.module_loaded is None:
        return Check("driver-loaded", "skip", "cannot tell whether the nvidia module is loaded")
    if not nv.module_loaded:
        extra = " (nouveau is loaded instead)" if nv.nouveau_loaded else ""
        return Check(
            "driver-loaded",
            "fail",
            f"the nvidia kernel module is not loaded{extra}",
            value=False,
            hint="run `egpu-setup doctor` (Secure Boot signing, nouveau, a missing DKMS build)",
        )
    flavour = f", {nv.module_flavour}" if nv.module_flavour else ""
    return Check(
        "driver-loaded",
        "pass",
        f"nvidia module loaded ({nv.driver_version or 'version unknown'}{flavour})",
        value=nv.driver_version,
    )


def check_versions_agree(kernel: str | None, smi: SmiView | None) -> Check:
    """The kernel module's version against the userspace library nvidia-smi loads."""
    user = None
    if smi is not None:
        user = smi.nvml_library or smi.driver_version
    mismatch_text = smi is not None and smi.error is not None and "mismatch" in smi.error.lower()
    if mismatch_text or (kernel and user and not _same_version(kernel, user)):
        return Check(
            "driver-versions-agree",
            "fail",
            f"kernel module {kernel or '?'} but userspace {user or '?'}"
            + (f" ({smi.error})" if mismatch_text and smi else ""),
            value={"kernel": kernel, "userspace": user},
            hint="reboot to load the new module (or finish the driver upgrade: apt upgrade)",
        )
    if kernel is None or user is None:
        return Check(
            "driver-versions-agree",
            "skip",
            f"kernel module {kernel or 'unknown'}, userspace {user or 'unknown'}",
            value={"kernel": kernel, "userspace": user},
        )
    return Check(
        "driver-versions-agree",
        "pass",
        f"kernel module and userspace are both {kernel}",
        value={"kernel": kernel, "userspace": user},
    )


def _same_version(a: str, b: str) -> bool:
    # The mismatch message shortens the library version ("570.124" for 570.124.06).
    pa, pb = a.split("."), b.split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def check_smi_lists(smi: SmiView | None, wanted: Sequence[str], smi_found: bool) -> Check:
    if not smi_found:
        return Check(
            "nvidia-smi-lists-gpu",
            "fail",
            "nvidia-smi is not installed",
            hint="install the driver's utilities "
            "(Debian: nvidia-smi; Ubuntu: nvidia-utils-<branch>)",
        )
    if smi is None:
        return Check(
            "nvidia-smi-lists-gpu",
            "fail",
            f"nvidia-smi printed nothing or did not answer within {SMI_TIMEOUT:g} s",
            hint="the GPU may be wedged: check `sudo dmesg | grep -i xid` and reboot",
        )
    if smi.error:
        return Check(
            "nvidia-smi-lists-gpu",
            "fail",
            f"nvidia-smi: {smi.error}",
            hint="run `egpu-setup doctor`",
        )
    missing = [w for w in wanted if w not in smi.bus_ids]
    if missing:
        return Check(
            "nvidia-smi-lists-gpu",
            "fail",
            f"nvidia-smi lists {', '.join(smi.bus_ids) or 'no GPU'} but not {', '.join(missing)}",
            value=list(smi.bus_ids),
            expected=list(wanted),
            hint="the driver did not bind the eGPU: see `egpu-setup doctor` and dmesg",
        )
    return Check(
        "nvidia-smi-lists-gpu",
        "pass",
        f"nvidia-smi lists {', '.join(smi.bus_ids)}",
        value=list(smi.bus_ids),
        expected=list(wanted) or None,
    )


def host_checks(
    facts: HostFacts | None, kernel_version: str | None, smi_text: str | None, smi_found: bool
) -> list[Check]:
    """All host-side checks from facts and the text already fetched (pure)."""
    present = check_gpu_present(facts)
    if present.status == "fail":
        return [present]  # no GPU: an unloaded driver or silent nvidia-smi says nothing more
    amd = _amd_gpus(facts) if facts is not None else ()
    if facts is not None and amd:
        # amdgpu is part of the kernel: no NVIDIA module and nvidia-smi to compare or ask
        return [present, check_amdgpu_bound(facts, amd)]
    checks = [present, check_driver_loaded(facts)]
    smi = parse_smi(smi_text)
    kernel = kernel_version or (facts.nvidia.driver_version if facts else None)
    checks.append(check_versions_agree(kernel, smi))
    wanted = []
    if facts is not None:
        wanted = (
            [facts.egpu.pci_address] if facts.egpu else [g.pci_address for g in facts.nvidia_gpus]
        )
    checks.append(check_smi_lists(smi, wanted, smi_found))
    return checks


def probe_host_checks(host: Host, facts: HostFacts | None) -> list[Check]:
    """Fetch the module version and nvidia-smi text through `host`, then judge them."""
    kernel = host.read_attr("/sys/module/nvidia/version")
    smi_found = host.kind == "recorded" or host.which("nvidia-smi") is not None
    smi_text = None
    if facts is None or facts.nvidia_gpus:
        smi_text = host.command("nvidia-smi", list(SMI_ARGV), timeout=SMI_TIMEOUT)
    return host_checks(facts, kernel, smi_text, smi_found)
