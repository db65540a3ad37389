"""NVIDIA driver state, cheapest source first.

/sys/module/nvidia/version and /proc/driver/nvidia/version cost nothing; nvidia-smi can take
seconds on a cold GPU (it initialises every device), so a live host runs it only when asked.
A recording's nvidia-smi text is free and always read.
"""

from __future__ import annotations

import re

from egpu_setup.detect.facts import NvidiaFacts
from egpu_setup.host.machine import Host

# "NVRM version: NVIDIA UNIX ..." in /proc/driver/nvidia/version; "NVRM: loading NVIDIA UNIX ..."
# in the kernel log when the module loads.
_NVRM = re.compile(
    r"NVRM(?: version)?:\s*(?:loading\s+)?NVIDIA UNIX\s+(Open\s+)?.*?Kernel Module\s+"
    r"(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)"
)


# nvidia-smi asks the kernel driver: on a GPU that stopped answering it waits with it. 20 s is
# far beyond a healthy answer (well under a second), and a hang past it is reported, not waited.
NVIDIA_SMI_TIMEOUT_S = 20.0


def parse_proc_version(text: str | None) -> tuple[str | None, str | None]:
    """/proc/driver/nvidia/version (or a kernel log) -> (driver version, "open"/"proprietary").

    In a kernel log the last load wins: an upgrade without reboot logs both."""
    if not text:
        return None, None
    matches = list(_NVRM.finditer(text))
    if not matches:
        return None, None
    m = matches[-1]
    return m.group(2), "open" if m.group(1) else "proprietary"


def max_cuda_for_driver(version: str) -> str | None:
    """The newest CUDA toolkit a Linux driver supports: what nvidia-smi prints as "CUDA Version",
    from NVIDIA's toolkit/driver table (data/cuda.yaml `toolkit_drivers`). None below the table."""
    from egpu_setup.compat.matrix import load_snapshot, version_key
    from egpu_setup.compat.versions import DriverVersion

    try:
        driver = DriverVersion.from_str(version)
    except ValueError:
        return None
    supported = [t.cuda for t in load_snapshot().toolkit if t.min_driver <= driver]
    return max(supported, key=version_key) if supported else None


def loaded_modules(proc_modules: str | None) -> frozenset[str] | None:
    """Module names from /proc/modules text; None when the file is missing."""
    if proc_modules is None:
        return None
    return frozenset(line.split()[0] for line in proc_modules.splitlines() if line.strip())


def _module_loaded(host: Host, name: str, modules: frozenset[str] | None) -> bool | None:
    if host.is_dir(f"/sys/module/{name}"):
        # A built-in or loaded module has a directory; `initstate` is "live" once loaded.
        state = host.read_attr(f"/sys/module/{name}/initstate")
        return state in (None, "live", "coming")
    if modules is not None:
        return name in modules
    if host.is_dir("/sys/module"):
        return False
    return None


def probe_nvidia(host: Host, *, run_smi: bool) -> tuple[NvidiaFacts, object | None]:
    """NVIDIA facts plus the parsed nvidia-smi report (None when not read)."""
    modules = loaded_modules(host.read("/proc/modules"))
    # Debian renames the module nvidia-current; /sys/module shows the loaded name "nvidia".
    loaded = _module_loaded(host, "nvidia", modules)
    proc_version, flavour = parse_proc_version(host.read("/proc/driver/nvidia/version"))
    if flavour is None and host.kind == "recorded":
        # A pasted report often has only the kernel log; live, dmesg is not read for this.
        from egpu_setup.detect.kernel_log import recorded_kernel_log

        log_version, flavour = parse_proc_version(recorded_kernel_log(host))
        proc_version = proc_version or log_version
    module_version = host.read_attr("/sys/module/nvidia/version") or proc_version
    version = module_version
    smi = None
    if run_smi or host.kind == "recorded":
        text = host.command("nvidia-smi", ["nvidia-smi", "-q"], timeout=NVIDIA_SMI_TIMEOUT_S)
        if text:  # its parser (20 patterns) loads only for a report to read
            from egpu_setup.detect.nvidia_smi import parse_nvidia_smi

            smi = parse_nvidia_smi(text)
    cuda = None
    smi_error = None
    if smi is not None:
        version = version or smi.driver_version
        cuda = smi.cuda_version
        smi_error = smi.error
    if cuda is None and module_version is not None:
        # Only a Linux kernel module's version maps through the Linux table (not WSL's).
        cuda = max_cuda_for_driver(module_version)
    nouveau = _module_loaded(host, "nouveau", modules)
    return (
        NvidiaFacts(
            driver_version=version,
            cuda_version=cuda,
            module_loaded=loaded,
            module_flavour=flavour,
            nouveau_loaded=nouveau,
            smi_error=smi_error,
        ),
        smi,
    )
