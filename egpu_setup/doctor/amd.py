"""doctor's AMD rules: amdgpu's troubles in the kernel log, a /dev/kfd ROCm cannot open, and
what AMD's SMIs read off the GPU (a GPU ROCm's runtime does not see, its PCIe link, its VRAM).

Pure over the scanned log (detect/amdgpu_log.py through doctor/dmesg.py), rocminfo's report and
the SMI readings (detect/rocm.py). Each fix is the one the public threads behind it arrived at
(catalog.py sources).
"""

from __future__ import annotations

from egpu_setup.compat.rocm import load_rocm
from egpu_setup.detect.amdgpu_log import AmdgpuEvent, summarize
from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.detect.rocm import (
    AmdGpuReading,
    RocminfoReport,
    merge_readings,
    parse_amd_smi,
    parse_rocm_smi,
)
from egpu_setup.doctor.dmesg import DmesgScan
from egpu_setup.doctor.findings import MAX_EVIDENCE, Finding


def _lines(events: tuple[AmdgpuEvent, ...]) -> tuple[str, ...]:
    lines = [line for e in events for line in e.lines]
    if len(lines) > MAX_EVIDENCE:
        return (*lines[: MAX_EVIDENCE - 1], f"... {len(lines) - MAX_EVIDENCE + 1} more lines")
    return tuple(lines)


def _firmware_package(facts: HostFacts) -> str:
    fw = load_rocm().firmware_for(facts.os.id)
    if fw is None:
        return "your distribution's linux-firmware package"
    where = f" (Debian's {fw.component} component)" if fw.component else ""
    return f"{fw.package}{where}"


def amd_log_findings(facts: HostFacts, scan: DmesgScan) -> list[Finding]:
    """amdgpu-gpu-reset, amdgpu-init-failed, amdgpu-smu-failed from the kernel log."""
    trouble = summarize(scan.amdgpu)
    out: list[Finding] = []
    if trouble.init_failed:
        missing = ", ".join(trouble.missing_firmware)
        fix = (
            f"amdgpu could not load {missing}: install or update {_firmware_package(facts)} "
            "(`egpu-setup install` plans it for an AMD GPU), then reboot."
            if missing
            else "amdgpu gave up on the GPU while starting it. Check the firmware settings "
            "(BIOS/UEFI) for the slot or port it sits behind (Above 4G decoding, the PCIe "
            f"generation), and that {_firmware_package(facts)} is installed and current."
        )
        out.append(
            Finding(
                "amdgpu-init-failed",
                "error",
                "amdgpu failed to initialize the GPU (Fatal error during GPU init): no display "
                "and no compute on it",
                _lines(trouble.init_failed),
                fix,
            )
        )
    if trouble.hangs:
        rings = sorted({e.detail for e in trouble.hangs if e.kind == "ring-timeout" and e.detail})
        on = f" on ring {', '.join(rings)}" if rings else ""
        out.append(
            Finding(
                "amdgpu-gpu-reset",
                "warning" if trouble.recovered else "error",
                f"A job hung on the AMD GPU{on} and amdgpu reset the GPU"
                + (" (it recovered)" if trouble.recovered else " (no successful reset after it)"),
                _lines(trouble.hangs),
                "The `Process` line names the program whose job hung. Work in flight was lost "
                '("VRAM is lost due to GPU reset"; programs still holding it get "Failed to '
                'initialize parser -125" and must be restarted). Update the kernel and '
                f"{_firmware_package(facts)}: these hangs were fixed in amdgpu, Mesa and the GPU "
                "firmware, not in the program. If it recurs, report it to amdgpu with the "
                "devcoredump the log names (/sys/class/drm/cardN/device/devcoredump/data).",
            )
        )
    if trouble.smu:
        out.append(
            Finding(
                "amdgpu-smu-failed",
                "error" if trouble.smu_init_failed else "warning",
                "The AMD GPU's power-management firmware (SMU) stopped answering amdgpu",
                _lines(trouble.smu),
                "The SMU runs firmware from "
                f"{_firmware_package(facts)} and is driven by the kernel's amdgpu: when this "
                "started after a kernel or firmware update, boot the previous kernel (or go back "
                "to the previous firmware package) and report the regression; otherwise update "
                "both. On an eGPU, check the enclosure's power supply too.",
            )
        )
    return out


