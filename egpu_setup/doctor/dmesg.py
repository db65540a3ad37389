"""Kernel-log signatures of eGPU failures, found fast in big logs.

Sources: docs/sources.md, "PCI and hot-plug".

The log can be megabytes (a long uptime, a pasted journal), so nothing walks it line by line in
Python: each signature is a fixed substring found with str.find (C speed), and only the few
lines around a hit are parsed with regular expressions. A hit's "record" is its line plus the
continuation lines the kernel printed with it (dmesg and journalctl indent those; syslog joins
them with #012), which is where NVRM puts the versions and the PCI address.

Accepted prefixes: `[  12.345678] `, `dmesg -T` `[Mon Nov 25 10:12:01 2024] `, `dmesg -H`
`[  +0.032954] `, `<3>`, `dmesg -x` `kern  :err   : `, journalctl/syslog
`Nov 25 10:12:01 host kernel: ` in any locale's month ("kwi 15", "gen 12") and without the host or
the date, ISO timestamps, and a timestamp a paste cut short (`357.664468] `). Markdown around a
pasted line (backticks, `**bold**`, `>` and `+>` quote marks) is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

# Evidence is capped: a flapping link can print the same line thousands of times.
MAX_HITS = 200

_PREFIX_RE = re.compile(
    r"^(?:"
    r"[`*+> ]*(?:`|\*\*|>)[`*+> ]*"  # markdown a paste added: `code`, **bold**, > / +> quotes
    r"|<\d+>"  # raw printk level
    r"|[a-z]+\s*:[a-z]+\s*:\s?"  # dmesg -x: "kern  :err   : "
    r"|\[\s*\+?\d+\.\d+\]\s?"  # [   12.345678], dmesg -H [  +0.032954]
    r"|\d+\.\d{6}\]\s"  # a timestamp whose "[   " a paste cut off
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d [\d:]{8} \d{4}\]\s?"  # dmesg -T
    # syslog / journalctl: "Nov 25 10:12:01 host kernel: ", any locale's month ("kwi", "gen"),
    # also without the host name or without the date ("kernel: NVRM: ...")
    r"|(?:[^\W\d]{2,5}\.? +\d{1,2},? [\d:]{8} +)?(?:[\w.-]+ +)??kernel: "
    r"|\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:?\d\d|Z)? \S+ kernel: "  # journalctl -o short-iso
    r")+"
)
_MARKDOWN_TAIL_RE = re.compile(r"[`*]+\s*$")

_ADDR = r"(?P<addr>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
# Old kernels: "pci 0000:3c:00.0: BAR 1: no space for [mem size 0x10000000 64bit pref]"
# newer (6.x): "pci 0000:3c:00.0: BAR 1 [mem size 0x10000000 64bit pref]: can't assign; no space"
#             "pcieport 0000:05:01.0: bridge window [mem size 0x10000000 64bit pref]: can't
#              assign; no space"
_BAR_RE = re.compile(
    rf"^[\w-]+ {_ADDR}: (?P<what>(?:VF )?BAR \d+|bridge window|ROM)\b"
    r"[^\[]*\[(?P<kind>mem|io)\b[^\]]*\]"
)
_ENUM_RE = re.compile(
    rf"^pci {_ADDR}: \[(?P<ven>[0-9a-f]{{4}}):(?P<dev>[0-9a-f]{{4}})\] "
    r"type \d+ class 0x(?P<cls>[0-9a-f]{6})"
)
# "NVRM: Xid (PCI:0000:01:00): 79, pid=..., GPU has fallen off the bus." (NVIDIA's Xid catalog:
# https://docs.nvidia.com/deploy/xid-errors/); "caused by previous Xid 149" is not an Xid line.
_XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<addr>[0-9a-fA-F:.]+)\): (?P<code>\d+)\b")
# "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7": the
# second field is the process that asked (security/lockdown/lockdown.c prints current->comm),
# not the module; modprobe names the module it could not insert on its own line.
_LOCKDOWN_RE = re.compile(r"Lockdown: (?P<who>[^:]+): unsigned module loading is restricted")
_REFUSED_RE = re.compile(
    r"could not insert '(?P<module>[\w-]+)': "
    r"(?:Operation not permitted|Key was rejected by service|Required key not available)"
)
_BRIDGE_RE = re.compile(
    rf"^\S+ {_ADDR}: PCI bridge to \[bus (?P<lo>[0-9a-f]{{2}})(?:-(?P<hi>[0-9a-f]{{2}}))?\]"
)
# "pci 0000:3c:00.0: 8.000 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe x4 link at
#  0000:02:01.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)" (older kernels omit "PCIe")
_LIMITED_RE = re.compile(
    rf"^\S+ {_ADDR}: [0-9.]+ Gb/s available PCIe bandwidth, "
    r"limited by (?P<speed>[0-9.]+) GT/s (?:PCIe )?"
    r"x(?P<width>\d+) link at (?P<at>[0-9a-fA-F:.]+) \(capable of [0-9.]+ Gb/s with "
    r"(?P<cap_speed>[0-9.]+) GT/s (?:PCIe )?x(?P<cap_width>\d+) link\)"
)
_API_RE = re.compile(
    r"client(?: '(?P<client>[^']*)' \(pid \d+\))?\s+(?:NVRM: )?"
    r"has the version (?P<client_v>\d+(?:\.\d+)*),? "
    r"but\s+(?:NVRM: )?this kernel module has\s+(?:NVRM: )?the version (?P<kernel_v>\d+(?:\.\d+)*)"
)
_NVRM_ADDR_RE = re.compile(
    r"(?:PCI:|GPU |GPU at |NVIDIA GPU )(?:PCI:)?"
    r"(?P<addr>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
)


def strip_prefix(line: str) -> str:
    """The kernel message without timestamp, level, syslog header or pasted markdown."""
    m = _PREFIX_RE.match(line)
    message = line[m.end() :] if m else line.lstrip()
    return _MARKDOWN_TAIL_RE.sub("", message)


@dataclass(frozen=True)
class Hit:
    """One kernel message: its lines as printed (evidence) and the message text joined."""

    lines: tuple[str, ...]
    message: str  # prefix stripped, continuation lines joined with a space
    offset: int  # where it starts in the log (keeps evidence in log order)


@dataclass(frozen=True)
class BarFailure:
    address: str
    what: str  # "BAR 1", "bridge window", "ROM"
    kind: str  # "mem" / "io"
    hit: Hit


@dataclass(frozen=True)
class LinkLimit:
    address: str
    speed_gts: float
    width: int
    at: str
    capable_speed_gts: float
    capable_width: int
    hit: Hit


@dataclass(frozen=True)
class DmesgScan:
    """Everything doctor wants from a kernel log."""

    bar_failures: tuple[BarFailure, ...] = ()
    nvrm_bar_invalid: tuple[
        Hit, ...
    ] = ()  # "PCI I/O region ... is invalid", "BAR1 is 0M", "misconfigured"
    rebar_fatal: tuple[Hit, ...] = ()
    rm_init_failed: tuple[Hit, ...] = ()
    link_limits: tuple[LinkLimit, ...] = ()
    api_mismatch: tuple[Hit, ...] = ()
    api_versions: tuple[tuple[str, str], ...] = ()  # (client, kernel module)
    fallen_off: tuple[Hit, ...] = ()
    atomics: tuple[Hit, ...] = ()
    key_rejected: tuple[Hit, ...] = ()
    unsigned_tainted: tuple[Hit, ...] = ()
    legacy_ignored: tuple[Hit, ...] = ()  # "... will ignore this GPU" (branch dropped the chip)
    nouveau: tuple[Hit, ...] = ()
    xids: tuple[tuple[str, int, Hit], ...] = ()  # (address "0000:01:00", Xid code, its line)
    # The driver bound to no GPU, said outright: "None of the NVIDIA devices were initialized",
    # "No NVIDIA graphics adapter probed!", "probe routine was not called" (another driver owns
    # the device), the open module refusing a GPU without GSP.
    driver_unbound: tuple[Hit, ...] = ()
    lockdown_callers: tuple[str, ...] = ()  # "modprobe", "systemd-udevd"
    refused_modules: tuple[str, ...] = ()  # "evdi", from "could not insert 'evdi': ..."
    pci_classes: dict[str, str] = field(default_factory=dict)  # every enumerated address -> class
    nvidia_functions: dict[str, str] = field(default_factory=dict)  # address -> class "030000"
    bridges: dict[str, tuple[str, int, int]] = field(
        default_factory=dict
    )  # bridge -> (domain, lo, hi)
    thunderbolt_seen: bool = False

    @property
    def xid_codes(self) -> tuple[int, ...]:
        """The Xid codes in order of first appearance, each once."""
        return tuple(dict.fromkeys(code for _, code, _ in self.xids))


def _is_continuation(line: str) -> bool:
    return line[:1] in (" ", "\t") and not _PREFIX_RE.match(line.lstrip())


def _record(text: str, pos: int) -> Hit:
    """The message containing text[pos]: back to its first line, on over its continuations."""
    start = text.rfind("\n", 0, pos) + 1
    while start > 0:
        line = text[start : text.find("\n", start) if text.find("\n", start) >= 0 else len(text)]
        if not _is_continuation(line):
            break
        start = text.rfind("\n", 0, start - 1) + 1
    lines: list[str] = []
    cursor = start
    while cursor < len(text):
        end = text.find("\n", cursor)
        end = len(text) if end < 0 else end
        line = text[cursor:end].rstrip("\r")
        if lines and not _is_continuation(line):
            break
        lines.append(line.rstrip())
        cursor = end + 1
        if len(lines) >= 12:
            break
    message = " ".join(
        strip_prefix(ln.strip()) if i else strip_prefix(ln) for i, ln in enumerate(lines)
    )
    # syslog writes embedded newlines as #012.
    message = message.replace("#012", " ")
    return Hit(tuple(line.replace("#012", " ") for line in lines), message, start)


def _hits(text: str, needle: str, limit: int = MAX_HITS) -> Iterator[Hit]:
    """Each distinct record containing `needle`, in log order (at most `limit`)."""
    pos = text.find(needle)
    last_start = -1
    count = 0
    while pos >= 0 and count < limit:
        hit = _record(text, pos)
        if hit.offset != last_start:
            last_start = hit.offset
            count += 1
            yield hit
        nxt = text.find("\n", pos)
        if nxt < 0:
            break
        pos = text.find(needle, nxt)


def _with_reason(text: str, hit: Hit, address: str) -> Hit:
    """Prepend the "no space" line the kernel prints just before "failed to assign"."""
    if hit.offset == 0:
        return hit
    start = text.rfind("\n", 0, hit.offset - 1) + 1
    line = text[start : hit.offset - 1].rstrip("\r")
    if address in line and ("no space" in line or "can't assign" in line):
        return Hit((line.rstrip(), *hit.lines), hit.message, hit.offset)
    return hit


def _nvrm_hits(text: str) -> dict[str, list[Hit]]:
    """NVIDIA driver messages by kind. Each NVRM line is tested as a plain string first (most are
    harmless "loading" lines); only a matching line pays for building its record."""
    out: dict[str, list[Hit]] = {k: [] for k in _NVRM_KINDS}
    offsets: dict[str, set[int]] = {k: set() for k in _NVRM_KINDS}
    pos = text.find("NVRM")
    while pos >= 0:
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[start:end]
        for kind, needles in _NVRM_KINDS.items():
            if len(out[kind]) < MAX_HITS and any(n in line for n in needles):
                hit = _record(text, pos)
                if hit.offset not in offsets[kind]:
                    offsets[kind].add(hit.offset)
                    out[kind].append(hit)
        pos = text.find("NVRM", end)
    return out


def _following(text: str, hit: Hit, n: int) -> str:
    """The message text of `hit` plus the next n lines (NVRM splits one message over several)."""
    end = hit.offset
    for _ in range(len(hit.lines) + n):
        nxt = text.find("\n", end)
        if nxt < 0:
            end = len(text)
            break
        end = nxt + 1
    return " ".join(strip_prefix(ln) for ln in text[hit.offset : end].splitlines()).replace(
        "#012", " "
    )


def scan_dmesg(text: str | None) -> DmesgScan:
    """Pure: the signatures present in a kernel log (None or empty: nothing found)."""
    if not text:
        return DmesgScan()

    bars: list[BarFailure] = []
    # Every failed window prints "failed to assign" (after "no space for" on old kernels,
    # after "can't assign; no space" on newer 6.x kernels), so one needle finds them all.
    seen: set[tuple[str, str, str]] = set()
    for hit in _hits(text, "failed to assign"):
        m = _BAR_RE.match(hit.message)
        if m and (m["addr"].lower(), m["what"], hit.message) not in seen:
            seen.add((m["addr"].lower(), m["what"], hit.message))
            bars.append(
                BarFailure(
                    m["addr"].lower(), m["what"], m["kind"], _with_reason(text, hit, m["addr"])
                )
            )

    # One pass over the NVIDIA driver's messages, sorted by what they say.
    nvrm = _nvrm_hits(text)

    limits = []
    for hit in _hits(text, "available PCIe bandwidth, limited by"):
        m = _LIMITED_RE.match(hit.message)
        if m:
            limits.append(
                LinkLimit(
                    m["addr"].lower(),
                    float(m["speed"]),
                    int(m["width"]),
                    m["at"].lower(),
                    float(m["cap_speed"]),
                    int(m["cap_width"]),
                    hit,
                )
            )

    versions = []
    for hit in nvrm["api"]:
        m = _API_RE.search(_following(text, hit, 4))
        if m:
            versions.append((m["client_v"], m["kernel_v"]))

    functions: dict[str, str] = {}
    classes: dict[str, str] = {}
    for hit in _hits(text, "] type 0", limit=4096):
        m = _ENUM_RE.match(hit.message)
        if m is None:
            continue
        classes[m["addr"].lower()] = m["cls"]
        if m["ven"] == "10de" and m["cls"].startswith("03"):
            functions[m["addr"].lower()] = m["cls"]
    xids = []
    for hit in _hits(text, "NVRM: Xid", limit=MAX_HITS):
        for m in _XID_RE.finditer(hit.message):
            xids.append((m["addr"].lower(), int(m["code"]), hit))
    lockdown = [
        m["who"].strip() for h in _hits(text, "Lockdown:") if (m := _LOCKDOWN_RE.search(h.message))
    ]
    refused = [
        m["module"]
        for h in _hits(text, "could not insert '")
        if (m := _REFUSED_RE.search(h.message))
    ]
    bridges: dict[str, tuple[str, int, int]] = {}
    for hit in _hits(text, "PCI bridge to [bus", limit=4096):
        m = _BRIDGE_RE.match(hit.message)
        if m:
            addr = m["addr"].lower()
            lo = int(m["lo"], 16)
            hi = int(m["hi"], 16) if m["hi"] else lo
            bridges[addr] = (addr.split(":")[0], lo, hi)

    return DmesgScan(
        bar_failures=tuple(bars),
        nvrm_bar_invalid=tuple(nvrm["bar_invalid"]),
        rebar_fatal=tuple(nvrm["rebar"]),
        rm_init_failed=tuple(nvrm["rm_init"]),
        link_limits=tuple(limits),
        api_mismatch=tuple(nvrm["api"]),
        api_versions=tuple(versions),
        fallen_off=tuple(nvrm["fallen"]),
        atomics=tuple(_hits(text, "rejects atomics")),
        key_rejected=_merge_hits(
            (h for h in _hits(text, "rejected") if any(n in h.message for n in _KEY_REJECTED)),
            _hits(text, "unsigned module loading is restricted"),
        ),
        unsigned_tainted=tuple(
            _hits(text, "module verification failed: signature and/or required key missing")
        ),
        legacy_ignored=tuple(nvrm["legacy"]),
        nouveau=tuple(_hits(text, "nouveau 0000:", limit=20)),
        xids=tuple(xids),
        driver_unbound=tuple(nvrm["unbound"]),
        lockdown_callers=tuple(dict.fromkeys(lockdown)),
        refused_modules=tuple(dict.fromkeys(refused)),
        pci_classes=classes,
        nvidia_functions=functions,
        bridges=bridges,
        thunderbolt_seen=text.find("thunderbolt ") >= 0,
    )


_NVRM_KINDS = {
    "bar_invalid": (
        "assigned to your NVIDIA device is invalid",
        "is 0M @ 0x0",
        "may have misconfigured your GPU",
    ),
    "rebar": ("Fatal Error while attempting to resize PCIe BARs",),
    "rm_init": ("RmInitAdapter failed",),
    "api": ("API mismatch",),
    "fallen": ("fallen off the bus",),
    "legacy": ("will ignore", "Legacy drivers"),
    "unbound": (
        "None of the NVIDIA devices were initialized",
        "No NVIDIA graphics adapter probed",
        "probe routine was not called",
        "is not supported by open",
    ),
}
# modprobe and the kernel's module loader (kernel/module/signing.c) when a signature is refused.
_KEY_REJECTED = (
    "Key was rejected by service",
    "Loading of unsigned module is rejected",
    "Loading of module with unavailable key is rejected",
)


def _merge_hits(*groups: Iterator[Hit]) -> tuple[Hit, ...]:
    by_offset: dict[int, Hit] = {}
    for group in groups:
        for hit in group:
            by_offset.setdefault(hit.offset, hit)
    return tuple(by_offset[k] for k in sorted(by_offset))


def nvrm_address(hit: Hit) -> str | None:
    """The PCI address an NVRM message names ("PCI:0000:3c:00" -> "0000:3c:00"), lowercase."""
    m = _NVRM_ADDR_RE.search(hit.message)
    return m["addr"].lower() if m else None
