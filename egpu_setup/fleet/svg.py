"""Inline SVG charts for the fleet page: one lane per machine, the measured bar against what it
should reach, so the machine stuck on a slow link is the short red bar.

- host-to-device bandwidth: the bar is the pinned copy's GB/s, the pale band behind it what the
  link allows at most (its ceiling), the dashed line the profile's floor;
- matmul TFLOPS: the bar is the best precision measured, the dashed line the profile's rate.
Every machine gets exactly one mark (`data-machine`): its bar, or a grey stub saying why there is
no number. No script, no external font or image: the page's CSP forbids both. Every string is
escaped; a hostile machine name is text, never markup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from egpu_setup.fleet.rows import MachineRow

WIDTH = 760
LABEL_W = 170  # machine names, right-aligned at its end
PLOT_X = LABEL_W + 10
PLOT_W = 380
VALUE_X = PLOT_X + PLOT_W + 10  # the number beside each bar
LANE_H = 26
BAR_H = 14
TOP = 46  # legend and axis labels above the first lane

GOOD, LOW, BAD, NEUTRAL, MISSING = "#2e7d32", "#ef8f00", "#c62828", "#607d8b", "#b0b7bd"
BAND, FLOOR = "#dbe6f0", "#222"


@dataclass(frozen=True)
class Lane:
    """One machine's lane: its value, what it is held against, and how to say it."""

    machine: str
    value: float | None
    floor: float | None  # the dashed line: the profile's minimum / rate
    band: float | None  # the pale band: the link's ceiling
    colour: str
    text: str  # beside the bar
    title: str  # the tooltip


def h2d_lanes(rows: Sequence[MachineRow]) -> list[Lane]:
    lanes = []
    for r in rows:
        m = r.h2d
        if m.value is None:
            why = "CPU verify: no GPU link" if r.device == "cpu" else _missing(r, "copy")
            lanes.append(Lane(r.machine, None, m.expected, m.ceiling, MISSING, why, why))
            continue
        parts = [f"{m.value:.2f} GB/s"]
        if m.ceiling:
            parts.append(f"{m.value / m.ceiling:.0%} of {m.ceiling:.2f}")
        if m.expected is not None:
            parts.append(f"min {m.expected:g}")
        # verify's own judgement (egpu_setup/verify/_child.py): below the floor warns, below
        # half of it fails; with no floor, under 40 % of the link's rate warns
        if m.expected:
            colour = BAD if m.value < m.expected / 2 else LOW if m.value < m.expected else GOOD
        elif m.ceiling:
            colour = LOW if m.value < 0.4 * m.ceiling else GOOD
        else:
            colour = GOOD
        title = f"{r.machine}: " + ", ".join(parts) + (f"; link {r.link.text()}" if r.link else "")
        text = " · ".join(parts)
        lanes.append(Lane(r.machine, m.value, m.expected, m.ceiling, colour, text, title))
    return lanes


def tflops_lanes(rows: Sequence[MachineRow]) -> list[Lane]:
    lanes = []
    for r in rows:
        m = r.tflops
        if m.value is None:
            why = _missing(r, "matmul")
            lanes.append(Lane(r.machine, None, m.expected, None, MISSING, why, why))
            continue
        parts = [f"{_sig(m.value)} TFLOPS {m.label or ''}".rstrip()]
        if m.expected:
            parts.append(f"{m.value / m.expected:.0%} of {_sig(m.expected)}")
        if r.device == "cpu":
            colour = NEUTRAL  # a CPU's rate is a measurement, not a verdict
            parts.append("cpu")
        elif m.expected:
            # verify's judgement: expectations are vendor peaks; below half warns, a quarter fails
            ratio = m.value / m.expected
            colour = BAD if ratio < 0.25 else LOW if ratio < 0.5 else GOOD
        else:
            colour = GOOD
        title = f"{r.machine}: " + ", ".join(parts)
        lanes.append(Lane(r.machine, m.value, m.expected, None, colour, " · ".join(parts), title))
    return lanes


def _missing(row: MachineRow, what: str) -> str:
    if row.verify is None:
        return "not verified"
    return f"no {what} measured"


