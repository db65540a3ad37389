"""Pure: which installed kernel would boot without a loadable NVIDIA module, and the fix.

A kernel lacking the module is `rebuild` when DKMS knows an NVIDIA module and the kernel's
headers are there (`dkms autoinstall -k <release>` builds it), else `missing`: DKMS skips a
kernel without headers with a message and no error (/usr/lib/dkms/common.postinst), and a
prebuilt module (Ubuntu's linux-modules-nvidia-<branch>-<release>) comes only as its own
package. With no NVIDIA module anywhere and none in DKMS there is no driver to check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from egpu_setup.detect.kernels import DkmsEntry, KernelFacts, KernelTree
from egpu_setup.doctor.findings import Finding

# Ubuntu's prebuilt, signed module: kernel/nvidia-<branch>/nvidia.ko from
# linux-modules-nvidia-<branch>-<release> (https://wiki.ubuntu.com/Kernel/Reference/NvidiaPrebuiltModules)
_PREBUILT = re.compile(r"(?:^|/)kernel/nvidia-(\d+)(?:-server)?/nvidia\.ko")


@dataclass(frozen=True)
class KernelVerdict:
    release: str
    state: str  # ok / rebuild / missing
    running: bool
    fix: str | None  # the commands that give this kernel its module; None when ok


def _nvidia_dkms(entries: tuple[DkmsEntry, ...] | None) -> list[DkmsEntry]:
    return [e for e in entries or () if e.module.startswith("nvidia")]


def _prebuilt_branch(kernels: tuple[KernelTree, ...]) -> str | None:
    for k in kernels:
        if k.module and (m := _PREBUILT.search(k.module)):
            return m.group(1)
    return None


def judge_kernels(facts: KernelFacts) -> tuple[KernelVerdict, ...]:
    """One verdict per installed kernel; () when no NVIDIA driver is installed at all."""
    dkms = _nvidia_dkms(facts.dkms)
    if not dkms and not any(k.module for k in facts.kernels):
        return ()
    built = {e.kernel for e in dkms if e.state.startswith("installed")}
    branch = _prebuilt_branch(facts.kernels)
    out = []
    for k in facts.kernels:
        running = k.release == facts.running
        if k.module is not None or k.release in built:
            out.append(KernelVerdict(k.release, "ok", running, None))
        elif dkms and k.headers:
            fix = f"dkms autoinstall -k {k.release}"
            out.append(KernelVerdict(k.release, "rebuild", running, fix))
        elif branch is not None and not dkms:
            fix = f"apt-get install linux-modules-nvidia-{branch}-{k.release}"
            out.append(KernelVerdict(k.release, "missing", running, fix))
        else:
            fix = f"apt-get install linux-headers-{k.release} && dkms autoinstall -k {k.release}"
            out.append(KernelVerdict(k.release, "missing", running, fix))
    return tuple(out)


_WHY = {
    "rebuild": "no module; headers present, DKMS can build it",
    "missing": "no module, and nothing here can build it",
}


def kernel_findings(verdicts: tuple[KernelVerdict, ...]) -> list[Finding]:
    """`nvidia-module-missing-for-kernel`: an error when the running kernel lacks its module, a
    warning for another installed kernel (it bites at the next boot into it)."""
    bad = [v for v in verdicts if v.state != "ok"]
    if not bad:
        return []
    running = any(v.running for v in bad)
    names = ", ".join(v.release + (" (running)" if v.running else "") for v in bad)
    return [
        Finding(
            "nvidia-module-missing-for-kernel",
            "error" if running else "warning",
            f"No loadable NVIDIA module for kernel {names}: booting it leaves the eGPU without "
            "its driver.",
            tuple(f"{v.release}: {_WHY[v.state]}" for v in bad),
            "; ".join(v.fix for v in bad if v.fix)
            + " (as root; `egpu-setup kernels check` runs the DKMS builds it can)",
        )
    ]
