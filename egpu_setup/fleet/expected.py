"""Measured against expected: a machine's PCIe link and its ceiling, host-to-device bandwidth
against that ceiling and the profile's floor, matmul TFLOPS against the profile.

The rules are verify's own (egpu_setup/verify/_child.py: the PCIe payload rate per line code,
the PCIe link a Thunderbolt/USB4/OCuLink tunnel carries), imported rather than copied, so the
table and the verify that produced the numbers cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The matmul checks of verify, best first for the column: FP16 with FP32 accumulate is the rate
# profiles give (`expect.fp16_tflops`), then BF16/TF32 (judged against the same tensor rate),
# then plain FP32; "matmul-throughput" is the single check of reports before verify split them.
TFLOPS_CHECKS = (
    ("matmul-fp16", "fp16"),
    ("matmul-bf16", "bf16"),
    ("matmul-tf32", "tf32"),
    ("matmul-fp32", "fp32"),
    ("matmul-throughput", "fp16"),
)


@dataclass(frozen=True)
class Link:
    """A PCIe link: the one trained (under load, when verify saw it) and the GPU's maximum."""

    speed_gts: float | None
    width: int | None
    max_speed_gts: float | None = None
    max_width: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Link | None:
        if not isinstance(raw, dict):
            return None
        speed, width = number(raw.get("speed_gts")), number(raw.get("width"))
        if speed is None and width is None:
            return None
        mspeed, mwidth = number(raw.get("max_speed_gts")), number(raw.get("max_width"))
        return cls(speed, _int(width), mspeed, _int(mwidth))

    def text(self) -> str:
        return f"{_num(self.speed_gts)} GT/s x{_num(self.width)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "speed_gts": self.speed_gts,
            "width": self.width,
            "max_speed_gts": self.max_speed_gts,
            "max_width": self.max_width,
        }


@dataclass(frozen=True)
class Measure:
    """A measured value beside what it is judged against."""

    value: float | None
    expected: float | None = None  # the profile's floor (H2D) or rate (TFLOPS)
    ceiling: float | None = None  # what the link allows at most (H2D)
    label: str | None = None  # the precision of a TFLOPS number

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "expected": self.expected,
            "ceiling": self.ceiling,
            "label": self.label,
        }


def link_ceiling(link: Link | None, connection: str | None, h2d: float | None) -> Link | None:
    """The best link this GPU can train on this connection: its own maximum, capped by what the
    tunnel carries. A Thunderbolt link that moved more than a Thunderbolt 3/4 tunnel carries is
    a Thunderbolt 5 one (reports do not record the generation; the measurement proves it)."""
    from egpu_setup.verify._child import pcie_rate_gbs, tunnel_cap

    if link is None:
        return None
    speed = link.max_speed_gts or link.speed_gts
    width = link.max_width or link.width
    if speed is None or width is None:
        return None
    cap = tunnel_cap(connection, None)
    if cap is not None and connection == "thunderbolt" and h2d is not None:
        rate = pcie_rate_gbs(*cap)
        if rate is not None and h2d > rate:
            cap = tunnel_cap(connection, 5)
    if cap is not None:
        speed, width = min(speed, cap[0]), min(width, cap[1])
    return Link(speed, width)


def rate_gbs(link: Link | None) -> float | None:
    """The link's theoretical one-direction payload rate, GB/s."""
    from egpu_setup.verify._child import pcie_rate_gbs

    if link is None or link.speed_gts is None or link.width is None:
        return None
    rate = pcie_rate_gbs(link.speed_gts, link.width)
    return round(rate, 2) if rate is not None else None


def h2d_measure(
    check: Mapping[str, Any] | None, link: Link | None, ceiling: Link | None, connection: str | None
) -> Measure:
    """The pinned host-to-device copy against the link's ceiling and the profile's floor.

    verify puts the profile's floor in `expected`, or, with no floor for the connection, the
    rate of the link it trained at: that one is no floor and is told apart by its value."""
    from egpu_setup.verify._child import pcie_rate_gbs, tunnel_cap

    if check is None:
        return Measure(None, ceiling=rate_gbs(ceiling))
    value = number(check.get("value"))
    expected = number(check.get("expected"))
    if expected is not None and link is not None and link.speed_gts and link.width:
        cap = tunnel_cap(connection, None)
        trained = (
            (min(link.speed_gts, cap[0]), min(link.width, cap[1]))
            if cap
            else (link.speed_gts, link.width)
        )
        theory = pcie_rate_gbs(*trained)
        if theory is not None and abs(round(theory, 3) - expected) < 0.0015:
            expected = None
    return Measure(value, expected=expected, ceiling=rate_gbs(ceiling))


def tflops_measure(checks: Sequence[Mapping[str, Any]]) -> Measure:
    """The best-ranked matmul check with a number, against the rate it was judged by."""
    by_id = {str(c.get("id")): c for c in checks}
    for cid, label in TFLOPS_CHECKS:
        check = by_id.get(cid)
        if check is None or check.get("status") == "skip":
            continue
        value = number(check.get("value"))
        if value is not None:
            return Measure(value, expected=number(check.get("expected")), label=label)
    return Measure(None)


def number(value: Any) -> float | None:
    """A JSON number as a float; bools, NaN, infinities and anything else are unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _int(value: float | None) -> int | None:
    return int(value) if value is not None and value == int(value) else None


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"
