"""Configuration files other tools (or people) left behind: udev rules, Xorg BusIDs, GPU managers.

All pure: each function takes (path, text) pairs that doctor read through the Host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# -- udev: a rule that authorizes every Thunderbolt device -----------------------------------------

_KEY_RE = re.compile(
    r'(?P<key>[A-Z_]+(?:\{[^}]*\})?)\s*(?P<op>==|!=|\+=|-=|:=|=)\s*"(?P<value>[^"]*)"'
)


@dataclass(frozen=True)
class RuleLine:
    path: str
    line: int  # first physical line of the (possibly continued) rule
    text: str


def udev_rules(path: str, text: str) -> Iterable[RuleLine]:
    """The rules of a .rules file, continuation lines (`\\`) joined, comments dropped."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending:
            start = number
            if not line or line.startswith("#"):
                continue
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        yield RuleLine(path, start, " ".join(p.strip() for p in pending))
        pending = []
    if pending:
        yield RuleLine(path, start, " ".join(p.strip() for p in pending))


def is_blanket_authorize(rule: str) -> bool:
    """True for a rule that authorizes Thunderbolt devices without checking which one.

    The kernel documentation's example (`ACTION=="add", SUBSYSTEM=="thunderbolt",
    ATTR{authorized}=="0", ATTR{authorized}="1"`) and its RUN+="... echo 1 > .../authorized"
    variant both qualify. A rule that matches one `unique_id`, or only acts while the domain has
    IOMMU DMA protection, is targeted and does not (Linux admin-guide/thunderbolt.rst).
    """
    pairs = [(m["key"], m["op"], m["value"]) for m in _KEY_RE.finditer(rule)]
    if not pairs:
        return False
    writes_auth = any(
        k == "ATTR{authorized}" and op == "=" and v.strip() in ("1", "2") for k, op, v in pairs
    )
    runs_auth = any(
        k == "RUN" and re.search(r"echo\s+['\"]?[12]['\"]?\s*>\s*\S*authorized", v)
        for k, _, v in pairs
    )
    if not (writes_auth or runs_auth):
        return False
    subsystem = [v for k, op, v in pairs if k == "SUBSYSTEM" and op == "=="]
    if subsystem and not any("thunderbolt" in v for v in subsystem):
        return False
    targeted = any(
        (k in ("ATTR{unique_id}", "ATTRS{unique_id}") and op == "==")
        or (
            k in ("ATTR{iommu_dma_protection}", "ATTRS{iommu_dma_protection}")
            and op == "=="
            and v == "1"
        )
        or (k in ("ATTR{vendor}", "ATTRS{vendor}", "ATTR{device}", "ATTRS{device}") and op == "==")
        for k, op, v in pairs
    )
    return not targeted


def blanket_rules(files: Iterable[tuple[str, str]]) -> list[RuleLine]:
    return [
        r for path, text in files for r in udev_rules(path, text) if is_blanket_authorize(r.text)
    ]


# -- Xorg BusID ------------------------------------------------------------------------------------

_BUSID_LINE_RE = re.compile(r'^\s*BusID\s+"(?P<value>[^"]*)"', re.IGNORECASE)
# Xorg's form: PCI:bus:device:function, decimal, or PCI:bus@domain:device:function
# (NVIDIA README FAQ "What is the format of a PCI Bus ID?").
_VALID_BUSID_RE = re.compile(
    r"^PCI:(?P<bus>\d{1,3})(?:@(?P<domain>\d{1,5}))?:(?P<dev>\d{1,2}):(?P<fn>\d)$"
)


@dataclass(frozen=True)
class BusId:
    path: str
    line: int
    raw: str  # the whole line, stripped
    value: str
    valid: bool
    address: str | None  # "0000:3c:00.0" when valid
    problem: str | None


def parse_busid(value: str) -> tuple[str | None, str | None]:
    """(canonical PCI address, None) for a valid Xorg BusID, else (None, what is wrong)."""
    m = _VALID_BUSID_RE.match(value.strip())
    if m:
        bus, dev, fn = int(m["bus"]), int(m["dev"]), int(m["fn"])
        domain = int(m["domain"] or 0)
        if bus > 255 or dev > 31 or fn > 7:
            return None, "bus must be 0-255, device 0-31 and function 0-7"
        return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}", None
    v = value.strip()
    if not v.upper().startswith("PCI:"):
        return None, "it lacks the PCI: prefix"
    body = v[4:]
    if re.search(r"[a-fA-F]", body.split("@")[0]):
        return None, "it is hexadecimal; Xorg reads decimal numbers"
    if "." in body:
        return None, "it uses lspci's bus:device.function form; Xorg wants colons"
    if body.count(":") == 3:
        return (
            None,
            "it includes the domain as a fourth field; write PCI:bus@domain:device:function",
        )
    return None, "it is not of the form PCI:bus:device:function"


def xorg_busids(files: Iterable[tuple[str, str]]) -> list[BusId]:
    out = []
    for path, text in files:
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.split("#", 1)[0]
            m = _BUSID_LINE_RE.match(stripped)
            if not m:
                continue
            address, problem = parse_busid(m["value"])
            out.append(
                BusId(path, number, line.strip(), m["value"], address is not None, address, problem)
            )
    return out


def busid_for(address: str) -> str:
    """The Xorg BusID of a PCI address: '0000:3c:00.0' -> 'PCI:60:0:0' (decimal)."""
    domain, bus, rest = address.split(":")
    dev, fn = rest.split(".")
    dom = int(domain, 16)
    head = f"PCI:{int(bus, 16)}" + (f"@{dom}" if dom else "")
    return f"{head}:{int(dev, 16)}:{int(fn, 16)}"


