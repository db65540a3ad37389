"""Which kernels are installed, and whether each has an NVIDIA module it can load.

A kernel is installed when /lib/modules/<release> holds its modules.dep (depmod(8) writes it
for every kernel package; a tree left by a removed kernel keeps only stray files). Its NVIDIA
module counts when modules.dep lists an `nvidia.ko` or Debian's `nvidia-current.ko` (plain or
compressed) and that file exists:
modprobe(8) loads only what modules.dep names, so a module built without depmod does not load
either. DKMS puts it under updates/dkms/ (dkms(8)), Ubuntu's signed prebuilt
linux-modules-nvidia-<branch>-<release> under kernel/nvidia-<branch>/
(https://wiki.ubuntu.com/Kernel/Reference/NvidiaPrebuiltModules).

`dkms status` is a shell script that reads its whole tree: it runs only when some kernel lacks
its module and DKMS holds an NVIDIA module, so the check after an apt run that touched no kernel
starts no process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from egpu_setup.host.machine import Host

DKMS_STATUS_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class DkmsEntry:
    """One line of `dkms status`: module/version for a kernel and its state."""

    module: str
    version: str
    kernel: str | None
    arch: str | None
    state: str  # added / built / installed (and suffixes like "installed (WARNING ...)")


# dkms >= 3: "nvidia-current/535.261.03, 6.1.0-50-amd64, x86_64: installed"
# dkms 2.x:  "nvidia-current, 535.261.03, 6.1.0-50-amd64, x86_64: installed"
# not built: "nvidia-current/535.261.03: added"
_NEW = re.compile(r"^([^/,\s]+)/([^,\s]+)(?:, ([^,\s]+), ([^:\s]+))?: (.+)$")
_OLD = re.compile(r"^([^/,\s]+), ([^,\s]+)(?:, ([^,\s]+), ([^:\s]+))?: (.+)$")


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    out = []
    for line in text.splitlines():
        m = _NEW.match(line.strip()) or _OLD.match(line.strip())
        if m:
            module, version, kernel, arch, state = m.groups()
            out.append(DkmsEntry(module, version, kernel, arch, state.strip()))
    return out


# "updates/dkms/nvidia.ko.zst: kernel/drivers/..." or an absolute path (older depmod). Debian
# names its build nvidia-current (nvidia-kernel-dkms: nvidia-current.ko, and `alias nvidia
# nvidia-current` in its modprobe.d file); upstream, Ubuntu and the CUDA repository: nvidia.
_NVIDIA_DEP = re.compile(r"^(\S*/)?nvidia(-current)?\.ko(\.xz|\.zst|\.gz)?:", re.MULTILINE)


def parse_modules_dep(text: str) -> str | None:
    """The path of the `nvidia` (Debian: `nvidia-current`) module in a modules.dep, as written
    there; None if absent."""
    m = _NVIDIA_DEP.search(text)
    return m.group(0)[:-1] if m else None


@dataclass(frozen=True)
class KernelTree:
    """What one installed kernel has: its image, its headers, its NVIDIA module."""

    release: str
    image: bool  # /boot/vmlinuz-<release>
    headers: bool  # /lib/modules/<release>/build/include: DKMS can build against it
    module: str | None  # the nvidia module's path under /lib/modules/<release>, when it loads


@dataclass(frozen=True)
class KernelFacts:
    running: str | None
    kernels: tuple[KernelTree, ...]  # oldest first
    dkms: tuple[DkmsEntry, ...] | None  # None: not read (nothing missing) or no dkms


def _version_key(release: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.+~-]", release)]


def probe_kernel_tree(host: Host, release: str) -> KernelTree | None:
    base = f"/lib/modules/{release}"
    dep = host.read(f"{base}/modules.dep", limit=16 * 1024 * 1024)
    if dep is None:
        return None
    module = parse_modules_dep(dep)
    if module is not None:
        path = module if module.startswith("/") else f"{base}/{module}"
        if not host.exists(path):
            module = None
    return KernelTree(
        release,
        image=host.exists(f"/boot/vmlinuz-{release}"),
        headers=host.is_dir(f"{base}/build/include"),
        module=module,
    )


def probe_kernels(host: Host, *, read_dkms: bool | None = None) -> KernelFacts:
    """Every installed kernel and its NVIDIA module; `dkms status` when one lacks it (or when
    read_dkms says so)."""
    found = (probe_kernel_tree(host, r) for r in host.listdir("/lib/modules"))
    trees = tuple(
        sorted((t for t in found if t is not None), key=lambda t: _version_key(t.release))
    )
    if read_dkms is None:
        # DKMS keeps each module's sources and builds under /var/lib/dkms/<module>/ (dkms(8))
        read_dkms = any(t.module is None for t in trees) and bool(
            host.glob("/var/lib/dkms", "nvidia*")
        )
    dkms = None
    if read_dkms:
        text = host.command("dkms-status", ["dkms", "status"], timeout=DKMS_STATUS_TIMEOUT_S)
        dkms = None if text is None else tuple(parse_dkms_status(text))
    return KernelFacts(host.read_attr("/proc/sys/kernel/osrelease"), trees, dkms)
