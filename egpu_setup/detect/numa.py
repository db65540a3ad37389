"""NUMA: the nodes this machine has and the node each GPU is attached to, from sysfs.

/sys/devices/system/node/online lists the online nodes as a range list ("0", "0-1");
/sys/bus/pci/devices/<addr>/numa_node is "the NUMA node to which the PCI device is attached, or
-1 if the node is unknown", set from ACPI _PXM (Documentation/ABI/testing/sysfs-bus-pci,
https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci). A laptop has one node and
its devices say -1, so the node count, not numa_node, tells a multi-node machine.
"""

from __future__ import annotations

import re
from dataclasses import replace

from egpu_setup.detect.facts import Gpu
from egpu_setup.host.machine import Host

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_MAX_NODES = 1024  # the kernel's MAX_NUMNODES is at most 1 << 10 (NODES_SHIFT <= 10)


def parse_node_list(text: str | None) -> tuple[int, ...]:
    """ "0-1,3" -> (0, 1, 3); () for a missing, empty or malformed list (soft)."""
    nodes: list[int] = []
    for part in (text or "").strip().split(","):
        m = _RANGE.match(part.strip())
        if not m:
            return ()
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) else low
        if high < low or high >= _MAX_NODES:
            return ()
        nodes.extend(range(low, high + 1))
    return tuple(sorted(set(nodes)))


def parse_numa_node(text: str | None) -> int | None:
    """A numa_node attribute: the node, or None for -1, empty or garbage."""
    value = (text or "").strip()
    if not re.fullmatch(r"-?\d+", value):
        return None
    node = int(value)
    return node if 0 <= node < _MAX_NODES else None


def probe_numa_nodes(host: Host) -> tuple[int, ...]:
    return parse_node_list(host.read_attr("/sys/devices/system/node/online"))


def with_numa_nodes(host: Host, gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """Each GPU with the node sysfs gives it (a GPU known from text alone keeps None)."""
    return tuple(
        replace(
            g,
            numa_node=parse_numa_node(
                host.read_attr(f"/sys/bus/pci/devices/{g.pci_address}/numa_node")
            ),
        )
        for g in gpus
    )
