"""doctor's AMD rules: amdgpu's troubles in the kernel log, and a /dev/kfd ROCm cannot open.

Pure over the scanned log (detect/amdgpu_log.py through doctor/dmesg.py) and rocminfo's report
(detect/rocm.py). Each fix is the one the public threads behind it arrived at (catalog.py
sources).
"""

from __future__ import annotations

from egpu_setup.compat.rocm import load_rocm
from egpu_setup.detect.amdgpu_log import AmdgpuEvent, summarize
from egpu_setup.detect.facts import HostFacts
from egpu_setup.detect.rocm import RocminfoReport
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
