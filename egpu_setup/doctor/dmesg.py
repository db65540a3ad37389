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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from egpu_setup.detect.amdgpu_log import NEEDLES as AMDGPU_NEEDLES
from egpu_setup.detect.amdgpu_log import AmdgpuEvent, classify
from egpu_setup.detect.kernel_log import XID_RE

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
_XID_RE = XID_RE  # detect/kernel_log.py: the health sampler counts the same lines
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
    # (the wake-up it followed, the loss): a GPU or the bridge it hangs off gone right after a
    # resume (resume_losses below)
    resume_losses: tuple[tuple[Hit, Hit], ...] = ()
    amdgpu: tuple[AmdgpuEvent, ...] = ()  # hung rings, resets, a failed init, the SMU (log order)

    @property
    def xid_codes(self) -> tuple[int, ...]:
        """The Xid codes in order of first appearance, each once."""
        return tuple(dict.fromkeys(code for _, code, _ in self.xids))


# A device's own message ("pci 0000:00:16.4: bridge window ..."): a record of its own even when
# the paste indents every line (a log quoted in YAML output or as an indented markdown block),
# where indentation alone would join the whole paste into one record.
_DEVICE_MESSAGE_RE = re.compile(rf"^[\w-]+ {_ADDR}: ")


def _is_continuation(line: str) -> bool:
    if line[:1] not in (" ", "\t"):
        return False
    rest = line.lstrip()
    return not _PREFIX_RE.match(rest) and not _DEVICE_MESSAGE_RE.match(rest)


# -- one window of the log -------------------------------------------------------------------------
#
# The finders below search text[lo:hi] (the window) and may read the lines around it for context;
# `base` is where text[0] lies in the whole log, so every Hit.offset is an offset in the whole log.
# scan_dmesg passes the whole text as one window; scan_lines passes one block at a time, with the
# line before it and _LOOKAHEAD lines after it as context.


def _record(text: str, pos: int, base: int = 0) -> Hit:
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
    return Hit(tuple(line.replace("#012", " ") for line in lines), message, base + start)


def _hits(
    text: str, needle: str, limit: int = MAX_HITS, lo: int = 0, hi: int = -1, base: int = 0
) -> Iterator[Hit]:
    """Each distinct record containing `needle` in the window, in log order (at most `limit`)."""
    hi = len(text) if hi < 0 else hi
    pos = text.find(needle, lo)
    last_start = -1
    count = 0
    while 0 <= pos < hi and count < limit:
        hit = _record(text, pos, base)
        if hit.offset != last_start:
            last_start = hit.offset
            count += 1
            yield hit
        nxt = text.find("\n", pos)
        if nxt < 0:
            break
        pos = text.find(needle, nxt)


def _with_reason(text: str, hit: Hit, address: str, base: int = 0) -> Hit:
    """Prepend the "no space" line the kernel prints just before "failed to assign"."""
    at = hit.offset - base
    if at == 0:
        return hit
    start = text.rfind("\n", 0, at - 1) + 1
    line = text[start : at - 1].rstrip("\r")
    if address in line and ("no space" in line or "can't assign" in line):
        return Hit((line.rstrip(), *hit.lines), hit.message, hit.offset)
    return hit


def _nvrm_hits(text: str, lo: int = 0, hi: int = -1, base: int = 0) -> dict[str, list[Hit]]:
    """NVIDIA driver messages by kind. Each NVRM line is tested as a plain string first (most are
    harmless "loading" lines); only a matching line pays for building its record."""
    hi = len(text) if hi < 0 else hi
    out: dict[str, list[Hit]] = {k: [] for k in _NVRM_KINDS}
    offsets: dict[str, set[int]] = {k: set() for k in _NVRM_KINDS}
    pos = text.find("NVRM", lo)
    while 0 <= pos < hi:
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[start:end]
        for kind, needles in _NVRM_KINDS.items():
            if len(out[kind]) < MAX_HITS and any(n in line for n in needles):
                hit = _record(text, pos, base)
                if hit.offset not in offsets[kind]:
                    offsets[kind].add(hit.offset)
                    out[kind].append(hit)
        pos = text.find("NVRM", end)
    return out


# NVRM prints an API mismatch over several messages: the versions are in the next few lines.
_API_FOLLOWING = 4
# What a block needs after it as context (scan_lines): the lines _following reads past a record.
_LOOKAHEAD = _API_FOLLOWING


def _following(text: str, hit: Hit, n: int, base: int = 0) -> str:
    """The message text of `hit` plus the next n lines (NVRM splits one message over several)."""
    at = hit.offset - base
    end = at
    for _ in range(len(hit.lines) + n):
        nxt = text.find("\n", end)
        if nxt < 0:
            end = len(text)
            break
        end = nxt + 1
    return " ".join(strip_prefix(ln) for ln in text[at:end].splitlines()).replace("#012", " ")


