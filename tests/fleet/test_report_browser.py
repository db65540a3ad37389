"""The fleet page in a real browser: Debian's headless Chromium renders it to a PNG (no script
runs: the page has none and its CSP forbids any), decoded here with zlib and struct.

The screenshot must show the charts, not only text: the green bars of the good machines, the
red one of lab-04 stuck on an x1 link, the pale band of each link's ceiling; and the page must
draw exactly one mark per machine in each chart: in its markup, and in the pixels (counted down
the plots' first pixel column; a page with one bar left out counts one fewer). A blank page put
through the same checks fails them, so they can tell a rendered chart from nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from egpu_setup.detect.facts import Link as FactLink
from egpu_setup.fleet import svg
from egpu_setup.fleet.html import render_html
from egpu_setup.fleet.rows import collect
from helpers import tiers
from helpers.fleet_reports import Page
from helpers.png import decode

DATA = Path(__file__).parents[1] / "data" / "reports"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
WINDOW = (1600, 1300)

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)"
    ),
]


def _rgb(colour: str) -> tuple[int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def screenshot(page: Path, out: Path, tmp: Path) -> Path:
    """Chromium, headless, as root (--no-sandbox), with a profile of its own and nothing that
    reaches out (no QUIC, no background networking, component updates or sync)."""
    tiers.require("chromium")
    profile = tmp / "chromium-profile"
    profile.mkdir(parents=True)
    argv = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}", f"--screenshot={out}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", page.as_uri(),
    ]  # fmt: skip
    env = {**os.environ, "HOME": str(tmp)}  # its caches land in the test's folder
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
    return out


def looks_rendered(png: Path) -> tuple[bool, dict[str, int]]:
    """Whether a screenshot shows more than a blank page: enough ink and colours, and bars in
    the chart's colours."""
    img = decode(png)
    pixels = img.pixels()
    total = img.width * img.height
    stats = {
        "non_white": total - pixels[(255, 255, 255)],
        "colours": len(pixels),
        "good": pixels[_rgb(svg.GOOD)],
        "bad": pixels[_rgb(svg.BAD)],
        "band": pixels[_rgb(svg.BAND)],
    }
    ok = (
        (img.width, img.height) == WINDOW
        and stats["non_white"] > total // 50
        and stats["colours"] > 64
        and stats["good"] > 2000
        and stats["bad"] > 50
        and stats["band"] > 2000
    )
    return ok, stats


def _first_x(row: bytes, channels: int, colour: tuple[int, int, int]) -> int | None:
    """The first pixel of a scanline in exactly this colour."""
    at = row.find(bytes(colour))
    while at >= 0 and at % channels:
        at = row.find(bytes(colour), at + 1)
    return at // channels if at >= 0 else None


def marks_drawn(png: Path) -> int:
    """The marks a screenshot shows, counted down the pixel column one pixel into the plots
    (where the legend's first swatch starts, as every bar and stub does) from the top to the
    table's header row: runs of a mark colour, the two legend swatches included."""
    img = decode(png)
    header = (0xF0, 0xF0, 0xF0)  # the th background (fleet/html.py)
    top = next(y for y, row in enumerate(img.rows) if row.count(bytes(header)) > 100)
    starts = [_first_x(row, img.channels, _rgb(svg.GOOD)) for row in img.rows[:top]]
    x = min(v for v in starts if v is not None) + 1
    colours = {_rgb(c) for c in (svg.GOOD, svg.LOW, svg.BAD, svg.NEUTRAL, svg.MISSING)}
    runs, inside = 0, False
    for y in range(top):
        now = img.pixel(x, y) in colours
        runs += now and not inside
        inside = now
    return runs


def test_the_page_renders_charts_with_one_mark_per_machine(tmp_path: Path) -> None:
    report = collect([DATA / "lab", DATA / "real"], now=NOW)
    html = render_html(report, title="Lab 3.12")
    page = tmp_path / "lab.html"
    page.write_text(html)
    p = Page()
    p.feed(html)
    machines = [r.machine for r in report.rows]
    assert len(machines) == 8
    assert p.marks == {"host-to-device bandwidth": machines, "matmul throughput": machines}

    png = screenshot(page, tmp_path / "lab.png", tmp_path)
    ok, stats = looks_rendered(png)
    assert ok, stats
    # drawn, not only written: two legend swatches and one mark per machine in each chart
    assert marks_drawn(png) == 2 + 2 * len(machines)

    # the control: a blank page fails the same checks
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    ok, stats = looks_rendered(screenshot(blank, tmp_path / "blank.png", tmp_path / "b"))
    assert not ok and stats["non_white"] == 0, stats


@pytest.mark.slow
def test_the_box_degraded_on_every_laptop_stands_out_on_the_page(tmp_path: Path) -> None:
    """The enclosure table as Chromium draws it: the flagged box's row carries the failed
    colour's left border; the same lab with that box's laptops on a full link draws none."""
    from fleet.test_report_term import NOW as TERM_NOW
    from fleet.test_report_term import X1, _machine

    failed = bytes((0xC6, 0x28, 0x28))  # tr.failed td:first-child (fleet/html.py)
    header = bytes((0xF0, 0xF0, 0xF0))  # th: the enclosure table's header is the page's last

    def red_pixels(name: str, link: FactLink | None) -> int:
        """Pixels of the failed colour below the last table header: the enclosure rows."""
        dest = tmp_path / name / "reports"
        for laptop in ("lab-a", "lab-b"):
            _machine(dest, laptop, "tb3-rtx3090-ubuntu2204", link)
        page = tmp_path / f"{name}.html"
        page.write_text(render_html(collect([dest], now=TERM_NOW)))
        img = decode(screenshot(page, tmp_path / f"{name}.png", tmp_path / name))
        rows = [bytes(r) for r in img.rows]
        last = max(y for y, row in enumerate(rows) if row.count(header) > 100)
        return sum(
            1
            for row in rows[last + 1 :]
            for i in range(0, len(row), img.channels)
            if row[i : i + 3] == failed
        )

    flagged, control = red_pixels("flagged", X1), red_pixels("control", None)
    assert (control, flagged > 100) == (0, True), (flagged, control)
