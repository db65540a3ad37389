"""The diagnosis rules: HostFacts plus raw text in, findings out. Pure.

Each rule cites where its signature and its fix come from (see catalog.py for the sources).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.detect.lspci import LspciEntry
from egpu_setup.detect.rocm import parse_rocminfo
from egpu_setup.doctor.amd import (
    amd_log_findings,
    compute_agent_findings,
    kfd_findings,
    smi_link_lines,
    smi_readings,
    vram_findings,
)
from egpu_setup.doctor.dmesg import BarFailure, DmesgScan, Hit, nvrm_address, scan_dmesg
from egpu_setup.doctor.findings import MAX_EVIDENCE, DoctorInput, Finding
from egpu_setup.doctor.hold import HoldVerdict, hold_findings, judge_hold, split_lines
from egpu_setup.doctor.kernels import judge_kernels, kernel_findings
from egpu_setup.doctor.torchcheck import TorchInfo

if TYPE_CHECKING:
    from egpu_setup.detect.nvidia_smi import SmiReport

# Thunderbolt security levels that never create a PCIe tunnel (kernel sysfs-bus-thunderbolt ABI).
NO_PCIE_LEVELS = {"dponly", "usbonly", "nopcie"}
GRUB_DROPIN = "/etc/default/grub.d/60-egpu-setup.cfg"


def _evidence(lines: list[str]) -> tuple[str, ...]:
    """Unique lines in order, capped, with a count of what was left out."""
    seen: list[str] = []
    for line in lines:
        if line and line not in seen:
            seen.append(line)
    if len(seen) > MAX_EVIDENCE:
        return (*seen[:MAX_EVIDENCE], f"... and {len(seen) - MAX_EVIDENCE} more similar lines")
    return tuple(seen)


def _hit_lines(hits: Iterable[Hit]) -> list[str]:
    return [line for h in hits for line in h.lines]


@dataclass(frozen=True)
class _Context:
    """What every rule needs: the NVIDIA functions, the eGPU, and the parsed sources."""

    facts: HostFacts
    inputs: DoctorInput
    dmesg: DmesgScan
    lspci: tuple[LspciEntry, ...]
    nvidia_addrs: frozenset[str]
    egpu: Gpu | None
    smi: SmiReport | None = None  # the parsed nvidia-smi text, None without one

    @property
    def nvidia_present(self) -> bool:
        return bool(self.nvidia_addrs)

    @property
    def blind(self) -> bool:
        """No GPU known at all: a pasted log without the host's PCI devices. Some signatures are
        then read on their own (a bridge that got no window, a slow link, nvidia-smi's word)."""
        return not self.nvidia_addrs and not self.facts.gpus


def _context(facts: HostFacts, inputs: DoctorInput) -> _Context:
    from egpu_setup.detect.lspci import parse_lspci

    scan = inputs.dmesg_scan if inputs.dmesg_scan is not None else scan_dmesg(inputs.dmesg)
    entries = parse_lspci(inputs.lspci) if inputs.lspci else ()
    addrs = {g.pci_address.lower() for g in facts.nvidia_gpus}
    addrs |= {e.address for e in entries if e.is_nvidia and e.is_display}
    addrs |= set(scan.nvidia_functions)
    egpu = facts.egpu
    if egpu is None:
        external = [g for g in facts.nvidia_gpus if g.external]
        egpu = external[0] if external else None
    from egpu_setup.detect.nvidia_smi import parse_nvidia_smi

    smi = parse_nvidia_smi(inputs.nvidia_smi) if inputs.nvidia_smi else None
    return _Context(facts, inputs, scan, tuple(entries), frozenset(addrs), egpu, smi)


def _bridges_above(ctx: _Context) -> set[str]:
    """Bridges whose bus range holds an NVIDIA function (from dmesg and from sysfs facts)."""
    out = {b.lower() for g in ctx.facts.nvidia_gpus for b in g.bridges}
    for addr in ctx.nvidia_addrs:
        domain, bus = addr.split(":")[0], int(addr.split(":")[1], 16)
        for bridge, (bdomain, lo, hi) in ctx.dmesg.bridges.items():
            if bdomain == domain and lo <= bus <= hi:
                out.add(bridge)
    return out


def _gpu_name(ctx: _Context, address: str | None = None) -> str:
    for g in ctx.facts.nvidia_gpus:
        if address is None or g.pci_address == address:
            return f"{g.name or 'NVIDIA GPU'} at {g.pci_address}"
    if address is None and len(ctx.nvidia_addrs) == 1:
        address = next(iter(ctx.nvidia_addrs))
    return f"NVIDIA GPU at {address}" if address else "The NVIDIA GPU"


# -- pci-bar-allocation-failed ---------------------------------------------------------------------


def _bridge_window(failure: BarFailure) -> bool:
    """A bridge's own window: "BAR 13/14/15" of a PCI-PCI bridge or "bridge window" (newer
    kernels); BAR 0-6 are a device's own registers and ROM."""
    m = re.match(r"BAR (\d+)", failure.what)
    return failure.what == "bridge window" or bool(m and int(m.group(1)) >= 13)


def check_bar_allocation(ctx: _Context) -> list[Finding]:
    # Only the GPU's own chain counts: the GPU's functions and the bridges upstream of it. A
    # dock's USB controller port or an empty hot-plug port that got no window is no reason to
    # edit the boot configuration (check_bridge_windows says what such a log shows).
    relevant = ctx.nvidia_addrs | _bridges_above(ctx)
    bars = [b for b in ctx.dmesg.bar_failures if b.kind == "mem" and b.address in relevant]
    unassigned = [
        f"lspci {e.address}: {bar}"
        for e in ctx.lspci
        if e.address in ctx.nvidia_addrs
        for bar in e.bar_problems
    ]
    invalid = list(ctx.dmesg.nvrm_bar_invalid)
    rebar = list(ctx.dmesg.rebar_fatal)
    if not (bars or unassigned or invalid or rebar):
        return []
    rm_init = list(ctx.dmesg.rm_init_failed)
    cmdline = ctx.inputs.cmdline or ""
    has_realloc = bool(re.search(r"(?:^|\s)pci=\S*realloc(?!=off)", cmdline))
    steps = []
    if rebar:
        steps.append(
            "the driver's Resizable BAR attempt failed and aborted the probe: remove "
            "NVreg_EnableResizableBar=1 from /etc/modprobe.d/*.conf (egpu-setup never sets it for "
            "eGPUs)"
        )
    if bars or unassigned or invalid:
        if has_realloc:
            steps.append(
                "pci=realloc is already on the kernel command line: also reserve a larger "
                "prefetchable "
                "window for hot-plug bridges, e.g. pci=realloc,hpmmioprefsize=512M (it applies to "
                "every "
                f"hot-plug bridge, so grow it step by step), in {GRUB_DROPIN}, then sudo "
                "update-grub and reboot"
            )
        else:
            steps.append(
                f"add pci=realloc to the kernel command line: put GRUB_CMDLINE_LINUX_DEFAULT="
                f'"$GRUB_CMDLINE_LINUX_DEFAULT pci=realloc" in {GRUB_DROPIN}, '
                "run sudo update-grub, reboot"
            )
        steps.append(
            "enable Above 4G Decoding (and Resizable BAR, if offered) in the laptop firmware"
        )
    summary = (
        f"{_gpu_name(ctx)}: the kernel could not assign its memory windows (BARs), "
        "so the driver cannot use it"
    )
    lines = [b for hit in (invalid + rebar) for b in hit.lines]
    lines = [line for b in bars for line in b.hit.lines] + lines + unassigned + _hit_lines(rm_init)
    return [
        Finding(
            "pci-bar-allocation-failed",
            "error",
            summary,
            _evidence(lines),
            "; ".join(steps) + ".",
        )
    ]


# -- pci-bridge-window-unassigned ------------------------------------------------------------------


def check_bridge_windows(ctx: _Context) -> list[Finding]:
    """A log that names no GPU, where bridges got no memory window: said as what the log shows.

    Which device sits behind such a bridge the log does not say (on a Thunderbolt 3 controller
    one downstream port leads to the hot-plug tunnel, another to the dock's own USB controller),
    so it is information, not a reason to change the boot configuration. With a GPU known,
    check_bar_allocation reads its own chain and this stays quiet. I/O windows (BAR 13) are
    routinely missing and harmless: a GPU's registers and memory are memory BARs."""
    # NVRM lines name the GPU they are about ("BAR1 is 0M @ 0x0 (PCI:0000:0a:00.0)"): the log
    # then names a GPU after all, and check_bar_allocation reads those lines.
    d = ctx.dmesg
    if not ctx.blind or d.nvrm_bar_invalid or d.rebar_fatal or d.rm_init_failed or d.xids:
        return []
    windows = [b for b in ctx.dmesg.bar_failures if b.kind == "mem" and _bridge_window(b)]
    if not windows:
        return []
    bridges = ", ".join(dict.fromkeys(b.address for b in windows))
    return [
        Finding(
            "pci-bridge-window-unassigned",
            "info",
            f"The kernel log shows PCI bridges that got no memory window ({bridges}); it names no "
            "GPU, so which device is behind them it does not say",
            _evidence([line for b in windows for line in b.hit.lines]),
            "Nothing to change for this alone. Connect the eGPU and run egpu-setup doctor on the "
            "host (or record it with the GPU attached): if the GPU is behind one of these "
            "bridges, doctor reports pci-bar-allocation-failed with its fix.",
        )
    ]


# -- pcie-link-degraded ----------------------------------------------------------------------------


def _connection(ctx: _Context, address: str) -> str:
    for g in ctx.facts.nvidia_gpus:
        if g.pci_address == address:
            return g.connection
    if ctx.facts.thunderbolt.domains or ctx.dmesg.thunderbolt_seen:
        return "thunderbolt"
    return "unknown"


# PCI base classes that are never a GPU or the way to one (PCI Code and ID Assignment spec):
# storage, network, serial bus (USB, Thunderbolt NHI), wireless.
_NOT_A_GPU_PATH = ("01", "02", "0c", "0d")


def _maybe_gpu_path(ctx: _Context, address: str) -> bool:
    """With no NVIDIA GPU known (a pasted kernel log), a link limit counts unless the kernel
    enumerated the device as something that is no GPU and leads to none (an SSD, a NIC)."""
    if not ctx.blind:
        return False
    return not ctx.dmesg.pci_classes.get(address, "").startswith(_NOT_A_GPU_PATH)


def check_link(ctx: _Context) -> list[Finding]:
    lines: list[str] = []
    severity = None

    def bump(level: str) -> None:
        nonlocal severity
        if severity != "warning":
            severity = level

    tunnelled = ("thunderbolt", "usb4")
    on_path = ctx.nvidia_addrs | _bridges_above(ctx)
    for lim in ctx.dmesg.link_limits:
        if lim.address not in on_path and not _maybe_gpu_path(ctx, lim.address):
            continue
        conn = _connection(ctx, lim.address)
        if conn == "unknown" and "USB4" in " ".join(lim.hit.lines):
            conn = "usb4"
        expected = 4 if conn in (*tunnelled, "oculink", "unknown") else lim.capable_width
        if lim.width < min(expected, lim.capable_width):
            bump("warning")
        elif lim.speed_gts < lim.capable_speed_gts:
            # Thunderbolt tunnels commonly report 2.5 GT/s x4 while moving about 2.7 GB/s
            # (system76/firmware-open#66; ArchWiki): context, not a fault. A cabled link is real.
            # Unknown: the x4 link of a laptop's external port is most likely a tunnel too.
            bump("info" if conn in (*tunnelled, "unknown") else "warning")
        else:
            continue
        lines.extend(lim.hit.lines)
    for g in ctx.facts.nvidia_gpus:
        link = g.link
        if link.width is None or link.max_width is None:
            continue
        # Only a GPU known to be internal should reach its full width; anything else may sit
        # behind an x4 Thunderbolt/USB4/OCuLink/M.2 link by design.
        floor = link.max_width if g.external is False else 4
        if link.width < min(floor, link.max_width):
            bump("warning")
            lines.append(
                f"sysfs {g.pci_address}: current_link_width x{link.width}, max_link_width "
                f"x{link.max_width}"
                + (f", current_link_speed {link.speed_gts:g} GT/s" if link.speed_gts else "")
            )
    readings = smi_readings(ctx.inputs.amd_smi, ctx.inputs.rocm_smi)
    for level, line in smi_link_lines(ctx.facts, readings, bool(ctx.inputs.amd_smi)):
        bump(level)
        lines.append(line)
    internal = {g.pci_address for g in ctx.facts.nvidia_gpus if g.external is False}
    for e in ctx.lspci:
        if e.address not in ctx.nvidia_addrs or e.link_width is None or e.max_link_width is None:
            continue
        floor = e.max_link_width if e.address in internal else 4
        if e.link_width < min(floor, e.max_link_width):
            bump("warning")
            lines.append(
                f"lspci {e.address}: LnkSta x{e.link_width} at {e.link_speed_gts or '?'} GT/s, "
                f"LnkCap x{e.max_link_width} at {e.max_link_speed_gts or '?'} GT/s"
            )
    if severity is None:
        return []
    if severity == "info":
        return [
            Finding(
                "pcie-link-degraded",
                "info",
                "The kernel reports the eGPU link at a lower PCIe speed than the card supports; "
                "over "
                "Thunderbolt/USB4 this number is the tunnel's, not a fault",
                _evidence(lines),
                "Nothing to change if `egpu-setup verify` measures host-to-device bandwidth above "
                "the "
                "profile's floor (about 2-3 GB/s is normal for Thunderbolt 3/4).",
            )
        ]
    return [
        Finding(
            "pcie-link-degraded",
            "warning",
            "The GPU's PCIe link trained narrower or slower than the connection allows",
            _evidence(lines),
            "Reseat the cable and use a certified 40 Gb/s Thunderbolt/USB4 cable (or a shorter "
            "OCuLink "
            "cable); plug into a port wired to the CPU, not a chipset/retimer port; then measure "
            "again "
            "with `egpu-setup verify`.",
        )
    ]


# -- driver state ----------------------------------------------------------------------------------


def _nouveau_bound(ctx: _Context) -> list[str]:
    lines = [
        f"sysfs {g.pci_address}: driver nouveau ({g.name or 'NVIDIA GPU'})"
        for g in ctx.facts.nvidia_gpus
        if g.driver == "nouveau"
    ]
    lines += [
        f"lspci {e.address}: Kernel driver in use: nouveau"
        for e in ctx.lspci
        if e.driver == "nouveau" and e.vendor_id == "10de"
    ]
    return lines


# A line of nouveau at a device: "nouveau 0000:01:00.0: DRM: ..." or, before Linux 4.x,
# "nouveau  [  DEVICE][0000:01:00.0] ...". "unknown chipset" is nouveau giving the device up
# (its probe then fails with -19), and the driver core's "probe with driver nouveau failed with
# error -2" (drivers/base/dd.c, after e.g. "gsp ctor failed: -2" for a GPU without its GSP
# firmware) says the same: such an address was never driven.
_NOUVEAU_GAVE_UP = ("unknown chipset", "probe with driver nouveau failed")
_NOUVEAU_AT_RE = re.compile(
    r"nouveau (?:\s*\[\s*\w+\]\[)?(?P<addr>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.\d)"
)


def _nouveau_driving(ctx: _Context) -> list[Hit]:
    at = [(h, m["addr"]) for h in ctx.dmesg.nouveau if (m := _NOUVEAU_AT_RE.search(h.message))]
    given_up = {addr for h, addr in at if any(m in h.message for m in _NOUVEAU_GAVE_UP)}
    return [h for h, addr in at if addr not in given_up]


_NOUVEAU_FIX = (
    "Blacklist nouveau: write /etc/modprobe.d/egpu-setup-nouveau.conf with `blacklist nouveau` "
    "and `options nouveau modeset=0` (egpu-setup install does this), run sudo update-initramfs "
    "-u, and reboot; do not rmmod it under a running session."
)


def check_nouveau(ctx: _Context) -> list[Finding]:
    lines = _nouveau_bound(ctx)
    log = _nouveau_driving(ctx)
    if lines:
        summary = "The nouveau driver owns the NVIDIA GPU, so the NVIDIA driver cannot bind to it"
    elif log and not _nvidia_bound(ctx):
        # A pasted kernel log, or a host whose GPU has no driver bound now: the log is the
        # evidence, and the summary says no more than the log does.
        summary = (
            "The kernel log shows the nouveau driver driving an NVIDIA GPU, so the NVIDIA driver "
            "cannot bind to it while nouveau is loaded"
        )
    else:
        return []
    lines += _hit_lines(log[:3])
    return [Finding("nouveau-bound", "error", summary, _evidence(lines), _NOUVEAU_FIX)]


def _nvidia_bound(ctx: _Context) -> bool:
    return any(g.driver in ("nvidia", "nvidia-current") for g in ctx.facts.nvidia_gpus)


_RM_INIT_FIX = (
    "The driver is loaded but could not initialise the GPU (RmInitAdapter failed): check the "
    "kernel log for a BAR or Xid message just before it, use a driver branch that supports the "
    "GPU (Blackwell needs the open modules of 570 or newer), and on an eGPU reseat the cable and "
    "power the enclosure before boot."
)
_OPEN_NO_GSP_FIX = (
    "The open kernel module drives only GPUs with a GSP (Turing and newer): install the "
    "proprietary module of a branch that still supports this GPU (the 580 branch for "
    "Maxwell/Pascal/Volta), e.g. egpu-setup install --profile NAME --only driver."
)
_LEGACY_FIX = (
    "This driver branch no longer supports the GPU (NVRM says it will ignore it): install the "
    "legacy branch it names, e.g. the 580 branch for Maxwell/Pascal/Volta "
    "(egpu-setup install --profile gtx1080ti --only driver)."
)


def check_driver_loaded(ctx: _Context, suppressed: bool) -> list[Finding]:
    """What the NVIDIA driver does with the GPU, as far as the evidence goes: not loaded or not
    bound (`nvidia-driver-not-loaded`), loaded but unable to initialise it (RmInitAdapter,
    `nvidia-gpu-init-failed`), or loaded and finding no GPU at all (nvidia-smi's "No devices were
    found", `nvidia-no-gpu-found`). `suppressed` (a BAR failure, nouveau, Secure Boot, a lost
    GPU, a GPU manager that disables NVIDIA explains it) silences what is only inferred (a module
    absent, a device with no driver); what the driver or nvidia-smi say outright is still
    reported, with the cause."""
    # Under WSL2 the Windows host owns the driver: there is no nvidia kernel module to load.
    if ctx.facts.os.wsl:
        return []
    if suppressed and ctx.dmesg.fallen_off:
        return []  # the GPU is gone: nothing else about its driver is worth saying
    nv = ctx.facts.nvidia
    smi_kind = getattr(ctx.smi, "error_kind", None)
    # nvidia-smi's word counts with an NVIDIA GPU present, or with no GPU known at all (a paste);
    # with the host's GPUs known and none NVIDIA (the eGPU unplugged) it is expected, not a fault.
    # A root cause found elsewhere (BAR, nouveau, Secure Boot) explains it.
    smi_counts = ctx.nvidia_present or ctx.blind
    smi_line = (
        [f"nvidia-smi: {ctx.smi.error}"]
        if ctx.smi is not None and ctx.smi.error and smi_counts and not suppressed
        else []
    )
    not_loaded = smi_line if smi_kind == "driver-not-loaded" else []
    no_devices = smi_line if smi_kind == "no-devices" else []
    no_gsp_hits = [h for h in ctx.dmesg.driver_unbound if "not supported by open" in h.message]
    gone_hits = [h for h in ctx.dmesg.driver_unbound if h not in no_gsp_hits]
    not_loaded += _hit_lines(gone_hits)
    rm_init = _hit_lines(ctx.dmesg.rm_init_failed)
    inferred: list[str] = []
    if ctx.nvidia_present and nv.module_loaded is False:
        inferred.append("/sys/module/nvidia: absent (the nvidia kernel module is not loaded)")
    unbound = [
        g
        for g in ctx.facts.nvidia_gpus
        if g.driver not in ("nvidia", "nvidia-current", "nouveau", "vfio-pci")
    ]
    if nv.module_loaded and unbound:
        inferred += [
            f"sysfs {g.pci_address}: no driver bound ({g.name or 'NVIDIA GPU'})" for g in unbound
        ]
    if not suppressed:
        not_loaded += inferred
    legacy = _hit_lines(ctx.dmesg.legacy_ignored)
    no_gsp = bool(no_gsp_hits)
    # Only a loaded module prints RmInitAdapter, and the open module that refuses a GPU without a
    # GSP stays loaded: then the GPU, not the driver, is what failed, unless nvidia-smi or the
    # kernel says outright that the driver is gone or bound nothing.
    gone = not_loaded
    not_loaded = not_loaded + _hit_lines(no_gsp_hits)
    if (rm_init or no_gsp) and not gone:
        fix = _CAUSE_FIX if suppressed else _OPEN_NO_GSP_FIX if no_gsp else _RM_INIT_FIX
        summary = "The NVIDIA driver is loaded but could not initialise the GPU"
        summary += " (the open module needs a GSP)" if no_gsp else " (RmInitAdapter failed)"
        lines = no_devices + not_loaded + rm_init + legacy
        return [Finding("nvidia-gpu-init-failed", "error", summary, _evidence(lines), fix)]
    if no_devices and not gone:
        return [
            Finding(
                "nvidia-no-gpu-found",
                "error",
                "The NVIDIA driver is loaded but found no GPU it drives",
                _evidence(no_devices + legacy),
                _LEGACY_FIX if legacy else _NO_GPU_FIX,
            )
        ]
    lines = not_loaded + no_devices + rm_init
    if not lines:
        return []
    lines += legacy
    if legacy:
        fix = _LEGACY_FIX
    elif no_gsp:
        fix = _OPEN_NO_GSP_FIX
    elif suppressed:
        fix = _CAUSE_FIX
    else:
        fix = (
            "Load it with sudo modprobe nvidia (Debian packages name it nvidia-current); if that "
            "fails, check `dkms status` and that linux-headers-$(uname -r) is installed, or let "
            "`egpu-setup install --profile NAME --only driver` install a matching driver."
        )
    summary = "An NVIDIA GPU is present but the NVIDIA driver is not loaded or not bound to it"
    return [Finding("nvidia-driver-not-loaded", "error", summary, _evidence(lines), fix)]


_CAUSE_FIX = (
    "The driver is installed but could not take the GPU; fix the cause reported with it (the "
    "BAR, nouveau, Secure Boot or GPU manager finding), then reload the module or reboot."
)
_NO_GPU_FIX = (
    "The driver sees no GPU: check that `lspci -d 10de:` lists the card; on an eGPU, authorize "
    "the enclosure (boltctl list), reseat the cable and power the enclosure; if lspci lists it, "
    "read the kernel log's NVRM lines (a branch that does not support the card, a BAR failure)."
)


def check_mismatch(ctx: _Context, hold: HoldVerdict | None = None) -> list[Finding]:
    """Module and libraries of different versions: the kernel log and nvidia-smi say so once the
    module is loaded, dpkg's status (`hold`) as soon as the packages moved apart; the packages
    that moved are named."""
    smi = ctx.inputs.nvidia_smi or ""
    lines = _hit_lines(ctx.dmesg.api_mismatch)
    smi_lines = [
        ln.strip()
        for ln in smi.splitlines()
        if "version mismatch" in ln or "NVML library version" in ln
    ]
    split = hold is not None and hold.split
    if not lines and not smi_lines and not split:
        return []
    versions = ctx.dmesg.api_versions[-1] if ctx.dmesg.api_versions else None
    detail = f" (libraries {versions[0]}, kernel module {versions[1]})" if versions else ""
    packages = ""
    dpkg_lines: list[str] = []
    if hold is not None and split:
        packages = f"; dpkg: {hold.split_text()}"
        dpkg_lines = split_lines(hold)
    return [
        Finding(
            "driver-library-mismatch",
            "error",
            f"The NVIDIA kernel module and user-space libraries are different "
            f"versions{detail}{packages}",
            _evidence(smi_lines + lines + dpkg_lines),
            "Reboot so the kernel loads the module that matches the installed libraries. If it "
            "persists "
            "after a reboot, the upgrade is half-finished: run sudo apt-get install -f (or "
            "reinstall one "
            "driver version) and compare `cat /proc/driver/nvidia/version` with `modinfo -F "
            "version nvidia`."
            + (
                " dpkg shows the packages apart: bring the moved ones back to the driver's "
                "version (`sudo apt-get install NAME=VERSION`) or move all of them together."
                if split
                else ""
            ),
        )
    ]


def check_fallen_off(ctx: _Context) -> list[Finding]:
    smi = ctx.inputs.nvidia_smi or ""
    handle = [
        ln.strip() for ln in smi.splitlines() if "Unable to determine the device handle" in ln
    ]
    lost = [ln for ln in handle if "GPU is lost" in ln]
    # "Unknown Error" is NVML saying it does not know why: only the kernel log (Xid 79, "fallen
    # off the bus") or NVML's own "GPU is lost" make it a lost GPU. Otherwise say what was seen.
    if not ctx.dmesg.fallen_off and not lost:
        if not handle:
            return []
        return [
            Finding(
                "nvidia-smi-gpu-unreadable",
                "warning",
                "nvidia-smi could not read a GPU and gave no cause; nothing here shows whether it "
                "fell off the bus or failed otherwise",
                _evidence(handle),
                "Look at the kernel log from the same boot (sudo dmesg | grep -E 'NVRM|Xid') and "
                "run `egpu-setup doctor` with it: an Xid line there names the cause. A reboot "
                "usually brings the GPU back; if it recurs, reseat the card or cable and check the "
                "enclosure's power and cooling.",
            )
        ]
    lines = _hit_lines(ctx.dmesg.fallen_off) + handle
    if not lines:
        return []
    where = next((a for h in ctx.dmesg.fallen_off if (a := nvrm_address(h))), None)
    return [
        Finding(
            "gpu-fallen-off-bus",
            "error",
            f"The GPU{' at ' + where if where else ''} fell off the PCIe bus (Xid 79); it stays "
            "lost until a reboot",
            _evidence(lines),
            "Reboot to recover it (the driver cannot re-attach a lost GPU). Before unplugging, run "
            "`egpu-setup eject`. If it happens at idle, keep the eGPU powered (see "
            "runtime-pm-on-egpu); "
            "if under load, check the enclosure supply against `egpu-setup profiles show NAME` and "
            "reseat or replace the cable.",
        )
    ]


def check_lost_after_resume(ctx: _Context) -> list[Finding]:
    """A GPU or bridge lost with a sleep: its wake-up (or sleep) line and the loss, each once."""
    pairs = ctx.dmesg.resume_losses
    if not pairs:
        return []
    hits = {h.offset: h for pair in pairs for h in pair}
    lines = _hit_lines(hits[k] for k in sorted(hits))
    where = next((a for _, loss in pairs if (a := nvrm_address(loss))), None)
    return [
        Finding(
            "gpu-lost-after-resume",
            "error",
            f"The eGPU{' at ' + where if where else ''} (or the bridge it hangs off) did not come "
            "back from a suspend",
            _evidence(lines),
            "Run `sudo egpu-setup resume-check`: it checks the enclosure is authorized and the GPU "
            "bound, and rescans the PCI bus once. If the GPU fell off the bus (Xid 79) only a "
            "reboot brings it back. Before the next sleep, end the CUDA jobs on it or run "
            "`egpu-setup eject`; in display mode install the driver's suspend services "
            "(`egpu-setup install --mode display` enables them where the driver ships them).",
        )
    ]


def _secure_boot_on(ctx: _Context) -> tuple[bool | None, list[str]]:
    text = ctx.inputs.mokutil or ""
    m = re.search(r"SecureBoot (enabled|disabled)", text)
    if m:
        return m.group(1) == "enabled", [m.group(0)]
    sb = ctx.facts.os.secure_boot
    return sb, (
        [f"Secure Boot: {'enabled' if sb else 'disabled'} (EFI SecureBoot variable)"]
        if sb is not None
        else []
    )


def check_secure_boot(ctx: _Context) -> list[Finding]:
    on, lines = _secure_boot_on(ctx)
    rejected = _hit_lines(ctx.dmesg.key_rejected)
    not_loaded = ctx.nvidia_present and ctx.facts.nvidia.module_loaded is False
    # The kernel refusing an unsigned module is itself the proof that signatures are enforced
    # (Secure Boot lockdown or module.sig_enforce); only an explicit "Secure Boot off" says other.
    if on is False or not (rejected or (on and not_loaded)):
        return []
    severity = "error" if rejected else "warning"
    modules = ctx.dmesg.refused_modules
    if rejected:
        what = (
            "the NVIDIA kernel module"
            if "nvidia" in modules or (not modules and ctx.nvidia_present)
            else f"module {', '.join(repr(m) for m in modules)}"
            if modules
            else "an unsigned kernel module (the log does not name it)"
        )
        summary = f"Secure Boot rejected {what}: its signing key is not enrolled"
    else:
        summary = (
            "Secure Boot is on and the NVIDIA module is not loaded: most likely its signing key "
            "is not enrolled"
        )
    return [
        Finding(
            "secure-boot-unsigned-module",
            severity,
            summary,
            _evidence(lines + rejected),
            "Enroll the DKMS signing key: sudo mokutil --import /var/lib/dkms/mok.pub (Ubuntu: "
            "/var/lib/shim-signed/mok/MOK.der), choose a one-time password, reboot and pick "
            "Enroll MOK "
            "in the blue MokManager screen. On Ubuntu the Canonical-signed linux-modules-nvidia-* "
            "packages avoid this. Do not disable Secure Boot to work around it.",
        )
    ]


# -- Thunderbolt -----------------------------------------------------------------------------------


def check_tb_security(ctx: _Context) -> list[Finding]:
    blocked = [d for d in ctx.facts.thunderbolt.domains if (d.security or "") in NO_PCIE_LEVELS]
    if not blocked:
        return []
    return [
        Finding(
            "thunderbolt-security-blocks-pcie",
            "error",
            "The firmware's Thunderbolt security level forbids PCIe tunnels, so no eGPU can ever "
            "appear",
            _evidence(
                [f"/sys/bus/thunderbolt/devices/{d.name}/security: {d.security}" for d in blocked]
            ),
            "In the laptop firmware (BIOS/UEFI) set Thunderbolt security to User Authorization / "
            "Unique ID "
            "(or No Security on a machine with Kernel DMA Protection), save and reboot; "
            "'USB/DisplayPort only' and 'PCIe tunnelling off' settings cannot be changed from "
            "Linux.",
        )
    ]


def check_tb_authorized(ctx: _Context) -> list[Finding]:
    domains = {d.name: d for d in ctx.facts.thunderbolt.domains}
    pending = []
    for dev in ctx.facts.thunderbolt.devices:
        if dev.authorized is not False:
            continue
        domain = domains.get(dev.domain or "")
        if domain is not None and (domain.security or "") in NO_PCIE_LEVELS | {"none"}:
            continue
        pending.append((dev, domain))
    if not pending:
        return []
    lines = []
    for dev, domain in pending:
        sec = f", {domain.name} security {domain.security}" if domain and domain.security else ""
        iommu = (
            f", iommu_dma_protection={int(domain.iommu_dma_protection)}"
            if domain and domain.iommu_dma_protection is not None
            else ""
        )
        lines.append(
            f"{dev.sysfs_name or 'device'}: {dev.vendor or ''} {dev.name or ''} uuid "
            f"{dev.unique_id or '?'} "
            f"authorized=0{sec}{iommu}".replace("  ", " ")
        )
    for ln in (ctx.inputs.boltctl or "").splitlines():
        if re.search(r"status:\s+(connected|auth-error)\b", ln):
            lines.append(ln.strip())
    dev, domain = pending[0]
    policy = "iommu" if domain is not None and domain.iommu_dma_protection else "auto"
    uuid = dev.unique_id or "<uuid from boltctl list>"
    iommu_note = (
        ""
        if policy == "iommu"
        else " This domain has no IOMMU DMA protection: an authorized device can read memory, so "
        "prefer `boltctl authorize` per session over a stored auto policy on shared machines."
    )
    return [
        Finding(
            "thunderbolt-not-authorized",
            "warning" if ctx.nvidia_present else "error",
            f"Thunderbolt device {dev.name or dev.sysfs_name or uuid} is connected but not "
            "authorized, "
            "so its PCIe tunnel (and the GPU behind it) does not exist",
            _evidence(lines),
            f"Authorize exactly this enclosure: sudo boltctl enroll --policy {policy} {uuid} "
            f"(or pin hotplug.enclosure_unique_id: {uuid} in the profile and run egpu-setup "
            "install); "
            f"never add a rule that authorizes every device.{iommu_note}",
        )
    ]


def check_blanket_rule(ctx: _Context) -> list[Finding]:
    from egpu_setup.doctor.rules import blanket_rules

    found = blanket_rules(ctx.inputs.udev_rules)
    if not found:
        return []
    paths = sorted({r.path for r in found})
    return [
        Finding(
            "thunderbolt-blanket-authorize-rule",
            "error",
            "A udev rule authorizes every Thunderbolt device on plug-in, which gives any device "
            "plugged into this machine DMA access to its memory",
            _evidence([f"{r.path}:{r.line}: {r.text}" for r in found]),
            f"Remove the rule ({', '.join(paths)}), run sudo udevadm control --reload, and "
            "authorize only "
            "the enclosure: sudo boltctl enroll --policy iommu <uuid> (egpu-setup install renders "
            "a rule "
            "bound to one unique_id and to IOMMU protection when bolt is missing).",
        )
    ]


# -- torch -----------------------------------------------------------------------------------------


def _gpu_cc(g: Gpu) -> str | None:
    if g.compute_capability:
        return g.compute_capability
    if g.device_id:
        try:
            from egpu_setup.compat.gpus import gpu_by_id

            model = gpu_by_id(g.device_id)
        except Exception:  # the GPU table is optional here; a broken one is reported elsewhere
            return None
        return model.compute_capability if model else None
    return None


def _driver_version(ctx: _Context) -> str | None:
    if ctx.facts.nvidia.driver_version:
        return ctx.facts.nvidia.driver_version
    m = re.search(r"Driver Version:\s*([\d.]+)", ctx.inputs.nvidia_smi or "")
    return m.group(1) if m else None


def check_torch(ctx: _Context, torch_info: TorchInfo | None) -> list[Finding]:
    from egpu_setup.doctor import torchcheck as tc

    if torch_info is None:
        return []
    info = torch_info
    cuda = info.cuda or "none"
    head = f"torch {info.torch_version} (CUDA {cuda}, cuda_available={info.cuda_available})"
    out: list[Finding] = []
    if tc.is_cpu_only(info):
        out.append(
            Finding(
                "torch-cpu-only-build",
                "error",
                f"The target environment has a CPU-only torch ({info.torch_version}); it will "
                "never use the GPU",
                (head,),
                "Reinstall torch from a CUDA index: egpu-setup install --profile NAME --only torch "
                "(it uses pip --index-url https://download.pytorch.org/whl/<variant>, never "
                "PyPI's CPU "
                "default on this platform).",
            )
        )
        return out
    for g in ctx.facts.nvidia_gpus:
        cc = _gpu_cc(g)
        if not cc:
            continue
        try:
            runs = tc.runs_on(info, cc)
        except ValueError:
            continue
        if runs is None:
            out.append(
                Finding(
                    "torch-arch-unsupported",
                    "error",
                    f"torch {info.torch_version} has no kernels for {g.name or 'the GPU'} (compute "
                    f"capability {cc}): CUDA calls fail with 'no kernel image is available'",
                    (
                        head,
                        f"arch_list: {' '.join(info.arch_list)}",
                        f"{g.pci_address}: compute capability {cc}",
                    ),
                    "Install a torch build whose arch list covers this GPU: egpu-setup resolve "
                    "shows the "
                    "right variant (Blackwell needs cu128 or newer, torch >= 2.7; Maxwell/Pascal "
                    "need "
                    "cu126, torch <= 2.14), then egpu-setup install --profile NAME --only torch.",
                )
            )
    floor = tc.driver_too_old(info, _driver_version(ctx))
    if floor is not None:
        out.append(
            Finding(
                "torch-driver-too-old",
                "error",
                f"torch {info.torch_version} is built for CUDA {info.cuda}, which needs NVIDIA "
                "driver "
                f">= {floor}; this machine has {_driver_version(ctx)}",
                (head, f"NVIDIA driver {_driver_version(ctx)}"),
                f"Upgrade the driver to branch {floor.branch} or newer (egpu-setup install "
                "--profile NAME "
                "--only driver), or install a torch variant for an older CUDA (egpu-setup resolve "
                f"--driver {_driver_version(ctx)} shows which).",
            )
        )
    return out


# -- configuration left by other tools -------------------------------------------------------------


def check_managers(ctx: _Context) -> list[Finding]:
    """Other GPU managers: an error when one blacklists the driver or removes the GPU, a warning
    when it manages the eGPU or the display itself; each with the command that undoes it."""
    from egpu_setup.doctor.managers import manager_states

    states = [s for s in manager_states(ctx.inputs.managers) if s.effect != "installed"]
    if not states:
        return []
    all_states = manager_states(ctx.inputs.managers)
    names = ", ".join(s.manager.name for s in states)
    disabling = [s for s in states if s.effect == "disables-nvidia"]
    summary = f"Another GPU manager is configured: {names}"
    if disabling:
        summary += " - and it disables or removes the NVIDIA GPU"
    evidence = [f"{line} [{s.manager.id}]" for s in all_states for line in s.evidence()]
    fixes = [f"{s.manager.name}: {s.undo('display')}" for s in states]
    return [
        Finding(
            "competing-gpu-manager",
            "error" if disabling else "warning",
            summary,
            _evidence(evidence),
            "Undo it: " + "; ".join(fixes) + ". A compute-mode egpu-setup profile can coexist "
            "with a manager that only owns the display; display mode cannot.",
        )
    ]


def check_xorg(ctx: _Context) -> list[Finding]:
    from egpu_setup.doctor.rules import busid_for, xorg_busids

    ids = xorg_busids(ctx.inputs.xorg)
    if not ids:
        return []
    display_addrs = {g.pci_address for g in ctx.facts.gpus}
    bad = [b for b in ids if not b.valid]
    dangling = [b for b in ids if b.valid and display_addrs and b.address not in display_addrs]
    if not bad and not dangling:
        return []
    target = ctx.egpu.pci_address if ctx.egpu else next(iter(sorted(ctx.nvidia_addrs)), None)
    hint = f' For {target} write BusID "{busid_for(target)}".' if target else ""
    lines = [f"{b.path}:{b.line}: {b.raw} ({b.problem})" for b in bad]
    lines += [f"{b.path}:{b.line}: {b.raw} (no GPU at {b.address})" for b in dangling]
    return [
        Finding(
            "xorg-busid-invalid",
            "error" if bad else "warning",
            "An Xorg BusID is malformed" if bad else "An Xorg BusID points at no GPU present",
            _evidence(lines),
            "Xorg wants decimal PCI:bus:device:function (PCI:bus@domain:device:function off "
            "domain 0); "
            f"lspci prints hex, so convert each field.{hint} Fix it in the file named above "
            "(egpu-setup "
            "never edits your xorg.conf).",
        )
    ]


def check_atomics(ctx: _Context) -> list[Finding]:
    if not ctx.dmesg.atomics:
        return []
    return [
        Finding(
            "amd-pcie-atomics-missing",
            "warning",
            "An AMD GPU sits behind a PCIe path without atomics; ROCm skips it (no compute on "
            "that GPU)",
            _evidence(_hit_lines(ctx.dmesg.atomics)),
            "ROCm needs PCIe atomic operations on every hop, which Thunderbolt bridges and many "
            "chipset "
            "ports lack: use an NVIDIA GPU for CUDA in this enclosure, or connect the AMD card to "
            "a "
            "CPU-attached slot/OCuLink port whose root port supports atomics.",
        )
    ]


def check_pep668(ctx: _Context) -> list[Finding]:
    py = ctx.facts.python
    if not py.externally_managed:
        return []
    where = f" ({py.executable})" if py.executable else ""
    return [
        Finding(
            "externally-managed-python",
            "info",
            f"The system Python {py.version or ''}{where} is externally managed (PEP 668)".replace(
                "  ", " "
            ),
            (f"EXTERNALLY-MANAGED marker present for Python {py.version or '?'}",),
            "Nothing to fix: egpu-setup installs torch into a venv (/opt/egpu-setup/venv by "
            "default, "
            "--venv PATH for another) and never passes --break-system-packages; make sure the "
            "python3-venv package is installed.",
        )
    ]


def check_timed_out(ctx: _Context) -> list[Finding]:
    """A tool detect or collect ran that hung (host/machine.py ends it at its deadline)."""
    hung = {t.name: t.timeout_s for t in ctx.facts.timed_out}
    hung.update(ctx.inputs.timed_out)
    out = []
    for name, seconds in hung.items():
        if name == "nvidia-smi":
            fix = (
                "nvidia-smi asks the driver, so the GPU or the driver stopped answering: look for "
                "NVRM Xid or 'fallen off the bus' in `sudo dmesg`; save your work, replug the "
                "enclosure (or reboot), then run `egpu-setup doctor` again."
            )
        else:
            fix = (
                f"run `{name}` by hand to see where it waits; what doctor says without its "
                "output may be incomplete."
            )
        out.append(
            Finding(
                "tool-timed-out",
                "warning",
                f"{name} did not answer within {seconds:g} s and was ended",
                (f"{name}: no answer after {seconds:g} s",),
                fix,
            )
        )
    return out


def check_runtime_pm(ctx: _Context) -> list[Finding]:
    lines = [
        f"/sys/bus/pci/devices/{addr}/power/control: auto"
        for addr, value in ctx.inputs.power_control.items()
        if value.strip() == "auto"
    ]
    for addr, text in ctx.inputs.nvidia_power.items():
        m = re.search(r"Runtime D3 status:\s*(.+)", text)
        if m and m.group(1).strip().lower().startswith("enabled"):
            lines.append(
                f"/proc/driver/nvidia/gpus/{addr}/power: Runtime D3 status: {m.group(1).strip()}"
            )
    if not lines:
        return []
    gpu = ctx.egpu.pci_address if ctx.egpu else "<gpu address>"
    return [
        Finding(
            "runtime-pm-on-egpu",
            "warning",
            "Runtime power management is enabled on the eGPU path; an idle eGPU or bridge can be "
            "suspended and fall off the bus",
            _evidence(lines),
            "Keep the path powered: egpu-setup install --profile NAME --only config "
            "(hotplug.runtime_pm_off: "
            "true) renders a udev rule setting power/control=on for the GPU and its bridges and "
            "options nvidia NVreg_DynamicPowerManagement=0x00; to test now: echo on | sudo tee "
            f"/sys/bus/pci/devices/{gpu}/power/control.",
        )
    ]


def check_known_issues(ctx: _Context) -> list[Finding]:
    """Known-bad combinations of this GPU and its link (data/known_issues.yaml), with what the
    reports confirm and what helps; never presented as fixed."""
    from egpu_setup.doctor.known_issues import known_issues

    out: list[Finding] = []
    for hit in known_issues(ctx.facts):
        g = hit.gpu
        driver = ctx.facts.nvidia.driver_version
        out.append(
            Finding(
                "known-egpu-issue",
                "warning",
                f"{hit.where()}: {hit.issue.summary}",
                _evidence(
                    [
                        f"{g.pci_address}: {g.architecture}, {g.connection}"
                        + (f" ({g.connection_generation})" if g.connection_generation else "")
                        + (f", driver {driver}" if driver else ""),
                        f"reported: {hit.issue.confirmed}",
                        "reports: " + ", ".join(hit.issue.sources),
                    ]
                ),
                hit.issue.mitigation + ".",
            )
        )
    return out


def check_verify_temperature(ctx: _Context) -> list[Finding]:
    """The newest verify report's gpu-temperature check: a peak at or above the limit verify
    judged it by (the profile's expect.max_temp_c) is a finding, whatever verify's exit was."""
    report = ctx.inputs.verify_report
    checks = report.get("checks") if isinstance(report, dict) else None
    check = next(
        (c for c in checks or [] if isinstance(c, dict) and c.get("id") == "gpu-temperature"),
        None,
    )
    if check is None:
        return []
    peak, limit = check.get("value"), check.get("expected")
    if not (_is_number(peak) and _is_number(limit)) or peak < limit:
        return []
    assert isinstance(report, dict)
    profile = report.get("profile") or "the default limits"
    where = ctx.inputs.verify_report_path or "the verify report"
    return [
        Finding(
            "gpu-temperature-over-limit",
            "warning",
            f"The GPU reached {peak:.0f} °C during verify ({report.get('time', '?')}), at or "
            f"above the {limit:.0f} °C limit of {profile}",
            (f"{where}: gpu-temperature {check.get('detail') or peak}",),
            "Give the enclosure air: clear its intake and exhaust, keep it off soft surfaces, "
            "check that its fan spins up under load; a lower power limit (sudo nvidia-smi -pl "
            "WATTS) trades a little speed for heat; then run `egpu-setup verify --burn-in 10` "
            "and watch the peak.",
        )
    ]


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_checks(
    facts: HostFacts, inputs: DoctorInput, torch_info: TorchInfo | None = None
) -> list[Finding]:
    ctx = _context(facts, inputs)
    out: list[Finding] = []
    out += check_tb_security(ctx)
    out += check_tb_authorized(ctx)
    out += check_blanket_rule(ctx)
    bar = check_bar_allocation(ctx)
    out += bar
    out += check_bridge_windows(ctx)
    out += check_link(ctx)
    nouveau = check_nouveau(ctx)
    out += nouveau
    hold = (
        judge_hold(inputs.dpkg_status, inputs.driver_pin, inputs.hold_recorded)
        if inputs.dpkg_status is not None
        else None
    )
    out += check_mismatch(ctx, hold)
    out += check_fallen_off(ctx)
    resumed = check_lost_after_resume(ctx)
    out += resumed
    secure = check_secure_boot(ctx)
    out += secure
    # A BAR failure, nouveau or Secure Boot explains an unbound GPU better than "driver missing"
    # (the BAR failures of system76/firmware-open#66 and Dunedan/mbp-2016-linux#60 look like one).
    fallen = [f for f in out if f.id == "gpu-fallen-off-bus"]
    # so does another GPU manager that blacklists the driver or removes the GPU (EnvyControl's
    # integrated mode): its undo is the fix, not `modprobe nvidia`
    managers = check_managers(ctx)
    disabling = [f for f in managers if f.severity == "error"]
    suppressed = bool(bar or nouveau or secure or fallen or resumed or disabling)
    out += check_driver_loaded(ctx, suppressed)
    out += check_torch(ctx, torch_info)
    out += managers
    out += check_xorg(ctx)
    out += check_atomics(ctx)
    out += amd_log_findings(ctx.facts, ctx.dmesg)
    rocminfo = parse_rocminfo(inputs.rocminfo) if inputs.rocminfo else None
    out += kfd_findings(rocminfo)
    readings = smi_readings(inputs.amd_smi, inputs.rocm_smi)
    out += compute_agent_findings(rocminfo, readings, bool(inputs.amd_smi))
    out += vram_findings(readings, bool(inputs.amd_smi))
    out += check_pep668(ctx)
    out += check_runtime_pm(ctx)
    out += check_known_issues(ctx)
    out += check_verify_temperature(ctx)
    if inputs.kernels is not None:
        out += kernel_findings(judge_kernels(inputs.kernels))
    if hold is not None:
        out += hold_findings(hold)
    out += check_timed_out(ctx)
    return out
