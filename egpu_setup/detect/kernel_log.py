"""The kernel log of a recording, as detection reads it: whole when small, its NVRM lines when big.

A bundle without sysfs (a pasted bug report) names its GPUs and driver only in text, and detection
reads the kernel log for two things there: the driver's load line ("NVRM: loading NVIDIA UNIX ...
Kernel Module 550.54.14", the last one wins) and the GPUs the driver names ("NVRM: The NVIDIA GPU
0000:01:00.0 (PCI ID: 10de:1b80)"). Both are NVIDIA driver messages, which all carry "NVRM". A
log up to SMALL is read whole, as any other command text; a bigger one (days of uptime, a whole
journal) is streamed and only its NVRM lines are kept: the first HEAD_CHARS of them (the boot,
where the GPUs are named) and the newest TAIL_LINES (the last load), so memory stays flat.
"""

from __future__ import annotations

import re
from collections import deque

from egpu_setup.host.machine import Host

# "NVRM: Xid (PCI:0000:01:00): 79, pid=..., GPU has fallen off the bus." (NVIDIA's Xid catalog:
# https://docs.nvidia.com/deploy/xid-errors/); "caused by previous Xid 149" is not an Xid line.
XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<addr>[0-9a-fA-F:.]+)\): (?P<code>\d+)\b")

SMALL = 1024 * 1024  # bytes: a log this size is read whole
HEAD_CHARS = 256 * 1024  # of a big log's first NVRM lines
TAIL_LINES = 500  # of its newest NVRM lines


def recorded_kernel_log(host: Host) -> str | None:
    """The kernel log text detection reads (commands/dmesg.txt of a recording); None if absent."""
    lines = host.command_lines("dmesg", ["dmesg"])
    if lines is None:
        return None
    if lines.size <= SMALL:
        return host.command("dmesg", ["dmesg"])
    head: list[str] = []
    chars = 0
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    for line in lines:
        if "NVRM" not in line:
            continue
        if chars < HEAD_CHARS:
            head.append(line)
            chars += len(line)
        else:
            tail.append(line)
    return "".join(head) + "".join(tail)
