"""The apt packages (and components, or NVIDIA's repository) that install a driver branch."""

from __future__ import annotations

import re

from egpu_setup.compat.matrix import (
    Distro,
    Matrix,
)
from egpu_setup.resolve.branches import DriverOption
from egpu_setup.resolve.resolution import Notes, NvidiaRepo

# Debian's name for each machine (dpkg --print-architecture; https://wiki.debian.org/SupportedArchitectures)
_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def packages_for(
    matrix: Matrix, distro: Distro, option: DriverOption, kernel: str | None, notes: Notes
) -> tuple[tuple[str, ...], tuple[str, ...], NvidiaRepo | None]:
    """(packages, apt components, repo) that install `option` on `distro`."""
    branch, flavour = option.branch, option.flavour
    headers = tuple(h.format(debarch=_DEBIAN_ARCH[matrix.machine]) for h in distro.headers)
    if option.source == "nvidia-repo":
        repo = matrix.nvidia_repo
        directory = distro.nvidia_repo or ""
        pinned = branch >= repo.pinning_from_branch
        key = ("open" if flavour == "open" else "proprietary") + ("_pinned" if pinned else "")
        pkgs = tuple(p.format(branch=branch) for p in repo.packages[key])
        url = repo.url.format(dir=directory, arch=repo.arch_dirs[matrix.machine])
        rk = repo.key_for(directory)
        nrepo = NvidiaRepo(url, url + rk.file, rk.fingerprint, pkgs[0] if pinned else None)
        return (headers if distro.scheme == "debian" else ()) + pkgs, (), nrepo
    named = next((b.packages for b in distro.branches if b.branch == branch and b.packages), ())
    if named:
        kflavour = (
            _ubuntu_kernel_flavour(kernel, distro, matrix.machine, notes)
            if any("{kflavour}" in p for p in named)
            else ""
        )
        pkgs = tuple(p.format(kflavour=kflavour) for p in named)
        return (headers if distro.scheme == "debian" else ()) + pkgs, distro.components, None
    if distro.scheme == "debian":
        if flavour == "open":
            pkgs = ("nvidia-open-kernel-dkms", "nvidia-driver", "firmware-nvidia-gsp")
        else:
            pkgs = ("nvidia-kernel-dkms", "nvidia-driver", "firmware-nvidia-gsp")
        return headers + pkgs, distro.components, None
    suffix = "-open" if flavour == "open" else ""
    kflavour = _ubuntu_kernel_flavour(kernel, distro, matrix.machine, notes)
    return (
        (f"nvidia-driver-{branch}{suffix}", f"linux-modules-nvidia-{branch}{suffix}-{kflavour}"),
        distro.components,
        None,
    )


# Kernel flavours whose HWE kernels have their own -hwe-<release> modules meta package
_HWE_FLAVOURS = ("generic", "lowlatency", "generic-64k")


def _ubuntu_kernel_flavour(kernel: str | None, distro: Distro, machine: str, notes: Notes) -> str:
    """'6.8.0-45-generic' on noble -> 'generic'; '6.11.0-29-generic' -> 'generic-hwe-24.04'.

    Canonical's signed prebuilt modules come per kernel flavour (linux-modules-nvidia-580-open-
    generic); an HWE kernel needs the -hwe-<release> meta package, else the modules miss the
    running kernel. On arm64 only the flavours distros.yaml lists there are built."""
    flavour = _kernel_flavour(kernel, distro, notes)
    if machine == "x86_64" or distro.arm64 is None:
        return flavour
    built = distro.arm64.kernel_flavours
    base = flavour.split("-hwe-")[0]
    if base in built:
        return flavour
    notes.warnings.append(
        f"{distro.label} builds no linux-modules-nvidia-* for the '{base}' kernel flavour on "
        f"arm64 (only {', '.join(built)}): assuming 'generic', so boot a generic kernel "
        "(or DKMS is needed)"
    )
    return "generic"


def _kernel_flavour(kernel: str | None, distro: Distro, notes: Notes) -> str:
    if not kernel:
        notes.reasons.append("kernel unknown: the 'generic' Ubuntu kernel flavour is assumed")
        return "generic"
    m = re.match(r"^(\d+\.\d+)\.\d+-\d+-([a-z0-9-]+)$", kernel)
    if not m:
        notes.warnings.append(
            f"kernel {kernel} is not an Ubuntu archive kernel: assuming 'generic' "
            "(DKMS may be needed)"
        )
        return "generic"
    series, flavour = m.groups()
    if distro.ga_kernel and series != distro.ga_kernel and flavour in _HWE_FLAVOURS:
        return f"{flavour}-hwe-{distro.version_id}"
    return flavour