def kfd_findings(report: RocminfoReport | None) -> list[Finding]:
    """amd-kfd-unavailable: rocminfo could not open /dev/kfd, so ROCm sees no GPU."""
    if report is None or report.kfd_error is None:
        return []
    err = report.kfd_error
    evidence: tuple[str, ...] = (f"Unable to open /dev/kfd read-write: {err}",)
    if report.user:
        evidence += (f"{report.user} is member of render group",)
    if err in ("Permission denied", "Operation not permitted"):
        fix = (
            "/dev/kfd and /dev/dri/renderD* belong to the render (and video) group: add the "
            "user with `sudo usermod -aG render,video USER` (`egpu-setup install` does this for "
            "the venv's user) and log in again; a container also needs "
            "`--device=/dev/kfd --device=/dev/dri --group-add render`."
        )
    else:
        fix = (
            "The user may open /dev/kfd, but the kernel's KFD refused it: it added no GPU. Look "
            'for the `kfd` lines of `sudo dmesg` ("skipped device ..., PCI rejects atomics" is '
            'amd-pcie-atomics-missing; "not supported in kfd" is a GPU ROCm does not run), and '
            "for a container, that the host's /dev/kfd is passed in."
        )
    return [
        Finding(
            "amd-kfd-unavailable",
            "error",
            f"ROCm cannot open /dev/kfd ({err}): torch sees no AMD GPU",
            evidence,
            fix,
        )
    ]


def smi_readings(amd_smi: tuple[str, ...], rocm_smi: tuple[str, ...]) -> tuple[AmdGpuReading, ...]:
    """One reading per GPU from what amd-smi printed, else rocm-smi (the tool it replaced)."""
    if amd_smi:
        return merge_readings(*(parse_amd_smi(t) for t in amd_smi))
    return merge_readings(*(parse_rocm_smi(t) for t in rocm_smi))


def _tool(amd_smi: bool) -> str:
    return "amd-smi" if amd_smi else "rocm-smi"


def _named(r: AmdGpuReading) -> str:
    where = f" at {r.pci_address}" if r.pci_address else ""
    what = f" ({r.name})" if r.name else (f" (device {r.device_id})" if r.device_id else "")
    return f"GPU {r.index}{where}{what}"


def _has_agent(report: RocminfoReport, r: AmdGpuReading) -> bool | None:
    """Does rocminfo list this GPU? By PCI address (rocminfo's BDFID has no domain), else by
    device id; None when the reading carries neither."""
    if r.pci_address:
        bdf = r.pci_address.split(":", 1)[1] if r.pci_address.count(":") == 2 else r.pci_address
        return any(a.bdf == bdf for a in report.gpus)
    if r.device_id:
        return any(a.device_id == r.device_id for a in report.gpus)
    return None


def compute_agent_findings(
    report: RocminfoReport | None, readings: tuple[AmdGpuReading, ...], amd_smi: bool
) -> list[Finding]:
    """amd-gpu-no-compute-agent: a GPU the SMI lists (amdgpu drives it) that rocminfo, which
    opened /dev/kfd, does not list as an agent: ROCm's runtime does not see it, so torch cannot."""
    if report is None or report.kfd_error is not None or not report.agents:
        return []  # no rocminfo, or one that could not open /dev/kfd (amd-kfd-unavailable)
    missing = [r for r in readings if _has_agent(report, r) is False]
    if not missing:
        return []
    agents = ", ".join(f"{a.name}" + (f" at {a.bdf}" if a.bdf else "") for a in report.agents)
    evidence = tuple(f"{_tool(amd_smi)}: {_named(r)}" for r in missing)
    evidence += (f"rocminfo agents: {agents}",)
    return [
        Finding(
            "amd-gpu-no-compute-agent",
            "error",
            f"{_tool(amd_smi)} lists {len(missing)} AMD GPU(s) that ROCm's runtime does not "
            "(no rocminfo agent): torch cannot use " + ("it" if len(missing) == 1 else "them"),
            evidence,
            "amdgpu drives the GPU but the kernel's KFD did not add it for compute. `sudo dmesg "
            '| grep kfd` says why: "skipped device ..., PCI rejects atomics" is a link without '
            'PCIe atomics (amd-pcie-atomics-missing: OCuLink or a CPU-attached slot); "GC IP '
            '... not supported in kfd" is a kernel older than the GPU (update the kernel); no '
            "kfd line at all for it: check that ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES do "
            "not hide it.",
        )
    ]


