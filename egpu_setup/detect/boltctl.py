"""Parse `boltctl list` / `boltctl list -a` / `boltctl info` text.

bolt prints one tree per device (boltctl-common.c print_device):

     ● Razer Core X
       ├─ type:          peripheral
       ├─ generation:    Thunderbolt 3          (bolt 0.9+)
       ├─ status:        authorized
       │  ├─ domain:     ...
       │  ├─ rx speed:   40 Gb/s = 2 lanes * 20 Gb/s   (bolt 0.9+)
       │  └─ authflags:  none
       └─ stored:        Fri 29 Nov 2024 09:13:01 AM UTC
          ├─ policy:     iommu
          └─ key:        no

The bullet line is bolt's label: "vendor name" (plus " #2" for a second device of that name) unless
the user set one; the `name:` line is the device's own name (sysfs device_name), which is what
`name` holds here. Bullets: ● connected, ○ not connected (⦁ / • in some fonts), "*" in bolt 0.1,
whose listing also has no name:/generation: lines. With a non-UTF-8 locale the glyphs are ASCII
("*", "|-", "`-", "| "); colours are ANSI escapes. All are stripped, as are markdown backticks
around each line and a poster's "[...]" elisions; text whose tree characters were lost in a paste
is read the same way. Dates are left as printed (any locale): only "stored: no" is interpreted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["BoltDevice", "parse_boltctl_list"]


@dataclass(frozen=True)
class BoltDevice:
    """One Thunderbolt/USB4 device as boltctl printed it. Unknown fields are None."""

    name: str | None = None  # the name: line ("Core X"); bolt 0.1: the bullet minus the vendor
    vendor: str | None = None
    type: str | None = None  # "peripheral" / "host" / "unknown"
    generation: int | None = None  # 3 for "Thunderbolt 3", 4 for "USB4"
    generation_name: str | None = None  # as printed: "Thunderbolt 3", "USB4"
    label: str | None = None  # the bullet line: "Razer Core X" (vendor + name, or the user's label)
    uuid: str | None = None
    status: str | None = None  # "authorized", "connected", "disconnected", "auth-error", ...
    authorized: bool | None = None
    stored: bool | None = None
    policy: str | None = None  # "iommu" / "auto" / "manual" / "default"
    key: str | None = None  # "no" / "new" / "have"
    domain: str | None = None
    rx_speed_gbps: float | None = None
    tx_speed_gbps: float | None = None
    rx_lanes: int | None = None
    tx_lanes: int | None = None


_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Tree glyphs in UTF-8 and ASCII (bolt-term.c glyph tables) plus the bullet.
_BULLETS = "●○⦁•◦*"
_TREE_CHARS = "│├└─|`- \t" + _BULLETS
_KEY_RE = re.compile(r"^(?P<key>[a-z][a-z ]*?):\s*(?P<value>.*)$")
_SPEED_RE = re.compile(
    r"^(?P<total>[0-9.]+)\s*Gb/s(?:\s*=\s*(?P<lanes>[0-9]+)\s*lanes?\s*\*\s*[0-9.]+\s*Gb/s)?"
)
_KNOWN_KEYS = frozenset(
    {
        "type",
        "name",
        "vendor",
        "uuid",
        "dbus path",
        "generation",
        "status",
        "domain",
        "parent",
        "syspath",
        "rx speed",
        "tx speed",
        "authflags",
        "authorized",
        "connected",
        "disconnected",
        "stored",
        "policy",
        "key",
        "label",
    }
)
# Statuses that mean the PCIe tunnels are up (bolt-enums.h BoltStatus).
_AUTHORIZED_STATUSES = frozenset(
    {"authorized", "authorized-secure", "authorized-newkey", "authorized-dponly"}
)
# A device not plugged in is neither authorized nor refused now: whether it would be is unknown
# ("authorized:" then only dates the last time).
_ABSENT_STATUSES = frozenset({"disconnected", "unknown"})


def _generation(value: str) -> int | None:
    m = re.search(r"(?:Thunderbolt|USB)\s*([0-9]+)", value, re.I)
    return int(m.group(1)) if m else None


def _speed(value: str) -> tuple[float | None, int | None]:
    m = _SPEED_RE.match(value.strip())
    if m is None:
        return None, None
    lanes = int(m.group("lanes")) if m.group("lanes") else None
    return float(m.group("total")), lanes


class _Builder:
    def __init__(self, label: str) -> None:
        self.label = label
        self.fields: dict[str, object] = {}

    def build(self) -> BoltDevice | None:
        if not self.fields:  # a stray line, not a device
            return None
        fields = dict(self.fields)
        if "name" not in fields:
            # bolt 0.1 printed no name: line; its bullet was the name, later ones "vendor name".
            vendor = str(fields.get("vendor") or "")
            label = self.label
            fields["name"] = (
                label[len(vendor) + 1 :]
                if vendor and label.startswith(vendor + " ")
                else (label if vendor else None)
            )
        return BoltDevice(label=self.label or None, **fields)  # type: ignore[arg-type]


def _apply(b: _Builder, key: str, value: str) -> None:
    value = value.strip()
    f = b.fields
    if key in ("type", "vendor", "uuid", "domain", "policy", "key") and value:
        f.setdefault(key, value)
    elif key == "name" and value:
        f.setdefault("name", value)
    elif key == "generation":
        f.setdefault("generation", _generation(value))
        f.setdefault("generation_name", value or None)
    elif key == "status" and value:
        f.setdefault("status", value)
        status = value.lower()
        f.setdefault(
            "authorized", None if status in _ABSENT_STATUSES else status in _AUTHORIZED_STATUSES
        )
    elif key == "stored":
        f.setdefault("stored", bool(value) and value.lower() != "no")
    elif key in ("rx speed", "tx speed"):
        speed, lanes = _speed(value)
        side = key[:2]
        f.setdefault(f"{side}_speed_gbps", speed)
        f.setdefault(f"{side}_lanes", lanes)


def parse_boltctl_list(text: str) -> tuple[BoltDevice, ...]:
    """Every device in `boltctl list [-a]` text (old 0.5-0.8 and new 0.9 layouts)."""
    if not isinstance(text, str):
        return ()
    devices: list[BoltDevice] = []
    current: _Builder | None = None

    def flush() -> None:
        nonlocal current
        if current is not None and (dev := current.build()) is not None:
            devices.append(dev)
        current = None

    for raw in text.splitlines():
        line = _ANSI_RE.sub("", raw).replace("\x00", "").rstrip()
        if line.startswith("`"):
            line = line[1:]
        line = line.removesuffix("`")
        if not line.strip() or line.strip() in ("[...]", "...", "[…]", "…"):
            continue  # a poster's elision: the device goes on below it
        body = line.lstrip(_TREE_CHARS)
        prefix = line[: len(line) - len(body)]
        km = _KEY_RE.match(body)
        if km and km.group("key") in _KNOWN_KEYS and current is not None:
            _apply(current, km.group("key"), km.group("value"))
            continue
        bullet = any(b in prefix for b in _BULLETS)
        unindented = not prefix.strip(" \t") and len(prefix) <= 2
        if bullet or (unindented and km is None):
            # "● Razer Core X" (or the name alone when the bullet was lost in a paste).
            flush()
            current = _Builder(body.strip())
            continue
        if km is None:
            flush()
    flush()
    return tuple(devices)
