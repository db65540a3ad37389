"""`lspci -t` and `lspci -tv` trees as people paste them: each device, its bus, its bridges.

lspci draws the tree in ls-tree.c (pciutils): a root bus opens with `[DDDD:BB]`, a device is
`DD.F`, a bridge is followed by its secondary bus range `-[BB]` or `-[BB-SS]`, and the devices
behind it continue on the same line after `--` / `-+-`, then below it in the same column. With
`-v` the device's name follows the last device of a line after two spaces. So a device's bus is
known from the column it is drawn in: the bus that was opened for that column most recently.

Names come as "<vendor> <device>" without ids (no -n): the vendor is split off as plain lspci
output is (detect/lspci.py). Pure: text in, devices out; no line it cannot read stops it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# A root bus "[0000:00]" or a device "1c.0" with, for a bridge, its bus range "-[01]" / "-[04-10]".
_TOKEN_RE = re.compile(
    r"\[(?P<dom>[0-9a-fA-F]{4}):(?P<root>[0-9a-fA-F]{2})\]"
    r"|(?P<dev>[0-9a-fA-F]{2}\.[0-7])(?:-\[(?P<sec>[0-9a-fA-F]{2})(?:-[0-9a-fA-F]{2})?\])?"
)
# What a tree line is drawn with before its first token; anything else is not a tree line.
_DRAWING = frozenset(" |+-\\`>")  # ">": a paste quoted in a mail or a forum
_NAME_RE = re.compile(r"\s{2}(?P<name>\S.*?)\s*$")


@dataclass(frozen=True)
class TreeDevice:
    """One device of the tree: `bridges` are the upstream bridges' addresses, root port first."""

    address: str  # "0000:01:00.0"
    vendor_name: str | None
    device_name: str | None
    bridges: tuple[str, ...]
    is_bridge: bool


def looks_like_tree(text: str) -> bool:
    """True when the text holds an lspci tree root ("-[0000:00]-" or "+-[0000:20]-")."""
    return re.search(r"(?:^|[\s|+\\-])-?\[[0-9a-fA-F]{4}:[0-9a-fA-F]{2}\]-", text, re.M) is not None


def parse_lspci_tree(text: str) -> tuple[TreeDevice, ...]:
    from egpu_setup.detect.lspci import _split_vendor_device

    bus_at: dict[int, tuple[str, str]] = {}  # column -> (domain, bus) of devices drawn there
    parent: dict[tuple[str, str], str] = {}  # (domain, bus) -> the bridge that opens it
    found: dict[str, dict[str, Any]] = {}
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        tokens = list(_TOKEN_RE.finditer(line))
        if not tokens or not set(line[: tokens[0].start()]) <= _DRAWING:
            continue
        here: tuple[str, str] | None = None  # the bus that the next device on this line is on
        last: str | None = None
        for t in tokens:
            if t["root"] is not None:
                here = (t["dom"].lower(), t["root"].lower())
                continue
            column = t.start()
            bus = here if here is not None else bus_at.get(column)
            if bus is None:
                continue  # a fragment whose bus was cut off: nothing to place it on
            bus_at[column] = bus
            address = f"{bus[0]}:{bus[1]}:{t['dev'].lower()}"
            found.setdefault(
                address, {"bus": bus, "bridge": False, "name": None, "order": len(found)}
            )
            last = address
            if t["sec"] is not None:
                found[address]["bridge"] = True
                here = (bus[0], t["sec"].lower())
                parent.setdefault(here, address)
            else:
                here = None
        tail = _NAME_RE.match(line[tokens[-1].end() :])
        if last is not None and tail and not tokens[-1]["sec"]:
            found[last]["name"] = tail["name"]
    out = []
    for address, d in sorted(found.items(), key=lambda kv: kv[1]["order"]):
        chain: list[str] = []
        bus = d["bus"]
        while bus in parent and len(chain) < 32:
            chain.append(parent[bus])
            bus = found[parent[bus]]["bus"]
        vendor, device = _split_vendor_device(d["name"]) if d["name"] else (None, None)
        out.append(TreeDevice(address, vendor, device, tuple(reversed(chain)), d["bridge"]))
    return tuple(out)
