"""The resolver's answer: a frozen Resolution, the `resolve --json` contract, and its reasons."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

SCHEMA_RESOLUTION = "egpu-setup/resolution/1"


@dataclass(frozen=True)
class ResolvedGpu:
    name: str
    pci_id: str | None  # "10de:2684"
    architecture: str | None
    compute_capability: str | None


@dataclass(frozen=True)
class NvidiaRepo:
    """NVIDIA's CUDA apt repository, added with Signed-By and a pinned key fingerprint."""

    url: str  # the `deb [signed-by=…] URL /` line's URL
    keyring_url: str  # the armored public key to download
    fingerprint: str  # the key must have exactly this fingerprint before it is trusted
    pin: str | None  # the branch-pinning package (branches >= 590), None when the name carries it


@dataclass(frozen=True)
class DriverPlan:
    installed: str | None
    # "in-kernel": amdgpu, part of the kernel: nothing to install but its firmware
    action: Literal["keep", "install", "upgrade", "host-managed", "in-kernel"]
    branch: int | None
    minimum: str | None
    flavour: Literal["open", "proprietary"] | None
    packages: tuple[str, ...]
    source: Literal["distro", "nvidia-repo", "host", "kernel"]
    apt_components: tuple[str, ...] = ()
    repo: NvidiaRepo | None = None


@dataclass(frozen=True)
class TorchPlan:
    version: str
    variant: str
    index_url: str
    requirements: tuple[str, ...]
    # the public variant index that `index_url` stands in for, when a lab's mirror was given
    # (install --index-url): the plan's header and its pip step name the same source
    mirror_of: str | None = None


@dataclass(frozen=True)
class MatrixUsed:
    """Which compatibility data decided: the shipped snapshot, or it plus the overlay of the last
    `matrix update` (`--matrix updated`), with its date, so a lab can tell two plans apart."""

    source: Literal["shipped", "updated"]
    snapshot: str  # the date of the shipped snapshot
    fetched_at: str | None = None  # when the overlay was read from the index
    index_url: str | None = None

    def text(self) -> str:
        if self.source == "shipped":
            return f"shipped snapshot of {self.snapshot}"
        return (
            f"updated: the PyTorch index as read {self.fetched_at} from {self.index_url} "
            f"(over the snapshot of {self.snapshot})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "snapshot": self.snapshot,
            "fetched_at": self.fetched_at,
            "index_url": self.index_url,
        }


@dataclass(frozen=True)
class Resolution:
    gpu: ResolvedGpu | None
    driver: DriverPlan
    torch: TorchPlan
    python: str
    platform: Literal["linux", "wsl"]
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    distro: str | None = None  # the host's distribution, "linuxmint-21.3"
    archive: str | None = None  # whose packages the plan uses, "ubuntu-22.04"
    matrix: MatrixUsed | None = None
    torch_pin: str | None = None  # the exact "2.9.1+cu128" a profile pinned (torch.pin)
    driver_pin: str | None = None  # the exact driver version a profile pinned (driver.pin)
    machine: str = "x86_64"  # the CPU architecture whose wheels and packages were planned

    def mirrored(self, index_url: str | None) -> Resolution:
        """This resolution with torch taken from `index_url` (a checked mirror of the variant
        index), so everything that names the source names the one the pip step uses."""
        t = self.torch
        if not index_url or index_url == t.index_url:
            return self
        return replace(self, torch=replace(t, index_url=index_url, mirror_of=t.index_url))

    def to_json(self) -> dict[str, Any]:
        """The `resolve --json` contract (docs/design.md, schema egpu-setup/resolution/1)."""
        d = self.driver
        repo = None
        if d.repo is not None:
            repo = {
                "url": d.repo.url,
                "keyring_url": d.repo.keyring_url,
                "fingerprint": d.repo.fingerprint,
                "pin": d.repo.pin,
            }
        return {
            "schema": SCHEMA_RESOLUTION,
            "machine": self.machine,
            "gpu": None
            if self.gpu is None
            else {
                "name": self.gpu.name,
                "pci_id": self.gpu.pci_id,
                "architecture": self.gpu.architecture,
                "compute_capability": self.gpu.compute_capability,
            },
            "driver": {
                "installed": d.installed,
                "action": d.action,
                "branch": d.branch,
                "minimum": d.minimum,
                "flavour": d.flavour,
                "packages": list(d.packages),
                "source": d.source,
                "apt_components": list(d.apt_components),
                "repo": repo,
            },
            "torch": {
                "version": self.torch.version,
                "variant": self.torch.variant,
                "index_url": self.torch.index_url,
                "mirror_of": self.torch.mirror_of,
                "requirements": list(self.torch.requirements),
            },
            "python": self.python,
            "platform": self.platform,
            "distro": self.distro,
            "archive": self.archive,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "matrix": self.matrix.to_json() if self.matrix else None,
            "pinned": {"torch": self.torch_pin, "driver": self.driver_pin},
        }


