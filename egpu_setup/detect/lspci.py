"""Parse `lspci` text in the variants users paste into bug reports.

Accepted: plain, -k, -n, -nn, -nnk, -D, -v/-vv/-vvv (with or without -nn), -mm / -nnmm,
-vmm / -vmmk, lines cut by `grep` (with `--` separators from `grep -A`), prompts and other
garbage between entries (ignored), names an old pci.ids lacks ("NVIDIA Corporation Device
2b85") and non-zero PCI domains ("0001:00:00.0", "10000:e1:00.0" behind Intel VMD).

The class is read from its own field, never searched for in the whole line: `lspci | grep -i
3d` also matches a bridge on bus 3d (reference/egpu-tools.md §3, egpu-switcher's legacy bug).
Formats follow pciutils' lspci.c (show_bases, show_express) and lib/names.c.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

__all__ = ["LspciEntry", "normalize_pci_address", "parse_lspci"]

# PCI class codes 0x03xx are display controllers (PCI Code and ID Assignment spec, class 03h).
_DISPLAY_CLASS_NAMES = frozenset(
    {
        "vga compatible controller",
        "3d controller",
        "display controller",
        "xga compatible controller",
    }
)


@dataclass(frozen=True)
class LspciEntry:
    """One PCI function as lspci printed it. Unknown fields are None."""

    address: str  # "0000:01:00.0" (domain always present, lowercase)
    class_name: str | None = None  # "VGA compatible controller"
    class_id: str | None = None  # "0300" (only when -n/-nn printed it)
    vendor_name: str | None = None  # "NVIDIA Corporation"
    vendor_id: str | None = None  # "10de"
    device_name: str | None = None  # "AD102 [GeForce RTX 4090]" or "Device 2b85"
    device_id: str | None = None  # "2684"
    subsystem: str | None = None  # "ASUSTeK Computer Inc. Device 889d" (text as printed)
    subsystem_vendor_id: str | None = None
    subsystem_device_id: str | None = None
    revision: str | None = None  # "a1"
    prog_if: str | None = None  # "00"
    driver: str | None = None  # "Kernel driver in use"
    modules: tuple[str, ...] = ()  # "Kernel modules"
    link_speed_gts: float | None = None  # LnkSta
    link_width: int | None = None
    max_link_speed_gts: float | None = None  # LnkCap
    max_link_width: int | None = None
    unassigned_bars: tuple[str, ...] = ()  # BAR lines with <unassigned>/<ignored>/[disabled]

    @property
    def is_display(self) -> bool:
        """True for PCI class 03xx (VGA, 3D, display controllers)."""
        if self.class_id is not None:
            return self.class_id.startswith("03")
        return (self.class_name or "").strip().lower() in _DISPLAY_CLASS_NAMES


_HEX = "[0-9a-fA-F]"
# Domain: 4 hex digits normally, 5 behind Intel VMD ("10000:e1:00.0"); bus:device.function.
_ADDR = rf"(?:{_HEX}{{4,8}}:)?{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]"
_ADDR_RE = re.compile(
    rf"^(?:(?P<domain>{_HEX}{{1,8}}):)?(?P<bus>{_HEX}{{2}}):(?P<dev>{_HEX}{{2}})\.(?P<fn>[0-7])$"
)
_HEADER_RE = re.compile(rf"^(?P<addr>{_ADDR})\s+(?P<rest>\S.*)$")
# `lspci -n`: "01:00.0 0300: 10de:2204 (rev a1)"
_NUMERIC_RE = re.compile(
    rf"^(?P<cls>{_HEX}{{4}}): (?P<ven>{_HEX}{{4}}):(?P<dev>{_HEX}{{4}})"
    rf"(?: \(rev (?P<rev>{_HEX}{{2}})\))?(?: \(prog-if (?P<pi>{_HEX}{{2}})\))?\s*$"
)
_CLASS_RE = re.compile(rf"^(?P<name>[^:\[\]]+?)(?: \[(?P<id>{_HEX}{{4}})\])?: (?P<text>.*)$")
_IDS_TAIL_RE = re.compile(rf"\s*\[(?P<ven>{_HEX}{{4}}):(?P<dev>{_HEX}{{4}})\]\s*$")
_REV_RE = re.compile(rf"\s*\(rev (?P<rev>{_HEX}{{2}})\)")
_PROGIF_RE = re.compile(rf"\s*\(prog-if (?P<pi>{_HEX}{{2}})(?: \[[^\]]*\])?\)")
# names.c prints "<vendor> Device <id>" when pci.ids knows the vendor but not the device.
_UNKNOWN_DEVICE_RE = re.compile(
    rf"^(?P<ven>.*?)\s*\b(?P<dev>(?:Device|Unknown device)(?: {_HEX}{{4}}(?::{_HEX}{{4}})?)?)$"
)
_SPEED_RE = re.compile(r"Speed (?P<speed>[0-9.]+)GT/s")
_WIDTH_RE = re.compile(r"Width x(?P<width>[0-9]+)")
_BAR_RE = re.compile(r"^(?:Region \d+: )?(?:Memory at|I/O ports at)\b")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# Vendor names as pci.ids spells them, to split "<vendor> <device>" in plain output, where
# names.c joins the two with a single space. Longest first so "[AMD/ATI]" wins over "Inc.".
_KNOWN_VENDORS = tuple(
    sorted(
        (
            "NVIDIA Corporation",
            "nVidia Corporation",
            "Advanced Micro Devices, Inc. [AMD/ATI]",
            "Advanced Micro Devices, Inc. [AMD]",
            "Intel Corporation",
            "ASMedia Technology Inc.",
            "ASPEED Technology, Inc.",
            "Matrox Electronics Systems Ltd.",
            "Red Hat, Inc.",
            "VMware",
            "InnoTek Systemberatung GmbH",
            "Cirrus Logic",
        ),
        key=len,
        reverse=True,
    )
)
# A vendor name commonly ends with a company suffix; used when the vendor is not listed above.
_VENDOR_SUFFIX_RE = re.compile(
    r"^(?P<ven>.*?(?:Corporation|Corp\.|Inc\.(?: \[[^\]]+\])?|Co\., Ltd\.?|Ltd\.?|GmbH|AG|"
    r"S\.A\.|LLC|Limited))\s+(?P<dev>\S.*)$"
)


def normalize_pci_address(text: str) -> str | None:
    """'01:00.0' -> '0000:01:00.0'; '00000000:3C:00.0' -> '0000:3c:00.0'; None if not an address."""
    m = _ADDR_RE.match(text.strip())
    if m is None:
        return None
    domain = (m.group("domain") or "0").lower().lstrip("0").rjust(4, "0")
    return f"{domain}:{m.group('bus').lower()}:{m.group('dev').lower()}.{m.group('fn')}"


def _split_vendor_device(text: str) -> tuple[str | None, str | None]:
    text = text.strip()
    if not text:
        return None, None
    for vendor in _KNOWN_VENDORS:
        if text.startswith(vendor + " "):
            return vendor, text[len(vendor) + 1 :].strip() or None
    m = _UNKNOWN_DEVICE_RE.match(text)
    if m:
        # Vendor unknown as well: names.c prints "Device 1234:5678" (or "Device" with -nn).
        return m.group("ven") or None, m.group("dev")
    m = _VENDOR_SUFFIX_RE.match(text)
    if m:
        return m.group("ven"), m.group("dev")
    return None, text


def _parse_speed(text: str) -> float | None:
    m = _SPEED_RE.search(text)
    return float(m.group("speed")) if m else None


def _parse_width(text: str) -> int | None:
    m = _WIDTH_RE.search(text)
    return int(m.group("width")) if m else None


class _Builder:
    """Mutable collector for one entry; frozen into an LspciEntry at the end."""

    def __init__(self, address: str) -> None:
        self.f: dict[str, object] = {"address": address}
        self.modules: list[str] = []
        self.bars: list[str] = []
        self.vmm = False  # built from `lspci -vmm` "Slot:" blocks

    def set(self, key: str, value: object) -> None:
        if value is not None and self.f.get(key) is None:
            self.f[key] = value

    def build(self) -> LspciEntry:
        return LspciEntry(
            **self.f,  # type: ignore[arg-type]
            modules=tuple(dict.fromkeys(self.modules)),
            unassigned_bars=tuple(self.bars),
        )


def _parse_header(address: str, rest: str) -> _Builder | None:
    b = _Builder(address)
    m = _NUMERIC_RE.match(rest)
    if m:
        b.set("class_id", m.group("cls").lower())
        b.set("vendor_id", m.group("ven").lower())
        b.set("device_id", m.group("dev").lower())
        b.set("revision", m.group("rev") and m.group("rev").lower())
        b.set("prog_if", m.group("pi") and m.group("pi").lower())
        return b
    if rest.startswith('"'):
        return _parse_machine(b, rest)
    m = _CLASS_RE.match(rest)
    if m is None:
        return None
    b.set("class_name", m.group("name").strip())
    b.set("class_id", m.group("id") and m.group("id").lower())
    text = m.group("text")
    pm = _PROGIF_RE.search(text)
    if pm:
        b.set("prog_if", pm.group("pi").lower())
        text = text[: pm.start()] + text[pm.end() :]
    rm = _REV_RE.search(text)
    if rm:
        b.set("revision", rm.group("rev").lower())
        text = text[: rm.start()] + text[rm.end() :]
    im = _IDS_TAIL_RE.search(text)
    if im:
        b.set("vendor_id", im.group("ven").lower())
        b.set("device_id", im.group("dev").lower())
        text = text[: im.start()]
    vendor, device = _split_vendor_device(text)
    b.set("vendor_name", vendor)
    b.set("device_name", device)
    if b.f.get("device_id") is None and device:
        # "NVIDIA Corporation Device 2b85": the id is in the name when pci.ids lacks it.
        dm = re.fullmatch(rf"(?:Device|Unknown device) ({_HEX}{{4}})", device)
        if dm:
            b.set("device_id", dm.group(1).lower())
    return b


_MM_NAME_ID_RE = re.compile(rf"^(?P<name>.*?)\s*(?:\[(?P<id>{_HEX}{{4}})\])?$")


def _mm_field(text: str) -> tuple[str | None, str | None]:
    m = _MM_NAME_ID_RE.match(text.strip())
    if m is None:  # pragma: no cover - the pattern matches every string
        return None, None
    name = m.group("name") or None
    return name, (m.group("id") or "").lower() or None


def _parse_machine(b: _Builder, rest: str) -> _Builder | None:
    """`lspci -mm` / `-nnmm`: `"class [id]" "vendor [id]" "device [id]" -rREV -pPI "sv" "sd"`."""
    try:
        tokens = shlex.split(rest, posix=True)
    except ValueError:
        return None
    words = [t for t in tokens if not (t.startswith("-") and len(t) > 1 and t[1] in "rp")]
    for t in tokens:
        if t.startswith("-r") and len(t) > 2:
            b.set("revision", t[2:].lower())
        elif t.startswith("-p") and len(t) > 2:
            b.set("prog_if", t[2:].lower())
    if len(words) < 3:
        return None
    cls_name, cls_id = _mm_field(words[0])
    ven_name, ven_id = _mm_field(words[1])
    dev_name, dev_id = _mm_field(words[2])
    if cls_name and re.fullmatch(rf"{_HEX}{{4}}", cls_name) and cls_id is None:
        cls_id, cls_name = cls_name.lower(), None  # -mm -n prints bare numbers
    if ven_name and re.fullmatch(rf"{_HEX}{{4}}", ven_name) and ven_id is None:
        ven_id, ven_name = ven_name.lower(), None
    if dev_name and re.fullmatch(rf"{_HEX}{{4}}", dev_name) and dev_id is None:
        dev_id, dev_name = dev_name.lower(), None
    b.set("class_name", cls_name)
    b.set("class_id", cls_id)
    b.set("vendor_name", ven_name)
    b.set("vendor_id", ven_id)
    b.set("device_name", dev_name)
    b.set("device_id", dev_id)
    if len(words) >= 5:
        sv_name, sv_id = _mm_field(words[3])
        sd_name, sd_id = _mm_field(words[4])
        joined = " ".join(x for x in (sv_name, sd_name) if x)
        b.set("subsystem", joined or None)
        b.set("subsystem_vendor_id", sv_id)
        b.set("subsystem_device_id", sd_id)
    return b


def _apply_detail(b: _Builder, line: str) -> bool:
    """Attach one indented detail line to the entry; False when the line is not one we know."""
    key, sep, value = line.partition(":")
    value = value.strip()
    if line.startswith("Kernel driver in use:"):
        b.set("driver", value or None)
    elif line.startswith("Kernel modules:"):
        b.modules.extend(m.strip() for m in value.split(",") if m.strip())
    elif key == "Subsystem" and sep:
        im = _IDS_TAIL_RE.search(value)
        if im:
            b.set("subsystem_vendor_id", im.group("ven").lower())
            b.set("subsystem_device_id", im.group("dev").lower())
            value = value[: im.start()].strip()
        else:
            nm = re.fullmatch(rf"({_HEX}{{4}}):({_HEX}{{4}})", value)  # `lspci -n -v`
            if nm:
                b.set("subsystem_vendor_id", nm.group(1).lower())
                b.set("subsystem_device_id", nm.group(2).lower())
                value = ""
        b.set("subsystem", value or None)
    elif key == "LnkSta" and sep:
        b.set("link_speed_gts", _parse_speed(value))
        b.set("link_width", _parse_width(value))
    elif key == "LnkCap" and sep:
        b.set("max_link_speed_gts", _parse_speed(value))
        b.set("max_link_width", _parse_width(value))
    elif _BAR_RE.match(line):
        # A BAR the kernel could not place prints "<unassigned>"/"<ignored>"; "[disabled]"
        # means decoding is off in the command register (lspci.c show_bases). The expansion
        # ROM is left out: it is "[disabled]" on nearly every healthy GPU after POST.
        if "<unassigned>" in line or "<ignored>" in line or "[disabled]" in line:
            b.bars.append(line)
    else:
        return line.startswith(("Flags:", "Capabilities:", "Expansion ROM", "Control:", "Status:"))
    return True


# -vmm: "Slot:\t01:00.0" blocks of "Key:\tvalue" lines.
_VMM_KEYS = {
    "Class": ("class_name", "class_id"),
    "Vendor": ("vendor_name", "vendor_id"),
    "Device": ("device_name", "device_id"),
    "SVendor": ("subsystem", "subsystem_vendor_id"),
    "SDevice": ("_sdevice", "subsystem_device_id"),
}


def _apply_vmm(b: _Builder, key: str, value: str) -> None:
    if key in _VMM_KEYS:
        name_key, id_key = _VMM_KEYS[key]
        name, ident = _mm_field(value)
        if name and re.fullmatch(rf"{_HEX}{{4}}", name) and ident is None:
            ident, name = name.lower(), None
        if name_key == "_sdevice":
            if name:
                sub = b.f.get("subsystem")
                b.f["subsystem"] = f"{sub} {name}" if sub else name
        else:
            b.set(name_key, name)
        b.set(id_key, ident)
    elif key == "Rev":
        b.set("revision", value.lower() or None)
    elif key == "ProgIf":
        b.set("prog_if", value.lower() or None)
    elif key == "Driver":
        b.set("driver", value or None)
    elif key == "Module":
        b.modules.append(value)


def parse_lspci(text: str) -> tuple[LspciEntry, ...]:
    """Every PCI function found in lspci text of any common variant; garbage lines ignored."""
    if not isinstance(text, str):
        return ()
    entries: list[LspciEntry] = []
    current: _Builder | None = None

    def flush() -> None:
        nonlocal current
        if current is not None:
            entries.append(current.build())
        current = None

    for raw in text.splitlines():
        line = _ANSI_RE.sub("", raw).replace("\x00", "")
        stripped = line.strip()
        if not stripped or stripped == "--":
            flush()
            continue
        vmm_key, vmm_sep, vmm_value = stripped.partition(":")
        if vmm_sep and vmm_key == "Slot":
            addr = normalize_pci_address(vmm_value)
            flush()
            if addr:
                current = _Builder(addr)
                current.vmm = True
            continue
        header = _HEADER_RE.match(stripped)
        if header:
            addr = normalize_pci_address(header.group("addr"))
            built = _parse_header(addr, header.group("rest").strip()) if addr else None
            if built is not None:
                flush()
                current = built
                continue
        if current is None:
            continue
        if current.vmm:
            # -vmm: "Key:\tvalue"; keys we do not use (PhySlot, NUMANode, IOMMUGroup) skipped.
            if vmm_sep:
                _apply_vmm(current, vmm_key, vmm_value.strip())
                continue
            flush()
            continue
        if _apply_detail(current, stripped):
            continue
        if line[:1] not in (" ", "\t"):
            # An unindented line we do not know (a prompt, a comment): the entry is over.
            flush()
    flush()
    return tuple(entries)