def _gpu_of(facts: HostFacts, r: AmdGpuReading, count: int) -> Gpu | None:
    """The detected AMD GPU a reading is of: by PCI address, else by device id when one GPU
    has it, else the one AMD GPU when the SMI read one (rocm-smi's metrics name only an index)."""
    amd = [g for g in facts.gpus if g.vendor == "amd"]
    if r.pci_address:
        return next((g for g in amd if g.pci_address == r.pci_address), None)
    same = [g for g in amd if r.device_id and g.device_id == r.device_id]
    if len(same) == 1:
        return same[0]
    return amd[0] if len(amd) == 1 and count == 1 and not r.device_id else None


def smi_link_lines(
    facts: HostFacts, readings: tuple[AmdGpuReading, ...], amd_smi: bool
) -> list[tuple[str, str]]:
    """(level, evidence line) for each AMD GPU whose PCIe link, as the SMI reads it, trained
    below what its connection allows: the rule check_link applies to NVIDIA GPUs (doctor/
    checks.py), same finding id (pcie-link-degraded). Only a GPU known to be internal should
    reach its full width; behind Thunderbolt/USB4/OCuLink x4 is the design, and a slower speed
    on a tunnel is the tunnel's number (info)."""
    out: list[tuple[str, str]] = []
    for r in readings:
        gpu = _gpu_of(facts, r, len(readings))
        # the maximum as the SMI reads it (amd-smi static BUS), else as sysfs does (detect)
        max_width = r.max_link_width or (gpu.link.max_width if gpu else None)
        max_speed = r.max_link_speed_gts or (gpu.link.max_speed_gts if gpu else None)
        if r.link_width is None or max_width is None:
            continue
        external = gpu.external if gpu else None
        connection = gpu.connection if gpu else "unknown"
        floor = max_width if external is False else 4
        line = (
            f"{_tool(amd_smi)} {_named(r)}: PCIe x{r.link_width}"
            + (f" at {r.link_speed_gts:g} GT/s" if r.link_speed_gts else "")
            + f", the GPU's maximum x{max_width}"
            + (f" at {max_speed:g} GT/s" if max_speed else "")
            + ("" if r.max_link_width else " (sysfs max_link_width/max_link_speed)")
        )
        if r.link_width < min(floor, max_width):
            out.append(("warning", line))
        elif r.link_speed_gts and max_speed and r.link_speed_gts < max_speed:
            tunnel = connection in ("thunderbolt", "usb4", "unknown")
            out.append(("info" if tunnel else "warning", line))
    return out


# VRAM that is in use before anything of the user's runs: a desktop on the eGPU, a leftover
# process. At this share torch's allocator gets too little to train on.
VRAM_BUSY_SHARE = 0.8


def vram_findings(readings: tuple[AmdGpuReading, ...], amd_smi: bool) -> list[Finding]:
    """amd-vram-mostly-used: an AMD GPU whose VRAM is mostly allocated already."""
    lines = []
    for r in readings:
        if r.vram_total_mib and r.vram_used_mib is not None:
            share = r.vram_used_mib / r.vram_total_mib
            shown = f"{r.vram_used_mib:.0f} of {r.vram_total_mib:.0f} MiB"
        elif r.vram_percent is not None:
            share, shown = r.vram_percent / 100, f"{r.vram_percent:g}% of its VRAM"
        else:
            continue
        if share >= VRAM_BUSY_SHARE:
            lines.append(f"{_tool(amd_smi)} {_named(r)}: {shown} in use")
    if not lines:
        return []
    return [
        Finding(
            "amd-vram-mostly-used",
            "warning",
            "Most of the AMD GPU's memory is already in use: torch gets only the rest",
            tuple(lines),
            "`amd-smi process` (or `rocm-smi --showpids`) names the programs holding it: end "
            "the ones you do not need (a leftover training run, a browser or desktop session on "
            "this GPU: run the desktop on the laptop's own GPU); an integrated GPU's share is "
            "the carve-out set in the firmware settings (UMA frame buffer size).",
        )
    ]
