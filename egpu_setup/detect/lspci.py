"""Parse `lspci` text in the variants users paste into bug reports.

Accepted: plain, -k, -n, -nn, -nnk, -D, -v/-vv/-vvv (with or without -nn), -mm / -nnmm,
-vmm / -vmmk, lines cut by `grep` (with `--` separators from `grep -A`), prompts and other
garbage between entries (ignored), names an old pci.ids lacks ("NVIDIA Corporation Device
2b85") and non-zero PCI domains ("0001:00:00.0", "10000:e1:00.0" behind Intel VMD). What pasting
does to it is undone first: markdown backticks and `>` quote marks, and -nn lines a terminal or a
forum wrapped, with the `[10de:2206]` id (or half of it) pushed onto the next line.

`parse_gpu_mentions` reads GPUs out of text that is not lspci at all but names them with their
ids: inxi's Graphics section, NVRM's "NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1b80)", a Windows
device list ("PCI\\VEN_10DE&DEV_2C58"), an lspci line quoted inline without its address.

The class is read from its own field, never searched for in the whole line: `lspci | grep -i
3d` also matches a bridge on bus 3d (egpu-switcher's legacy grep; docs/sources.md,
"Prior eGPU tools").
Formats follow pciutils' lspci.c (show_bases, show_express) and lib/names.c.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

__all__ = ["GpuMention", "LspciEntry", "normalize_pci_address", "parse_gpu_mentions", "parse_lspci"]

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

    @property
    def is_nvidia(self) -> bool:
        """Vendor 10de, or NVIDIA by name where lspci printed no ids ("NVIDIA Corporation")."""
        if self.vendor_id is not None:
            return self.vendor_id == "10de"
        return bool(self.vendor_name and re.match(r"nvidia\b", self.vendor_name, re.I))

    @property
    def bar_problems(self) -> tuple[str, ...]:
        """Memory BARs the kernel could not place ("Memory at <unassigned>", "<ignored>").

        Left out: I/O port BARs (a GPU's legacy I/O window "Region 5: I/O ports at <unassigned>"
        is routinely unassigned on healthy machines, and nothing CUDA uses lives there), and
        "[disabled]" regions, which only say memory decoding is off, as it is with no driver bound
        (lspci.c show_bases prints the command register's state, not an allocation failure)."""
        return tuple(
            bar
            for bar in self.unassigned_bars
            if "Memory at" in bar and ("<unassigned>" in bar or "<ignored>" in bar)
        )


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


# A pasted line: markdown quote marks ("> ", " > ", "+> " of a quoted diff) and the backticks of
# inline code around it; the indentation after them is kept (it separates details from headers).
_QUOTE_RE = re.compile(r"^(?:\s{0,3}[+]?>[ ]?)+")
# An -nn header ("[0300]:" after the class) always ends in "[vvvv:dddd]": one without it was
# wrapped, by a terminal or a forum, somewhere after the class, maybe inside the id ("[10de:22").
_NN_HEADER_RE = re.compile(rf"^{_ADDR}\s+[^:\[\]]+ \[{_HEX}{{4}}\]: ")
_IDS_ANYWHERE_RE = re.compile(rf"\[{_HEX}{{4}}:{_HEX}{{4}}\]")
_HALF_ID_RE = re.compile(rf"\[{_HEX}{{0,4}}(?::{_HEX}{{0,4}})?$")
# A line that is itself lspci detail ("Subsystem: ...", "Kernel driver in use: ...").
_DETAIL_RE = re.compile(r"^[A-Za-z][\w /#-]*:(?:\s|$)")


def _clean(raw: str) -> str:
    line = _ANSI_RE.sub("", raw).replace("\x00", "").rstrip()
    line = _QUOTE_RE.sub("", line)
    if line.startswith("`"):
        line = line[1:]
    if line.endswith("`"):
        line = line[:-1]
    return line


def _unwrap(lines: list[str]) -> list[str]:
    """Join an -nn header with the line(s) its ids were wrapped onto."""
    out: list[str] = []
    for line in lines:
        prev = out[-1] if out else ""
        body = line.strip()
        if (
            body
            and _NN_HEADER_RE.match(prev.strip())
            and not _IDS_ANYWHERE_RE.search(prev)
            and not _HEADER_RE.match(body)
            and not _DETAIL_RE.match(body)
        ):
            glue = "" if _HALF_ID_RE.search(prev.rstrip()) else " "
            out[-1] = prev.rstrip() + glue + body
            continue
        out.append(line)
    return out


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

    lines = _unwrap([_clean(raw) for raw in text.splitlines()])
    for i, line in enumerate(lines):
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
        if line[:1] not in (" ", "\t") and not _wrapped_detail(lines, i):
            # An unindented line we do not know (a prompt, a comment): the entry is over.
            flush()
    flush()
    return tuple(entries)


_INDENTED_DETAIL_RE = re.compile(
    r"^[ \t]+(?:Subsystem|Kernel driver in use|Kernel modules|Capabilities|Flags|Control|Status|"
    r"Region \d+|Memory at|I/O ports at|Expansion ROM|LnkSta|LnkCap|Physical Slot|Latency|"
    r"Interrupt|NUMA node|IOMMU group|Bus):"
)


def _wrapped_detail(lines: list[str], i: int) -> bool:
    """An unindented line between two indented details is the tail of the first one, wrapped
    onto column 0 by an email client ("... ID=0001 Rev=1" / "Len=024 <?>")."""
    following = next((x for x in lines[i + 1 :] if x.strip()), "")
    line = lines[i].strip()
    prompt = _PROMPT_RE.match(line) is not None
    return bool(_INDENTED_DETAIL_RE.match(following)) and not prompt and not _HEADER_RE.match(line)


# A shell prompt or command a poster left in: "$ lspci -k", "# dmesg", "user@host:~$ ...".
_PROMPT_RE = re.compile(r"^(?:[$#%]\s|\S+@\S+?[:~]\S*\s*[$#%]\s?)")


# -- GPUs named in text that is not lspci ---------------------------------------------------------


@dataclass(frozen=True)
class GpuMention:
    """A GPU some non-lspci text names with its ids. Unknown fields are None."""

    address: str | None  # "0000:01:00.0" when the text gives it
    vendor_id: str | None
    device_id: str | None
    vendor_name: str | None = None  # "NVIDIA", "Intel"
    device_name: str | None = None  # "TU116M [GeForce GTX 1660 Ti Mobile]"
    driver: str | None = None


# inxi -G: "  Device-2: NVIDIA TU116M [GeForce GTX 1660 Ti Mobile] vendor: Lenovo" then, on the
# lines inxi wraps its output onto, "driver: nvidia v: 515.43.04", "bus-ID: 01:00.0",
# "chip-ID: 10de:2191" (smxi/inxi's -G output; the chip-ID can be several lines down).
_INXI_DEVICE_RE = re.compile(r"^\s*Device-\d+:\s+(?P<text>.+?)(?:\s+(?:vendor|driver):\s|$)")
_INXI_FIELD_RE = re.compile(
    rf"\b(?:(?P<key>bus-ID|chip-ID|driver):\s+(?P<value>(?:{_ADDR})|(?:{_HEX}{{4}}:{_HEX}{{4}})|[\w-]+))"
)
# NVRM: "The NVIDIA GPU 0000:2c:00.0 (PCI ID: 10de:1d16)", possibly over two lines.
_NVRM_GPU_RE = re.compile(
    rf"NVIDIA GPU (?P<addr>{_ADDR})\s*(?:NVRM:\s*)?"
    rf"\(PCI ID: (?P<ven>{_HEX}{{4}}):(?P<dev>{_HEX}{{4}})\)"
)
# Windows (Get-PnpDevice): "NVIDIA GeForce RTX 5090 Laptop GPU   PCI\VEN_10DE&DEV_2C58&SUBSYS_..."
_PNP_RE = re.compile(
    rf"^(?P<name>\S.*?)\s+PCI\\VEN_(?P<ven>{_HEX}{{4}})&DEV_(?P<dev>{_HEX}{{4}})", re.I
)
# An lspci line quoted inline, without its address: "3D controller: NVIDIA Corporation GV100GL
# [Tesla PG500-216] [10de:1df0]".
_INLINE_RE = re.compile(
    r"(?P<cls>VGA compatible controller|3D controller|Display controller)(?: \[03\d\d\])?: "
    rf"(?P<text>[^`\[\]]+(?:\[[^\]]*\][^`\[\]]*)*?)\s*\[(?P<ven>{_HEX}{{4}}):(?P<dev>{_HEX}{{4}})\]"
)
# batocera's NVIDIA driver picker logs "Checking card: <name> with ID: <device id>".
_CARD_ID_RE = re.compile(rf"Checking card:\s+(?P<name>.+?)\s+with ID:\s*(?P<dev>{_HEX}{{4}})\b")


def _inxi(lines: list[str]) -> list[GpuMention]:
    out = []
    blocks: list[list[str]] = []
    for line in lines:
        if _INXI_DEVICE_RE.match(line):
            blocks.append([line])
        elif blocks and line.startswith((" ", "\t")) and not re.match(r"^\s*\w[\w-]*:\s*$", line):
            if re.match(r"^\s*(?:Display|API|Monitor|Audio|Info|Device-\d+):", line):
                blocks.append([])  # inxi's next item: not this device's lines
            else:
                blocks[-1].append(line)
        elif blocks:
            blocks.append([])
    for block in blocks:
        if not block:
            continue
        m = _INXI_DEVICE_RE.match(block[0])
        if m is None:
            continue
        fields: dict[str, str] = {}
        for line in block:
            for f in _INXI_FIELD_RE.finditer(line):
                fields.setdefault(f["key"], f["value"])
        chip = fields.get("chip-ID", "")
        ven, _, dev = chip.partition(":")
        vendor, _, name = m["text"].partition(" ")
        out.append(
            GpuMention(
                address=normalize_pci_address(fields.get("bus-ID", "")),
                vendor_id=ven.lower() or None,
                device_id=dev.lower() or None,
                vendor_name=vendor or None,
                device_name=name.strip() or None,
                driver=fields.get("driver"),
            )
        )
    return out


def parse_gpu_mentions(text: str) -> tuple[GpuMention, ...]:
    """GPUs that text other than lspci names with ids (inxi, NVRM, Windows, inline lspci)."""
    if not isinstance(text, str):
        return ()
    lines = [_clean(raw) for raw in text.splitlines()]
    found = _inxi(lines)
    joined = re.sub(r"\s+", " ", "\n".join(lines))
    for hit in _NVRM_GPU_RE.finditer(joined):
        found.append(
            GpuMention(normalize_pci_address(hit["addr"]), hit["ven"].lower(), hit["dev"].lower())
        )
    for line in lines:
        if (m := _PNP_RE.search(line)) is not None:
            found.append(
                GpuMention(None, m["ven"].lower(), m["dev"].lower(), device_name=m["name"].strip())
            )
        elif (m := _INLINE_RE.search(line)) is not None and not _HEADER_RE.match(line.strip()):
            vendor, device = _split_vendor_device(m["text"])
            found.append(GpuMention(None, m["ven"].lower(), m["dev"].lower(), vendor, device))
        elif (m := _CARD_ID_RE.search(line)) is not None:
            found.append(GpuMention(None, None, m["dev"].lower(), device_name=m["name"].strip()))
    seen: set[tuple[str | None, str | None, str | None]] = set()
    out = []
    for g in found:
        key = (g.address, g.vendor_id, g.device_id)
        if key not in seen:
            seen.add(key)
            out.append(g)
    return tuple(out)
