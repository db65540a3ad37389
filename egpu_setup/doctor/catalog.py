"""The finding catalog: stable ids (a contract, docs/design.md), default severity,
what each one means, and the sources behind the diagnosis.

Ids are never renamed; new ones may be added. Severity: `error` blocks the eGPU from working
(doctor exits 1), `warning` degrades it or will bite later, `info` is context worth knowing.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_FINDINGS = "egpu-setup/findings/1"
SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Spec:
    id: str
    severity: str
    meaning: str  # one line for the README troubleshooting table and `doctor --explain`
    sources: tuple[str, ...]


CATALOG: tuple[Spec, ...] = (
    Spec(
        "pci-bar-allocation-failed",
        "error",
        "The kernel could not place the GPU's memory windows (BARs) behind the Thunderbolt/OCuLink "
        "bridge, so the driver cannot use the card.",
        (
            "Linux kernel-parameters.txt (pci=realloc, pci=hpmmioprefsize); NVIDIA nv-reg.h "
            "(EnableResizableBar)",
            "Dunedan/mbp-2016-linux#60, system76/firmware-open#66 (BAR no space, NVRM BAR1 is 0M)",
            "NVIDIA/open-gpu-kernel-modules#862 (RmInitAdapter failed without Above 4G / ReBAR), "
            "PR #1109",
        ),
    ),
    Spec(
        "pci-bridge-window-unassigned",
        "info",
        "A kernel log that names no GPU shows PCI bridges that got no memory window; which device "
        "is behind them it does not say (a dock's USB controller port as often as a hot-plug "
        "port).",
        (
            "Linux kernel-parameters.txt (pci=realloc, hpmmioprefsize: what the fix would be)",
            "fwupd/fwupd#343, fwupd/firmware-lenovo#279 (dock and T470s logs, no GPU)",
        ),
    ),
    Spec(
        "pcie-link-degraded",
        "warning",
        "The GPU's PCIe link trained narrower or slower than the connection allows.",
        (
            "Linux ABI sysfs-bus-pci (current_link_speed/width vs max_link_speed/width)",
            "ublue-os/bazzite#2174 (ADT-Link UT3G stuck at 2.5 GT/s), all-ways-egpu#37",
        ),
    ),
    Spec(
        "nvidia-driver-not-loaded",
        "error",
        "An NVIDIA GPU is present but the nvidia kernel module is not loaded or did not bind to "
        "it.",
        ("NVIDIA README: Installing the NVIDIA Driver", "pop-os/pop#3168"),
    ),
    Spec(
        "nvidia-gpu-init-failed",
        "error",
        "The nvidia kernel module is loaded but could not initialise the GPU (RmInitAdapter "
        "failed, or the open module refused a GPU without a GSP).",
        (
            "NVIDIA/open-gpu-kernel-modules#1151 (RmInitAdapter failed, osInitNvMapping), #862",
            "NVIDIA open-gpu-kernel-modules README (supported GPUs: Turing and newer)",
        ),
    ),
    Spec(
        "nvidia-no-gpu-found",
        "error",
        'The nvidia kernel module is loaded but drives no GPU: nvidia-smi says "No devices were '
        'found".',
        ("NVIDIA nvidia-smi(1) manual", "NVIDIA README: Installing the NVIDIA Driver"),
    ),
    Spec(
        "tool-timed-out",
        "warning",
        "A diagnostic tool (nvidia-smi, lspci, boltctl, ...) did not answer within its deadline "
        "and was ended: what it would have said is missing, and a hung nvidia-smi is itself a "
        "sign that the GPU or its driver stopped answering.",
        (
            "NVIDIA nvidia-smi(1) manual (queries go through the kernel driver)",
            "NVIDIA/open-gpu-kernel-modules#979 (a GPU that stops answering hangs its tools)",
        ),
    ),
    Spec(
        "nouveau-bound",
        "error",
        "The open-source nouveau driver owns the GPU, so the NVIDIA driver cannot.",
        ("NVIDIA README: Interaction with the Nouveau Driver (blacklist, initramfs rebuild)",),
    ),
    Spec(
        "driver-library-mismatch",
        "error",
        "The loaded kernel module and the NVIDIA user-space libraries are different versions "
        "(an upgrade without a reboot, or a half-finished one).",
        ("NVIDIA README: Known Issues", "stackhpc/ansible-slurm-appliance#287"),
    ),
    Spec(
        "driver-held",
        "info",
        "The NVIDIA driver packages are held at one version (egpu-setup's apt pin, profile "
        "driver.hold): no upgrade, unattended or not, moves them until the hold is released.",
        (
            "apt_preferences(5) (a priority over 1000 keeps the pinned version)",
            "https://github.com/mvo5/unattended-upgrades (Unattended-Upgrade::Package-Blacklist)",
        ),
    ),
    Spec(
        "driver-hold-removed",
        "warning",
        "egpu-setup held the NVIDIA driver (its manifest names the pin) and the pin file is "
        "gone: the next upgrade can split the kernel module from its libraries.",
        ("apt_preferences(5)",),
    ),
    Spec(
        "nvidia-module-missing-for-kernel",
        "error",
        "An installed kernel has no NVIDIA module it can load (a kernel update DKMS did not "
        "build for, or a kernel without headers): booting it leaves the eGPU without a driver.",
        (
            "dkms(8) (autoinstall -k), /usr/lib/dkms/common.postinst (kernels without headers "
            "are skipped)",
            "https://wiki.ubuntu.com/Kernel/Reference/NvidiaPrebuiltModules",
        ),
    ),
    Spec(
        "gpu-fallen-off-bus",
        "error",
        "The GPU stopped answering on the PCIe bus (Xid 79); the driver cannot recover it without "
        "a reboot.",
        (
            "NVIDIA README Known Issues (Xid 79)",
            "NVIDIA/open-gpu-kernel-modules#842 (TB replug), PR #1228 (idle runtime PM), #979 "
            "(Blackwell TB5)",
        ),
    ),
    Spec(
        "gpu-lost-after-resume",
        "error",
        "The eGPU, or the Thunderbolt/PCIe bridge it hangs off, did not come back from a suspend "
        "(fell off the bus, or was not ready after resume) while the enclosure stayed attached.",
        (
            "Linux drivers/pci/pci.c (pci_dev_wait: 'not ready ...ms after resume; giving up'), "
            "NVIDIA README 'Configuring Power Management Support'",
            "NVIDIA/open-gpu-kernel-modules#842 (TB3 eGPU off the bus after sleep), "
            "intel/thunderbolt-software-user-space#52 (eGPU needs a PCI rescan after resume), "
            "pop-os/cosmic-epoch#392 (Thunderbolt port not ready after resume)",
        ),
    ),
    Spec(
        "nvidia-smi-gpu-unreadable",
        "warning",
        'nvidia-smi could not read a GPU and gave no cause ("Unable to determine the device '
        'handle ... Unknown Error"); the evidence does not say whether it fell off the bus.',
        (
            "NVML API reference (nvmlReturn_t: NVML_ERROR_UNKNOWN vs NVML_ERROR_GPU_IS_LOST)",
            "NVIDIA/open-gpu-kernel-modules#387, NVIDIA/nvidia-docker#1553",
        ),
    ),
    Spec(
        "secure-boot-unsigned-module",
        "error",
        "Secure Boot is on and the kernel refuses the NVIDIA module because its signing key is "
        "not enrolled.",
        (
            "mokutil(1), dkms(8) (the MOK key DKMS signs with); Debian wiki SecureBoot",
            "Start9Labs/start-technologies#3702",
        ),
    ),
    Spec(
        "thunderbolt-not-authorized",
        "error",
        "A Thunderbolt/USB4 device is connected but not authorized, so no PCIe tunnel (and no "
        "GPU) exists.",
        ("Linux ABI sysfs-bus-thunderbolt (authorized); boltctl(1) (enroll --policy)",),
    ),
    Spec(
        "thunderbolt-security-blocks-pcie",
        "error",
        "The firmware's Thunderbolt security level (dponly/usbonly/nopcie) forbids PCIe tunnels "
        "entirely.",
        (
            "Linux admin-guide/thunderbolt.rst (security levels)",
            "egpu-switcher TROUBLESHOOT (USB/DP only)",
        ),
    ),
    Spec(
        "thunderbolt-blanket-authorize-rule",
        "error",
        "A udev rule authorizes every Thunderbolt device on plug-in: any device gets DMA access "
        "to memory.",
        (
            "kernel Documentation/admin-guide/thunderbolt.rst (the rule and its DMA warning)",
            "Thunderspy (2020)",
        ),
    ),
    Spec(
        "torch-arch-unsupported",
        "error",
        "The installed torch has no kernels for the GPU's compute capability "
        "('no kernel image is available for execution on the device').",
        (
            "pytorch/pytorch RELEASE.md (compiled arch lists)",
            "pytorch/pytorch#150733, #167244 (sm_120)",
        ),
    ),
    Spec(
        "torch-driver-too-old",
        "error",
        "The torch wheel's CUDA runtime needs a newer NVIDIA driver than the one installed.",
        (
            "NVIDIA CUDA Compatibility, minor version compatibility (CUDA 12 >= 525.60.13, CUDA "
            "13 >= 580)",
        ),
    ),
    Spec(
        "torch-cpu-only-build",
        "error",
        "The torch in the target environment is a CPU-only build: it will never use the GPU.",
        ("pytorch/pytorch RELEASE.md (the CPU and CUDA variants of each release)",),
    ),
    Spec(
        "competing-gpu-manager",
        "warning",
        "Another GPU switching tool is installed or configured and may rewrite the same files or "
        "disable the NVIDIA driver.",
        (
            "envycontrol, optimus-manager, egpu-switcher, all-ways-egpu: the files each writes",
            "canonical/ubuntu-drivers-common#34",
        ),
    ),
    Spec(
        "xorg-busid-invalid",
        "error",
        "An Xorg BusID is not the decimal PCI:bus:device:function form, or points at no GPU.",
        (
            "xorg.conf(5) BusID; egpu-switcher#61, optimus-manager#539 (hex vs decimal)",
            "NVIDIA README FAQ: format of a PCI Bus ID",
        ),
    ),
    Spec(
        "amd-pcie-atomics-missing",
        "warning",
        "An AMD GPU sits behind a link without PCIe atomics; ROCm compute will not use it.",
        ("ROCm/legacy-rocm-build#1214, #827 ('PCI rejects atomics')",),
    ),
    Spec(
        "amdgpu-init-failed",
        "error",
        'amdgpu gave up starting the AMD GPU ("Fatal error during GPU init"), most often for '
        "firmware it could not load.",
        (
            "https://github.com/ROCm/amdgpu/pull/113 (Failed to load firmware, then Fatal error "
            "during GPU init)",
            "https://github.com/ROCm/rocm-install-on-linux/issues/615 (fixed in the BIOS settings)",
        ),
    ),
    Spec(
        "amdgpu-gpu-reset",
        "warning",
        "A job hung on the AMD GPU (ring timeout) and amdgpu reset the GPU; work in flight is "
        "lost.",
        (
            "https://github.com/ROCm/legacy-rocm-build/issues/6273, "
            "https://github.com/ROCm/legacy-rocm-build/issues/6127 (ring timeouts, resets)",
            "https://github.com/yshui/picom/issues/1390 (closed upstream: amdgpu/Mesa, not the "
            "program)",
        ),
    ),
    Spec(
        "amdgpu-smu-failed",
        "warning",
        "The AMD GPU's power-management firmware (SMU) stopped answering amdgpu.",
        (
            "https://github.com/t2linux/T2-Ubuntu/issues/208, "
            "https://github.com/NoaHimesaka1873/linux-t2-arch/issues/247 (a kernel regression: "
            "the previous kernel works)",
            "https://github.com/ROCm/legacy-rocm-build/issues/2196",
        ),
    ),
    Spec(
        "amd-kfd-unavailable",
        "error",
        "rocminfo cannot open /dev/kfd, so ROCm (and torch) see no AMD GPU.",
        (
            "https://github.com/ROCm/ROCm-docker/issues/116, "
            "https://github.com/ROCm/legacy-rocm-build/issues/2232 (the render and video groups)",
            "https://github.com/ROCm/ROCT-Thunk-Interface README (/dev/kfd is root:render)",
        ),
    ),
    Spec(
        "amd-gpu-no-compute-agent",
        "error",
        "amd-smi (or rocm-smi) lists an AMD GPU that rocminfo does not: amdgpu drives it, but "
        "ROCm's runtime (the kernel's KFD) did not add it, so torch cannot use it.",
        (
            "https://github.com/ROCm/rocminfo docs/how-to/use-rocminfo.rst (an agent per GPU "
            "KFD added)",
            "https://github.com/ollama/ollama/issues/11420 (rocminfo with a CPU agent only)",
            "kfd_device.c (Linux drivers/gpu/drm/amd/amdkfd): the 'skipped device' and 'not "
            "supported in kfd' lines",
        ),
    ),
    Spec(
        "amd-vram-mostly-used",
        "warning",
        "amd-smi (or rocm-smi) reads most of the AMD GPU's memory as in use already: torch gets "
        "only what is left.",
        (
            "https://github.com/ROCm/amdsmi docs/how-to/amdsmi-cli-tool.md (`amd-smi process`)",
            "https://github.com/sebhildebrandt/systeminformation/pull/960 (VRAM% 87 on a 780M)",
        ),
    ),
    Spec(
        "externally-managed-python",
        "info",
        "The system Python is externally managed (PEP 668): packages go into a venv, never the "
        "system.",
        ("PEP 668",),
    ),
    Spec(
        "runtime-pm-on-egpu",
        "warning",
        "Runtime power management can suspend the eGPU or its bridges at idle, which drops it off "
        "the bus.",
        (
            "NVIDIA README: PCI-Express Runtime D3 (RTD3) Power Management",
            "egpu-switcher#125, CachyOS/linux-cachyos#1021, NVIDIA/open-gpu-kernel-modules PR "
            "#1228",
        ),
    ),
    Spec(
        "known-egpu-issue",
        "warning",
        "This GPU on this link is a combination with known, unfixed problems in public reports "
        "(Blackwell over Thunderbolt/USB4/OCuLink: hard lock-ups under CUDA, falling off the bus "
        "at idle).",
        (
            "egpu_setup/data/known_issues.yaml (each entry's reports)",
            "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/979",
            "https://github.com/NVIDIA/open-gpu-kernel-modules/pull/1228",
        ),
    ),
    Spec(
        "gpu-temperature-over-limit",
        "warning",
        "During `egpu-setup verify` the GPU got as hot as the profile's limit (expect.max_temp_c) "
        "or hotter: an enclosure's airflow or supply is not keeping up.",
        (
            "the verify report's gpu-temperature check (nvidia-smi temperature.gpu samples)",
            "NVIDIA lists 90 C as the maximum GPU temperature of the RTX 40 series "
            "(profiles/rtx4090.yaml)",
        ),
    ),
)

BY_ID: dict[str, Spec] = {s.id: s for s in CATALOG}
ORDER: dict[str, int] = {s.id: i for i, s in enumerate(CATALOG)}