# Each signature found by one fixed substring (needle), with how many records of it are kept.
# Every failed window prints "failed to assign" (after "no space for" on old kernels, after
# "can't assign; no space" on newer 6.x kernels), so one needle finds them all.
_NEEDLES: dict[str, tuple[str, int]] = {
    "bars": ("failed to assign", MAX_HITS),
    "limits": ("available PCIe bandwidth, limited by", MAX_HITS),
    "xids": ("NVRM: Xid", MAX_HITS),
    "lockdown": ("Lockdown:", MAX_HITS),
    "refused": ("could not insert '", MAX_HITS),
    "atomics": ("rejects atomics", MAX_HITS),
    "rejected": ("rejected", MAX_HITS),
    "restricted": ("unsigned module loading is restricted", MAX_HITS),
    "unsigned": ("module verification failed: signature and/or required key missing", MAX_HITS),
    "nouveau": ("nouveau 0000:", 20),
    # Kernels before 4.x tagged nouveau's lines by subsystem: "nouveau  [  DEVICE][0000:01:00.0]".
    "nouveau_old": ("nouveau  [", 20),
    # A wake-up and the losses that follow one (resume_losses).
    "resumed": ("PM: suspend exit", MAX_HITS),
    "resumed_devices": ("PM: resume of devices complete", MAX_HITS),
    "woke": ("Waking up from system sleep state", MAX_HITS),
    "slept": ("PM: suspend entry", MAX_HITS),
    "not_ready": ("after resume; giving up", MAX_HITS),
    "inaccessible": ("device inaccessible", MAX_HITS),
}
# amdgpu's troubles (detect/amdgpu_log.py); a hung job's "parser" lines can repeat thousands of
# times, so each needle keeps its first 50.
_NEEDLES |= {f"amdgpu{i}": (needle, 50) for i, (_, needle) in enumerate(AMDGPU_NEEDLES)}
# Enumeration and bridge lines are many (every PCI function, at every boot and hot-plug): of
# those only what they say is kept, not the records.
_ENUM = ("] type 0", 4096)
_BRIDGE = ("PCI bridge to [bus", 4096)


@dataclass
class _Found:
    """The records one or more windows hold, per needle and per NVRM kind, in log order and cut
    at each one's limit: what the first `limit` records of the whole log would be. A BAR record
    comes with its failure read in context, an API mismatch with the versions that follow it."""

    hits: dict[str, list[Hit]] = field(default_factory=lambda: {k: [] for k in _NEEDLES})
    nvrm: dict[str, list[Hit]] = field(default_factory=lambda: {k: [] for k in _NVRM_KINDS})
    bars: list[BarFailure | None] = field(default_factory=list)  # one per hits["bars"]
    api_versions: list[tuple[str, str] | None] = field(default_factory=list)  # per nvrm["api"]
    enum: list[tuple[str, str, str] | None] = field(default_factory=list)  # (addr, vendor, class)
    bridges: list[tuple[str, int, int] | None] = field(default_factory=list)  # (addr, lo, hi)
    thunderbolt: bool = False

    def extend(self, other: _Found) -> None:
        for key, (_, limit) in _NEEDLES.items():
            room = limit - len(self.hits[key])
            self.hits[key] += other.hits[key][:room]
            if key == "bars":
                self.bars += other.bars[:room]
        for kind in _NVRM_KINDS:
            room = MAX_HITS - len(self.nvrm[kind])
            self.nvrm[kind] += other.nvrm[kind][:room]
            if kind == "api":
                self.api_versions += other.api_versions[:room]
        self.enum += other.enum[: _ENUM[1] - len(self.enum)]
        self.bridges += other.bridges[: _BRIDGE[1] - len(self.bridges)]
        self.thunderbolt = self.thunderbolt or other.thunderbolt


def _find(text: str, lo: int = 0, hi: int = -1, base: int = 0) -> _Found:
    """Every signature's records in the window text[lo:hi]."""
    hi = len(text) if hi < 0 else hi
    found = _Found()
    for key, (needle, limit) in _NEEDLES.items():
        found.hits[key] = list(_hits(text, needle, limit, lo, hi, base))
    for hit in found.hits["bars"]:
        m = _BAR_RE.match(hit.message)
        found.bars.append(
            BarFailure(
                m["addr"].lower(), m["what"], m["kind"], _with_reason(text, hit, m["addr"], base)
            )
            if m
            else None
        )
    found.nvrm = _nvrm_hits(text, lo, hi, base)
    for hit in found.nvrm["api"]:
        m = _API_RE.search(_following(text, hit, _API_FOLLOWING, base))
        found.api_versions.append((m["client_v"], m["kernel_v"]) if m else None)
    for hit in _hits(text, _ENUM[0], _ENUM[1], lo, hi, base):
        m = _ENUM_RE.match(hit.message)
        found.enum.append((m["addr"].lower(), m["ven"], m["cls"]) if m else None)
    for hit in _hits(text, _BRIDGE[0], _BRIDGE[1], lo, hi, base):
        m = _BRIDGE_RE.match(hit.message)
        found.bridges.append(
            (m["addr"].lower(), int(m["lo"], 16), int(m["hi"] or m["lo"], 16)) if m else None
        )
    pos = text.find("thunderbolt ", lo)
    found.thunderbolt = 0 <= pos < hi
    return found


