"""amdgpu's kernel-log lines of a GPU in trouble: hung rings and resets, a failed init, the SMU.

Pure. doctor/dmesg.py finds the records by the fixed substrings below (NEEDLES, found with
str.find as its other signatures are); `classify` says what each record is. The message formats
are the kernel's (drivers/gpu/drm/amd/amdgpu/: amdgpu_job.c "ring %s timeout, signaled seq=%u,
emitted seq=%u", amdgpu_device.c "GPU reset begin!", "GPU reset succeeded, trying to resume",
"Fatal error during GPU init", amdgpu_cs.c "Failed to initialize parser %d!", pm/swsmu
smu_cmn.c "SMU: I'm not done with your previous command", "SMU: No response msg_reg"), as
users pasted them (tests/data/real/kernel-log/amdgpu-*.txt): old kernels prefix
`[drm:amdgpu_job_timedout [amdgpu]] *ERROR*`, newer ones `amdgpu 0000:03:00.0: amdgpu:`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# (kind, needle): each needle a fixed substring of one message format.
NEEDLES: tuple[tuple[str, str], ...] = (
    ("ring-timeout", "timeout, signaled seq="),
    ("reset-begin", "GPU reset begin!"),
    ("reset-done", "reset succeeded"),  # "GPU reset succeeded", "Ring comp_1.1.0 reset succeeded"
    ("reset-done", "recovered through reset"),  # "[drm] device wedged, but recovered through reset"
    ("reset-failed", "reset failed"),  # "Ring gfx_0.0.0 reset failed" (a full reset follows)
    ("parser", "Failed to initialize parser"),
    ("init-failed", "Fatal error during GPU init"),
    ("firmware", "Failed to load firmware"),
    ("firmware", "Direct firmware load for amdgpu/"),
    ("smu", "SMU: I'm not done with your previous command"),
    ("smu", "SMU: No response"),
    ("smu-init", "Failed to setup smc hw"),
    ("smu-init", "IP block <smu> failed"),
)
_ADDR = re.compile(r"\b(?P<addr>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\b", re.I)
_RING = re.compile(r"ring (?P<ring>[\w.]+) timeout")
_PARSER = re.compile(r"Failed to initialize parser (?P<err>-?\d+)")
_FIRMWARE = re.compile(r'(?:firmware "|firmware load for )(?P<file>amdgpu/[\w.-]+)')


@dataclass(frozen=True)
class AmdgpuEvent:
    kind: str  # a NEEDLES kind
    address: str | None  # "0000:28:00.0" where the line names the device
    detail: str | None  # the ring ("gfx_0.0.0"), the parser's error ("-125"), the firmware file
    lines: tuple[str, ...]  # as printed (evidence)
    offset: int  # where it starts in the log


def classify(message: str, lines: tuple[str, ...], offset: int) -> AmdgpuEvent | None:
    """The event one kernel message (prefix stripped) is, or None when it is none of them."""
    kind = next((k for k, needle in NEEDLES if needle in message), None)
    if kind is None:
        return None
    m = _ADDR.search(message)
    detail = None
    if kind == "ring-timeout" and (r := _RING.search(message)):
        detail = r["ring"]
    elif kind == "parser" and (p := _PARSER.search(message)):
        detail = p["err"]
    elif kind == "firmware" and (f := _FIRMWARE.search(message)):
        detail = f["file"]
    return AmdgpuEvent(kind, m["addr"].lower() if m else None, detail, lines, offset)


@dataclass(frozen=True)
class AmdgpuTrouble:
    """What a kernel log's amdgpu events add up to."""

    hangs: tuple[AmdgpuEvent, ...]  # ring timeouts, resets begun, jobs refused after a reset
    recovered: bool  # the last hang was followed by a reset that succeeded
    init_failed: tuple[AmdgpuEvent, ...]  # "Fatal error during GPU init" and missing firmware
    missing_firmware: tuple[str, ...]  # "amdgpu/vega20_rlc.bin"
    smu: tuple[AmdgpuEvent, ...]  # the SMU (power management firmware) not answering
    smu_init_failed: bool


def summarize(events: Iterable[AmdgpuEvent]) -> AmdgpuTrouble:
    """Pure: the events (any order) as the troubles doctor reports."""
    ordered = sorted(events, key=lambda e: e.offset)
    hangs = [e for e in ordered if e.kind in ("ring-timeout", "reset-begin", "parser")]
    last_hang = max((e.offset for e in hangs), default=-1)
    # jobs refused with -ECANCELED (-125) come after a reset lost their context: those after the
    # last reset that succeeded mean the program never recovered
    recovered = any(e.kind == "reset-done" and e.offset > last_hang for e in ordered)
    resets = [e for e in ordered if e.kind in ("reset-done", "reset-failed")]
    firmware = [e for e in ordered if e.kind == "firmware"]
    init = [e for e in ordered if e.kind == "init-failed"]
    return AmdgpuTrouble(
        hangs=tuple(sorted((*hangs, *resets), key=lambda e: e.offset)) if hangs else (),
        recovered=recovered,
        init_failed=tuple(sorted((*firmware, *init), key=lambda e: e.offset)) if init else (),
        missing_firmware=tuple(dict.fromkeys(e.detail for e in firmware if e.detail)),
        smu=tuple(e for e in ordered if e.kind in ("smu", "smu-init")),
        smu_init_failed=any(e.kind == "smu-init" for e in ordered),
    )
