"""What doctor reports, and what it reads: the Finding value and the raw inputs it is judged on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egpu_setup.detect.kernels import KernelFacts
from egpu_setup.doctor.catalog import BY_ID, SEVERITIES
from egpu_setup.doctor.dmesg import DmesgScan

MAX_EVIDENCE = 8


@dataclass(frozen=True)
class Finding:
    id: str  # a stable catalog id (catalog.py)
    severity: str  # error / warning / info
    summary: str
    evidence: tuple[str, ...]
    fix: str

    def __post_init__(self) -> None:
        if self.id not in BY_ID:
            raise ValueError(f"unknown finding id {self.id!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "fix": self.fix,
            "sources": list(BY_ID[self.id].sources),
        }


@dataclass(frozen=True)
class DoctorInput:
    """Raw text from the host; every field is optional (None: the source was not available)."""

    dmesg: str | None = None
    # The kernel log scanned as it was read (collect streams it): stands in for `dmesg` text.
    dmesg_scan: DmesgScan | None = None
    lspci: str | None = None
    nvidia_smi: str | None = None
    boltctl: str | None = None
    mokutil: str | None = None
    cmdline: str | None = None
    udev_rules: tuple[tuple[str, str], ...] = ()  # (path, text)
    xorg: tuple[tuple[str, str], ...] = ()
    managers: dict[str, str | None] = field(
        default_factory=dict
    )  # marker path -> text (None: a dir)
    power_control: dict[str, str] = field(default_factory=dict)  # PCI address -> power/control
    nvidia_power: dict[str, str] = field(
        default_factory=dict
    )  # address -> /proc/driver/nvidia/gpus/*/power
    # the newest `egpu-setup verify` report (schema egpu-setup/verify/1) and where it was read
    verify_report: dict[str, Any] | None = None
    verify_report_path: str | None = None
    # (tool, seconds): diagnostic tools that hung while detect and collect ran them
    timed_out: tuple[tuple[str, float], ...] = ()
    # installed kernels and their NVIDIA modules (detect/kernels.py)
    kernels: KernelFacts | None = None
    # the driver hold (doctor/hold.py): dpkg's status file, egpu-setup's pin file, and whether
    # the manifest says egpu-setup wrote that pin
    dpkg_status: str | None = None
    driver_pin: str | None = None
    hold_recorded: bool = False
    rocminfo: str | None = None  # rocminfo's text (detect/rocm.py)
    # AMD's SMIs (detect/rocm.py): `amd-smi static` and `amd-smi metric`, else `rocm-smi` and
    # `rocm-smi --showmetrics`, the tools ROCm replaced by amd-smi
    amd_smi: tuple[str, ...] = ()
    rocm_smi: tuple[str, ...] = ()

    def sources(self) -> dict[str, bool]:
        """Which sources were available (shown with the findings so a clean result is honest)."""
        return {
            "dmesg": bool(self.dmesg) or self.dmesg_scan is not None,
            "lspci": bool(self.lspci),
            "nvidia-smi": bool(self.nvidia_smi),
            "boltctl": bool(self.boltctl),
            "udev-rules": bool(self.udev_rules),
            "xorg": bool(self.xorg),
            "rocminfo": bool(self.rocminfo),
            "amd-smi": bool(self.amd_smi),
            "rocm-smi": bool(self.rocm_smi),
        }