def scan_dmesg(text: str | None) -> DmesgScan:
    """Pure: the signatures present in a kernel log (None or empty: nothing found)."""
    if not text:
        return DmesgScan()
    return _scan(_find(text))


@dataclass
class _Block:
    """A block of the log waiting for the lines after it (its lookahead) before it is scanned."""

    before: str  # the line just before it
    lines: list[str]
    base: int  # where it starts in the whole log
    after: list[str] = field(default_factory=list)
    after_lines: int = 0  # whole lines in `after` (a long line may come in pieces)

    def scan(self) -> _Found:
        text = self.before + "".join(self.lines) + "".join(self.after)
        lo = len(self.before)
        hi = len(text) - sum(len(x) for x in self.after)
        return _find(text, lo, hi, self.base - lo)


def scan_lines(lines: Iterable[str], block: int = 1024 * 1024) -> DmesgScan:
    """scan_dmesg of the log these lines (each with its "\n") make up, read a block of about
    `block` characters at a time, so memory stays flat however long the log is. The result is
    the same as scan_dmesg of the whole text: a block ends only where a message does (before a
    line that continues none), and is scanned with the line before it and the _LOOKAHEAD lines
    after it, all the context a record reads."""
    found = _Found()
    current = _Block("", [], 0)
    size = 0
    waiting: list[_Block] = []  # full blocks, oldest first
    whole = True  # the last piece ended a line: the next one starts a line
    for line in lines:
        if size >= block and whole and not _is_continuation(line.rstrip("\r\n")):
            waiting.append(current)
            current = _Block(_last_line(current.lines), [], current.base + size)
            size = 0
        current.lines.append(line)
        size += len(line)
        whole = line.endswith("\n")
        for w in waiting:
            if w.after_lines < _LOOKAHEAD:
                w.after.append(line)
                w.after_lines += whole
        while waiting and waiting[0].after_lines >= _LOOKAHEAD:
            found.extend(waiting.pop(0).scan())
    for w in [*waiting, current]:
        found.extend(w.scan())
    return _scan(found)


def _last_line(pieces: list[str]) -> str:
    """The last line of a block (its pieces, when a long line came in several)."""
    j = len(pieces) - 1
    while j > 0 and not pieces[j - 1].endswith("\n"):
        j -= 1
    return "".join(pieces[j:])


def _scan(found: _Found) -> DmesgScan:
    """The DmesgScan of everything found (the first `limit` records of each signature)."""
    h = found.hits
    bars: list[BarFailure] = []
    seen: set[tuple[str, str, str]] = set()
    for bar in found.bars:
        if bar is not None and (bar.address, bar.what, bar.hit.message) not in seen:
            seen.add((bar.address, bar.what, bar.hit.message))
            bars.append(bar)

    limits = []
    for hit in h["limits"]:
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

    functions: dict[str, str] = {}
    classes: dict[str, str] = {}
    for entry in found.enum:
        if entry is None:
            continue
        addr, vendor, cls = entry
        classes[addr] = cls
        if vendor == "10de" and cls.startswith("03"):
            functions[addr] = cls
    xids = []
    for hit in h["xids"]:
        for m in _XID_RE.finditer(hit.message):
            xids.append((m["addr"].lower(), int(m["code"]), hit))
    lockdown = [m["who"].strip() for x in h["lockdown"] if (m := _LOCKDOWN_RE.search(x.message))]
    refused = [m["module"] for x in h["refused"] if (m := _REFUSED_RE.search(x.message))]
    bridges: dict[str, tuple[str, int, int]] = {}
    for bridge in found.bridges:
        if bridge is not None:
            addr, lo, hi = bridge
            bridges[addr] = (addr.split(":")[0], lo, hi)

    amdgpu = {
        hit.offset: event
        for i in range(len(AMDGPU_NEEDLES))
        for hit in h[f"amdgpu{i}"]
        if (event := classify(hit.message, hit.lines, hit.offset)) is not None
    }
    nvrm = found.nvrm
    return DmesgScan(
        bar_failures=tuple(bars),
        nvrm_bar_invalid=tuple(nvrm["bar_invalid"]),
        rebar_fatal=tuple(nvrm["rebar"]),
        rm_init_failed=tuple(nvrm["rm_init"]),
        link_limits=tuple(limits),
        api_mismatch=tuple(nvrm["api"]),
        api_versions=tuple(v for v in found.api_versions if v is not None),
        fallen_off=tuple(nvrm["fallen"]),
        atomics=tuple(h["atomics"]),
        key_rejected=_merge_hits(
            (x for x in h["rejected"] if any(n in x.message for n in _KEY_REJECTED)),
            iter(h["restricted"]),
        ),
        unsigned_tainted=tuple(h["unsigned"]),
        legacy_ignored=tuple(nvrm["legacy"]),
        nouveau=_merge_hits(iter(h["nouveau"]), iter(h["nouveau_old"])),
        xids=tuple(xids),
        driver_unbound=tuple(nvrm["unbound"]),
        lockdown_callers=tuple(dict.fromkeys(lockdown)),
        refused_modules=tuple(dict.fromkeys(refused)),
        pci_classes=classes,
        nvidia_functions=functions,
        bridges=bridges,
        thunderbolt_seen=found.thunderbolt,
        resume_losses=resume_losses(h, nvrm["fallen"]),
        amdgpu=tuple(amdgpu[k] for k in sorted(amdgpu)),
    )


