"""Decode a PNG with the standard library (zlib, struct): enough to tell a rendered page from a
blank one, without an imaging library.

Follows the PNG specification (W3C, "Portable Network Graphics (PNG) Specification", third
edition): the 8-byte signature, length/type/data/CRC chunks, IHDR, the zlib stream of the IDAT
chunks, one filter byte per scanline (None, Sub, Up, Average, Paeth). Only what a browser's
screenshot uses: bit depth 8, colour type 2 (RGB) or 6 (RGBA), no interlacing.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    channels: int  # 3 (RGB) or 4 (RGBA)
    rows: tuple[bytes, ...]  # unfiltered scanlines

    def pixels(self) -> Counter[tuple[int, int, int]]:
        """How many pixels of each RGB colour (alpha ignored: screenshots are opaque)."""
        count: Counter[tuple[int, int, int]] = Counter()
        n = self.channels
        for row in self.rows:
            count.update(zip(row[0::n], row[1::n], row[2::n], strict=True))
        return count

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        row, n = self.rows[y], self.channels
        return (row[x * n], row[x * n + 1], row[x * n + 2])


def decode(path: Path) -> Image:
    data = path.read_bytes()
    if data[:8] != SIGNATURE:
        raise ValueError(f"{path}: not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if (
            zlib.crc32(kind + body)
            != struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        ):
            raise ValueError(f"{path}: bad CRC in {kind!r}")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None:
        raise ValueError(f"{path}: no IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"{path}: unsupported PNG (depth {depth}, colour type {colour})")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows: list[bytes] = []
    prev: bytes | bytearray = bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), prev, channels)
        rows.append(bytes(line))
        prev = line
    return Image(width, height, channels, tuple(rows))


def _unfilter(kind: int, line: bytearray, prev: bytes | bytearray, bpp: int) -> bytearray:
    n = len(line)
    if kind == 0:
        return line
    if kind == 1:  # Sub
        for i in range(bpp, n):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:  # Up
        for i in range(n):
            line[i] = (line[i] + prev[i]) & 0xFF
    elif kind == 3:  # Average
        for i in range(n):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif kind == 4:  # Paeth
        for i in range(n):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            line[i] = (line[i] + pred) & 0xFF
    else:
        raise ValueError(f"unknown PNG filter {kind}")
    return line
