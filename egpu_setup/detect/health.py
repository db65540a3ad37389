"""What the GPU does while people train: one nvidia-smi reading and the Xid lines since the last.

The sampler (`egpu-setup health sample`, run by egpu-setup-health.timer) asks nvidia-smi for
HEALTH_FIELDS in `--format=csv,noheader,nounits` (field names: `nvidia-smi --help-query-gpu`,
https://docs.nvidia.com/deploy/nvidia-smi/index.html). Drivers from R535 name the throttle mask
`clocks_event_reasons.active` and keep `clocks_throttle_reasons.active` as its alias, so the
older name is asked: both drivers answer it. The kernel log gives the Xid events
(https://docs.nvidia.com/deploy/xid-errors/): `dmesg` prints each line after the seconds since
boot ("[ 8123.456789] NVRM: Xid ..."), and only lines later than the last sample's are new.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from egpu_setup.detect.kernel_log import XID_RE
from egpu_setup.detect.nvidia import NVIDIA_SMI_TIMEOUT_S
from egpu_setup.detect.nvidia_smi import parse_nvidia_smi
from egpu_setup.host.machine import Host

HEALTH_FIELDS = (
    "pci.bus_id",
    "temperature.gpu",
    "power.draw",
    "clocks_throttle_reasons.active",
    "pcie.link.gen.current",
    "pcie.link.width.current",
)
HEALTH_QUERY = (
    "nvidia-smi",
    "--query-gpu=" + ",".join(HEALTH_FIELDS),
    "--format=csv,noheader,nounits",
)

# Reasons that slow a job down. Idle, application clocks, sync boost and display clocks are
# settings or an idle GPU, not throttling (nvml.h, nvmlClocksEventReason*).
THROTTLING = frozenset(
    {
        "SW Power Cap",
        "HW Slowdown",
        "SW Thermal Slowdown",
        "HW Thermal Slowdown",
        "HW Power Brake Slowdown",
    }
)

# a CSV header names a field ("temperature.gpu", "power.draw [W]"); a reading holds none
_HEADER_RE = re.compile(r"(?:^|,)\s*(?:temperature\.gpu|power\.draw|pci\.bus_id)\b")
# "[ 8123.456789] NVRM: Xid (PCI:0000:3c:00): 79, ..." (the time dmesg prints, printk.time=1)
_STAMP_RE = re.compile(r"^\s*(?:<\d+>)?\[\s*(?P<t>\d+\.\d+)\]")


@dataclass(frozen=True)
class GpuReading:
    """One GPU in one sample; None where nvidia-smi printed [N/A] or nothing."""

    pci_bus_id: str | None
    temperature_c: float | None
    power_w: float | None
    throttle: tuple[str, ...]  # the active reasons that slow the GPU (THROTTLING)
    link_gen: int | None
    link_width: int | None


@dataclass(frozen=True)
class XidEvent:
    """One Xid line: the GPU's PCI address as NVRM prints it, the code, the kernel time."""

    address: str  # "0000:3c:00"
    code: int
    uptime_s: float | None  # seconds since boot, None where dmesg printed no time
    line: str


@dataclass(frozen=True)
class HealthProbe:
    """One sample of the machine: the GPUs nvidia-smi read, and the kernel log's Xid lines.

    `absent`: nvidia-smi found no GPU or no driver (the eGPU is unplugged): nothing to record.
    """

    readings: tuple[GpuReading, ...]
    xids: tuple[XidEvent, ...]
    absent: bool
    error: str | None = None


def parse_health_csv(text: str) -> tuple[GpuReading, ...]:
    """The readings of `nvidia-smi --query-gpu=HEALTH_FIELDS --format=csv,noheader,nounits`,
    or of a `--query-gpu` CSV whose header names its columns (a recording, a paste)."""
    headed = any(_HEADER_RE.search(line) for line in text.splitlines()[:3])
    report = parse_nvidia_smi(text, None if headed else HEALTH_FIELDS)
    return tuple(
        GpuReading(
            pci_bus_id=g.pci_bus_id,
            temperature_c=g.temperature_c,
            power_w=g.power_draw_w,
            throttle=tuple(r for r in g.throttle_reasons if r in THROTTLING),
            link_gen=g.link_gen_current,
            link_width=g.link_width_current,
        )
        for g in report.gpus
    )


def parse_xids(text: str) -> tuple[XidEvent, ...]:
    """Every Xid line of a kernel log, in order, with the time dmesg printed before it."""
    out = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if m is None:
            continue
        stamp = _STAMP_RE.match(line)
        out.append(
            XidEvent(
                address=m["addr"].lower(),
                code=int(m["code"]),
                uptime_s=float(stamp["t"]) if stamp else None,
                line=line.strip(),
            )
        )
    return tuple(out)


def probe_health(host: Host) -> HealthProbe:
    """Read nvidia-smi and the kernel log once (through the host gateway)."""
    text = host.command("nvidia-smi", list(HEALTH_QUERY), timeout=NVIDIA_SMI_TIMEOUT_S)
    report = parse_nvidia_smi(text or "", HEALTH_FIELDS)
    readings = parse_health_csv(text or "") if report.error is None else ()
    log = host.command("dmesg", ["dmesg"]) or ""
    absent = not readings and report.error_kind in (None, "no-devices", "driver-not-loaded")
    return HealthProbe(readings, parse_xids(log), absent=absent, error=report.error)
