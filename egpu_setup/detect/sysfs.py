"""Pure parsers for sysfs attribute text (one value per file, as the kernel prints it)."""

from __future__ import annotations

import re

_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")
_GBPS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/s")


def parse_hex_id(text: str | None, digits: int = 4) -> str | None:
    """ "0x10de\\n" -> "10de"; anything else -> None."""
    if not text:
        return None
    m = re.fullmatch(r"\s*0x([0-9a-fA-F]+)\s*", text)
    if not m or len(m.group(1)) > digits:
        return None
    return m.group(1).lower().zfill(digits)


def parse_link_speed(text: str | None) -> float | None:
    """ "8.0 GT/s PCIe" (5.x+), "8 GT/s" (older kernels), "Unknown" -> 8.0 / None."""
    if not text:
        return None
    m = _SPEED.match(text)
    return float(m.group(1)) if m else None


def parse_gbps(text: str | None) -> float | None:
    """Thunderbolt rx_speed/tx_speed: "20.0 Gb/s" -> 20.0."""
    if not text:
        return None
    m = _GBPS.match(text)
    return float(m.group(1)) if m else None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_bool01(text: str | None) -> bool | None:
    """ "1" -> True, "0" -> False; Thunderbolt `authorized` also uses 2 (key-authorized)."""
    value = parse_int(text)
    if value is None:
        return None
    return value != 0


# PCIe generation by transfer rate (PCI Express Base Specification: 2.5/5/8/16/32/64 GT/s).
_GEN_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_generation(speed_gts: float | None) -> int | None:
    return _GEN_BY_SPEED.get(speed_gts) if speed_gts is not None else None


def pcie_speed(generation: int | None) -> float | None:
    """PCIe generation -> transfer rate (GT/s), for tools that report generations (nvidia-smi)."""
    return next((s for s, g in _GEN_BY_SPEED.items() if g == generation), None)
