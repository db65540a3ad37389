"""`egpu-setup doctor`: recognise known eGPU failure modes and say what to do.

    facts  = detect_host(host)                 # HostFacts
    inputs = collect(host, facts)              # raw text: dmesg, lspci, nvidia-smi, rule files...
    found  = diagnose(facts, inputs, torch)    # pure: tuple[Finding, ...], worst first

`collect` is the only part that touches the host (through its methods); `diagnose` is pure, so
every finding is tested by replaying real text through the same code path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from egpu_setup.detect.facts import HostFacts
from egpu_setup.doctor.catalog import BY_ID, ORDER, SCHEMA_FINDINGS, SEVERITIES
from egpu_setup.host.machine import Host

__all__ = ["SCHEMA_FINDINGS", "DoctorInput", "Finding", "collect", "diagnose", "report_json"]

log = logging.getLogger("egpu_setup.doctor")

MAX_EVIDENCE = 8

UDEV_DIRS = ("/etc/udev/rules.d", "/run/udev/rules.d", "/usr/lib/udev/rules.d", "/lib/udev/rules.d")
XORG_FILES = ("/etc/X11/xorg.conf",)
XORG_DIRS = ("/etc/X11/xorg.conf.d", "/usr/share/X11/xorg.conf.d")


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

    def sources(self) -> dict[str, bool]:
        """Which sources were available (shown with the findings so a clean result is honest)."""
        return {
            "dmesg": bool(self.dmesg),
            "lspci": bool(self.lspci),
            "nvidia-smi": bool(self.nvidia_smi),
            "boltctl": bool(self.boltctl),
            "udev-rules": bool(self.udev_rules),
            "xorg": bool(self.xorg),
        }


def _rule_files(host: Host, directory: str, suffix: str) -> list[tuple[str, str]]:
    out = []
    for path in host.glob(directory, f"*{suffix}"):
        text = host.read(path, limit=1024 * 1024)
        if text is not None:
            out.append((path, text))
    return out


def probe_manager_files(host: Host) -> dict[str, str | None]:
    """The marker files of other GPU managers that exist, with their text (None: a directory)."""
    from egpu_setup.doctor.rules import MANAGER_MARKERS

    managers: dict[str, str | None] = {}
    for marker in MANAGER_MARKERS:
        if marker.path in managers or not host.exists(marker.path):
            continue
        managers[marker.path] = (
            None if host.is_dir(marker.path) else host.read(marker.path, limit=65536)
        )
    return managers


def collect(host: Host, facts: HostFacts) -> DoctorInput:
    """Read every source doctor uses through the Host (soft: missing is None or empty)."""
    udev = [f for d in UDEV_DIRS for f in _rule_files(host, d, ".rules")]
    xorg = [(p, t) for p in XORG_FILES if (t := host.read(p)) is not None]
    xorg += [f for d in XORG_DIRS for f in _rule_files(host, d, ".conf")]
    managers = probe_manager_files(host)
    # Runtime PM of the eGPU and every bridge above it (the whole path must stay powered).
    power: dict[str, str] = {}
    nv_power: dict[str, str] = {}
    for gpu in facts.nvidia_gpus:
        if gpu.external is False:
            continue
        for address in (*gpu.bridges, gpu.pci_address):
            value = host.read_attr(f"/sys/bus/pci/devices/{address}/power/control")
            if value:
                power[address] = value
        text = host.read(f"/proc/driver/nvidia/gpus/{gpu.pci_address}/power", limit=4096)
        if text:
            nv_power[gpu.pci_address] = text
    dmesg = host.command("dmesg", ["dmesg"])
    if dmesg is not None and "read kernel buffer failed" in dmesg[:300]:
        # kernel.dmesg_restrict=1 (Debian/Ubuntu default): only root reads the kernel log.
        log.warning("cannot read the kernel log without root: run `sudo egpu-setup doctor`")
        dmesg = None
    return DoctorInput(
        dmesg=dmesg,
        lspci=host.command("lspci", ["lspci", "-vvnn"]),
        nvidia_smi=host.command("nvidia-smi", ["nvidia-smi"], timeout=20.0),
        boltctl=host.command("boltctl", ["boltctl", "list", "--all"]),
        mokutil=host.command("mokutil", ["mokutil", "--sb-state"]),
        cmdline=host.read_attr("/proc/cmdline"),
        udev_rules=tuple(udev),
        xorg=tuple(xorg),
        managers=managers,
        power_control=power,
        nvidia_power=nv_power,
    )


def diagnose(facts: HostFacts, inputs: DoctorInput, torch_info: Any = None) -> tuple[Finding, ...]:
    """Pure: every finding, errors first, then in catalog order."""
    from egpu_setup.doctor.checks import run_checks

    found = run_checks(facts, inputs, torch_info)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return tuple(sorted(found, key=lambda f: (rank[f.severity], ORDER[f.id])))


def report_json(findings: tuple[Finding, ...], inputs: DoctorInput | None = None) -> dict[str, Any]:
    """The `doctor --json` contract (DESIGN.md):
    {"schema", "findings": [{id, severity, summary, evidence, fix}]}, plus counts and sources."""
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    data: dict[str, Any] = {
        "schema": SCHEMA_FINDINGS,
        "findings": [f.to_json() for f in findings],
        "counts": counts,
        "ok": counts["error"] == 0,
    }
    if inputs is not None:
        data["sources"] = inputs.sources()
    return data