# How long after the wake-up a loss still counts as the resume's, where both lines carry a time.
RESUME_WINDOW_S = 120
# "[ 2342.918687] " (seconds since boot) or a syslog/journal clock "Jul 04 18:53:24 "
_MONOTONIC_RE = re.compile(r"\[\s*(\d+\.\d+)\]")
_CLOCK_RE = re.compile(r"\b(\d\d):(\d\d):(\d\d)\b")


def _seconds(line: str) -> tuple[str, float] | None:
    """(which clock, seconds) of a log line, or None where it carries no time."""
    m = _MONOTONIC_RE.search(line)
    if m:
        return "boot", float(m[1])
    m = _CLOCK_RE.search(line)
    if m:
        return "clock", int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
    return None


def _soon_after(mark: Hit, loss: Hit) -> bool:
    """The loss came within RESUME_WINDOW_S of the wake-up (True where the times cannot tell)."""
    a, b = _seconds(mark.lines[0]), _seconds(loss.lines[0])
    if a is None or b is None or a[0] != b[0]:
        return True
    delta = b[1] - a[1]
    if a[0] == "clock" and delta < 0:
        delta += 86400  # past midnight
    return 0 <= delta <= RESUME_WINDOW_S


def resume_losses(hits: dict[str, list[Hit]], fallen: Iterable[Hit]) -> tuple[tuple[Hit, Hit], ...]:
    """Each loss that came with a sleep: inside a suspend cycle (between "PM: suspend entry" and
    the wake-up that ends it; devices resume before "PM: suspend exit" is printed, and s2idle
    prints no other wake-up line) or within RESUME_WINDOW_S after a wake-up (the kernel's
    "PM: suspend exit", "PM: resume of devices complete", ACPI's "Waking up from system sleep
    state"), before the next suspend. A loss is NVRM's "fallen off the bus" (Xid 79), a PCI
    device "not ready ...ms after resume; giving up" (drivers/pci/pci.c pci_dev_wait) or left
    "device inaccessible" (pci_power_up); "not ready after resume" counts by its own words, with
    or without a wake-up line in the log. Each pair is (the sleep or wake-up line, the loss)."""
    marks = sorted(
        (*hits["resumed"], *hits["resumed_devices"], *hits["woke"]), key=lambda x: x.offset
    )
    sleeps = sorted(hits["slept"], key=lambda x: x.offset)
    losses = sorted(
        {x.offset: x for x in (*fallen, *hits["not_ready"], *hits["inaccessible"])}.values(),
        key=lambda x: x.offset,
    )
    out: list[tuple[Hit, Hit]] = []
    for loss in losses:
        mark = next((m for m in reversed(marks) if m.offset < loss.offset), None)
        entry = next((e for e in reversed(sleeps) if e.offset < loss.offset), None)
        if entry is not None and (mark is None or mark.offset < entry.offset):
            # asleep since `entry`: a loss of this cycle when a wake-up ends it
            if any(m.offset > loss.offset for m in marks):
                out.append((entry, loss))
                continue
            mark = None
        if mark is not None and _soon_after(mark, loss):
            out.append((mark, loss))
        elif "after resume; giving up" in loss.message:
            out.append((loss, loss))
    return tuple(out)


_NVRM_KINDS: dict[str, tuple[str, ...]] = {
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