def chart(lanes: Sequence[Lane], *, kind: str, unit: str, floor_label: str, band: bool) -> str:
    """One chart as an <svg> element: a legend, an axis, a lane per machine."""
    top = max([0.0] + [x for ln in lanes for x in (ln.value, ln.floor, ln.band) if x is not None])
    scale_max, step = _axis(top)
    height = TOP + LANE_H * max(1, len(lanes)) + 8

    def x(v: float) -> float:
        return PLOT_X + PLOT_W * min(v, scale_max) / scale_max

    out = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" data-chart="{escape(kind)}">',
        f"<title>{escape(kind)} per machine ({escape(unit)})</title>",
    ]
    out += _legend(floor_label, band)
    # the axis: grid lines and their numbers above the lanes
    ticks = round(scale_max / step)
    for i in range(ticks + 1):
        v = i * step
        gx = x(v)
        out.append(
            f'<line class="grid" x1="{gx:.1f}" y1="{TOP - 4}" x2="{gx:.1f}" '
            f'y2="{height - 8}" stroke="#e3e3e3" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{gx:.1f}" y="{TOP - 8}" font-size="11" fill="#666" '
            f'text-anchor="middle">{escape(_tick(v))}</text>'
        )
    out.append(
        f'<text x="{VALUE_X}" y="{TOP - 8}" font-size="11" fill="#666">{escape(unit)}</text>'
    )
    for i, ln in enumerate(lanes):
        y = TOP + i * LANE_H
        mid = y + LANE_H / 2
        bar_y = mid - BAR_H / 2
        name = escape(_short(ln.machine, 26))
        out.append(
            f'<text x="{LABEL_W}" y="{mid + 4:.1f}" font-size="12" fill="#1b1b1b" '
            f'text-anchor="end">{name}</text>'
        )
        if band and ln.band:
            out.append(
                f'<rect class="ceiling" x="{PLOT_X}" y="{bar_y - 3:.1f}" '
                f'width="{x(ln.band) - PLOT_X:.1f}" height="{BAR_H + 6}" fill="{BAND}"/>'
            )
        mark = escape(ln.machine, quote=True)
        if ln.value is None:
            out.append(
                f'<rect class="mark missing" data-machine="{mark}" x="{PLOT_X}" '
                f'y="{bar_y:.1f}" width="4" height="{BAR_H}" fill="{MISSING}">'
                f"<title>{escape(ln.title)}</title></rect>"
            )
            out.append(
                f'<text x="{PLOT_X + 10}" y="{mid + 4:.1f}" font-size="11" fill="#777" '
                f'font-style="italic">{escape(ln.text)}</text>'
            )
        else:
            width = max(2.0, x(ln.value) - PLOT_X)
            out.append(
                f'<rect class="mark measured" data-machine="{mark}" x="{PLOT_X}" '
                f'y="{bar_y:.1f}" width="{width:.1f}" height="{BAR_H}" fill="{ln.colour}">'
                f"<title>{escape(ln.title)}</title></rect>"
            )
            out.append(
                f'<text x="{VALUE_X}" y="{mid + 4:.1f}" font-size="11" fill="#333">'
                f"{escape(ln.text)}</text>"
            )
        if ln.floor is not None:
            fx = x(ln.floor)
            out.append(
                f'<line class="floor" x1="{fx:.1f}" y1="{bar_y - 4:.1f}" x2="{fx:.1f}" '
                f'y2="{bar_y + BAR_H + 4:.1f}" stroke="{FLOOR}" stroke-width="2" '
                f'stroke-dasharray="3 2"/>'
            )
    out.append("</svg>")
    return "\n".join(out)


def _legend(floor_label: str, band: bool) -> list[str]:
    y = 12
    items = [
        f'<rect x="{PLOT_X}" y="{y - 9}" width="18" height="10" fill="{GOOD}"/>',
        f'<text x="{PLOT_X + 24}" y="{y}" font-size="11" fill="#333">measured</text>',
    ]
    lx = PLOT_X + 96
    if band:
        items += [
            f'<rect x="{lx}" y="{y - 11}" width="18" height="14" fill="{BAND}"/>',
            f'<text x="{lx + 24}" y="{y}" font-size="11" fill="#333">link ceiling</text>',
        ]
        lx += 110
    items += [
        f'<line x1="{lx + 9}" y1="{y - 11}" x2="{lx + 9}" y2="{y + 3}" stroke="{FLOOR}" '
        'stroke-width="2" stroke-dasharray="3 2"/>',
        f'<text x="{lx + 18}" y="{y}" font-size="11" fill="#333">{escape(floor_label)}</text>',
    ]
    return items


def _axis(top: float) -> tuple[float, float]:
    """A round axis end above `top` and a step giving 4-6 grid lines (1, 2 or 5 x 10^k)."""
    if top <= 0:
        return 1.0, 0.25
    raw = top * 1.05 / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return step * math.ceil(top * 1.05 / step), step


def _tick(v: float) -> str:
    return f"{v:g}"


def _sig(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