@dataclass
class Notes:
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def format_resolution(r: Resolution, *, warnings: bool = True, driver_in_run: bool = True) -> str:
    """The human view of a Resolution (resolve, and install's plan): three lines of answer, then
    why, then its warnings (install says those on stderr with the plan's own: warnings=False).
    `driver_in_run` False (install --only without driver) says the driver is not this run's."""
    t = r.torch
    lines = []
    if r.gpu is None:
        lines.append("GPU      none known")
    else:
        ident = f" [{r.gpu.pci_id}]" if r.gpu.pci_id else ""
        lines.append(
            f"GPU      {r.gpu.name}{ident}, {r.gpu.architecture or 'architecture unknown'}, "
            + (
                f"compute capability {r.gpu.compute_capability or 'unknown'}"
                if r.driver.action != "in-kernel"
                else "ROCm"
            )
        )
    lines += _driver_lines(r, driver_in_run)
    pinned = " (pinned: torch.pin)" if r.torch_pin else ""
    where = r.platform if r.machine == "x86_64" else f"{r.platform} {r.machine}"
    lines.append(f"Torch    {t.version}+{t.variant} for Python {r.python} ({where}){pinned}")
    lines.append(f"         pip install --index-url {t.index_url} {' '.join(t.requirements)}")
    if t.mirror_of:
        lines.append(f"         (a mirror of {t.mirror_of})")
    if r.matrix is not None:
        lines.append(f"Matrix   {r.matrix.text()}")
    if r.reasons:
        lines.append("")
        lines.append("Why")
        lines.extend(f"  - {reason}" for reason in r.reasons)
    if warnings and r.warnings:
        lines.append("")
        lines.append("Warnings")
        lines.extend(f"  ! {w}" for w in r.warnings)
    return "\n".join(lines)


def _driver_lines(r: Resolution, in_run: bool) -> list[str]:
    """The Driver line and the packages under it; outside the run (install --only torch), what
    the torch planned needs of the driver instead of an install this run will not do."""
    d = r.driver
    lines: list[str] = []
    if not in_run and d.action in ("install", "upgrade"):
        now = f"installed now: {d.installed}" if d.installed else "none is installed now"
        if r.torch.variant == "cpu":
            need = "the cpu torch needs none"
        else:
            need = f"this torch ({r.torch.variant}) needs >= {d.minimum or d.branch}"
        lines.append(
            f"Driver   not part of this run (--only leaves the driver out): {need}; {now}; "
            f"branch {d.branch} is what --only driver would {d.action}"
        )
        return lines
    if d.action == "in-kernel":
        drv = "amdgpu, in the kernel: no driver to install"
    elif d.action == "keep":
        drv = f"keep {d.installed} ({d.flavour or 'unknown'} modules)"
    elif d.action == "host-managed":
        who = "the Windows host" if r.platform == "wsl" else "you"
        drv = f"managed by {who}" + (f", installed {d.installed}" if d.installed else "")
        if d.branch and r.platform != "wsl":
            drv += f", suggested branch {d.branch}"
    else:  # install / upgrade
        where = "NVIDIA CUDA repo" if d.source == "nvidia-repo" else f"{r.archive} archive"
        drv = f"{d.action} branch {d.branch} ({d.flavour} modules) from the {where}"
        if d.installed:
            drv += f", replacing {d.installed}"
    if d.minimum:
        drv += f"; needs >= {d.minimum}"
    if r.driver_pin:
        drv += f" (pinned: driver.pin {r.driver_pin})"
    lines.append(f"Driver   {drv}")
    if d.packages:
        lines.append(f"         apt install {' '.join(d.packages)}")
    if d.apt_components:
        lines.append(f"         apt components: {' '.join(d.apt_components)}")
    if d.repo is not None:
        lines.append(f"         repo {d.repo.url} (key {d.repo.fingerprint})")
    return lines