# -- Competing GPU managers ----------------------------------------------------------------------


@dataclass(frozen=True)
class ManagerMarker:
    tool: str
    path: str
    marker: str | None  # text the file must contain (a generic path), else presence is enough
    disables_nvidia: bool  # this file, when present, stops the NVIDIA driver or removes the GPU
    source: str


# Paths as each tool writes them (read from their sources; docs/sources.md, "Prior eGPU tools").
MANAGER_MARKERS: tuple[ManagerMarker, ...] = (
    ManagerMarker(
        "envycontrol",
        "/etc/modprobe.d/blacklist-nvidia.conf",
        "EnvyControl",
        True,
        "bayasdev/envycontrol envycontrol.py BLACKLIST_PATH (integrated mode)",
    ),
    ManagerMarker(
        "envycontrol",
        "/lib/udev/rules.d/50-remove-nvidia.rules",
        "EnvyControl",
        True,
        "bayasdev/envycontrol UDEV_PATH: removes every 10de display function on add",
    ),
    ManagerMarker(
        "envycontrol",
        "/etc/X11/xorg.conf.d/90-nvidia.conf",
        "EnvyControl",
        False,
        "bayasdev/envycontrol XORG_PATH (nvidia mode)",
    ),
    ManagerMarker(
        "envycontrol",
        "/etc/X11/xorg.conf",
        "EnvyControl",
        False,
        "bayasdev/envycontrol (nvidia mode overwrites xorg.conf)",
    ),
    ManagerMarker(
        "envycontrol",
        "/var/cache/envycontrol/cache.json",
        None,
        False,
        "envycontrol caches the NVIDIA BusID here",
    ),
    ManagerMarker(
        "optimus-manager",
        "/etc/optimus-manager/optimus-manager.conf",
        None,
        False,
        "Askannz/optimus-manager",
    ),
    ManagerMarker(
        "optimus-manager",
        "/etc/X11/xorg.conf.d/10-optimus-manager.conf",
        None,
        False,
        "Askannz/optimus-manager (regenerated before X starts)",
    ),
    ManagerMarker(
        "optimus-manager",
        "/usr/lib/systemd/system/optimus-manager.service",
        None,
        False,
        "Askannz/optimus-manager",
    ),
    ManagerMarker(
        "egpu-switcher", "/etc/egpu-switcher/config.yaml", None, False, "hertg/egpu-switcher"
    ),
    ManagerMarker(
        "egpu-switcher",
        "/etc/X11/xorg.conf.d/99-egpu-switcher.conf",
        None,
        False,
        "hertg/egpu-switcher (Xorg snippet written at boot)",
    ),
    ManagerMarker(
        "egpu-switcher",
        "/etc/systemd/system/egpu.service",
        "egpu-switcher",
        False,
        "hertg/egpu-switcher internal/service/systemd.go",
    ),
    ManagerMarker(
        "all-ways-egpu", "/usr/bin/all-ways-egpu", None, False, "ewagner12/all-ways-egpu Makefile"
    ),
    ManagerMarker(
        "all-ways-egpu",
        "/etc/all-ways-egpu",
        None,
        False,
        "ewagner12/all-ways-egpu install.sh CONFDIR",
    ),
    ManagerMarker(
        "all-ways-egpu", "/usr/share/all-ways-egpu", None, False, "ewagner12/all-ways-egpu Makefile"
    ),
    ManagerMarker(
        "gpu-manager",
        "/usr/share/X11/xorg.conf.d/11-nvidia-prime.conf",
        None,
        False,
        "canonical/ubuntu-drivers-common gpu-manager.c create_prime_outputclass; #34",
    ),
    ManagerMarker(
        "gpu-manager",
        "/var/lib/ubuntu-drivers-common/last_gfx_boot",
        None,
        False,
        "canonical/ubuntu-drivers-common gpu-manager",
    ),
    ManagerMarker("prime-select", "/etc/prime-discrete", None, False, "canonical/nvidia-prime"),
    ManagerMarker(
        "prime-select",
        "/lib/modprobe.d/blacklist-nvidia.conf",
        None,
        True,
        "canonical/nvidia-prime (prime-select intel blacklists the NVIDIA modules)",
    ),
    ManagerMarker(
        "system76-power",
        "/etc/modprobe.d/system76-power.conf",
        None,
        False,
        "pop-os/system76-power (graphics modes)",
    ),
)


@dataclass(frozen=True)
class ManagerHit:
    tool: str
    path: str
    detail: str
    disables_nvidia: bool


def competing_managers(present: dict[str, str | None]) -> list[ManagerHit]:
    """Markers found. `present` maps each marker path that exists to its text (None: a directory
    or unreadable). A prime-discrete of `off` and system76-power's integrated mode disable
    NVIDIA."""
    hits = []
    for m in MANAGER_MARKERS:
        if m.path not in present:
            continue
        text = present[m.path]
        if m.marker is not None and (text is None or m.marker not in text):
            continue
        disables = m.disables_nvidia
        detail = "present"
        if m.path == "/etc/prime-discrete" and text is not None:
            mode = text.strip()
            detail = f"mode {mode!r}"
            disables = mode == "off"  # prime-select intel writes off (nvidia-prime)
        elif m.path == "/etc/modprobe.d/system76-power.conf" and text is not None:
            disables = bool(re.search(r"^\s*blacklist\s+nvidia\s*$", text, re.MULTILINE))
            detail = "blacklists nvidia (integrated mode)" if disables else "present"
        elif disables:
            detail = "blacklists or removes the NVIDIA GPU"
        hits.append(ManagerHit(m.tool, m.path, detail, disables))
    return hits
