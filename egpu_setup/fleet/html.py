"""The fleet page: one self-contained HTML file, the charts on top, the table below.

Inline CSS and inline SVG only: no script, no external asset of any kind, and a Content Security
Policy (`default-src 'none'`) that forbids both should anything slip through. Every string from a
report is escaped.
"""

from __future__ import annotations

from html import escape

from egpu_setup.fleet.rows import FleetReport, MachineRow
from egpu_setup.fleet.svg import chart, h2d_lanes, tflops_lanes
from egpu_setup.fleet.text import cells as text_cells
from egpu_setup.fleet.text import detail_lines, plural, summary_line

COLUMNS = (
    "machine", "status", "device", "GPU", "connection", "link (ceiling)", "H2D GB/s",
    "TFLOPS", "AMP", "torch", "driver", "install", "time (UTC)", "age",
)  # fmt: skip
_NUMERIC = {"H2D GB/s", "TFLOPS", "age"}

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem 2rem;color:#1b1b1b;background:#fff}
h1{font-size:1.35rem;margin:0 0 .2rem}
h2{font-size:1.05rem;margin:1.4rem 0 .3rem}
p.summary{margin:.2rem 0 .2rem;color:#333;font-size:1rem}
p.meta{margin:0 0 .8rem;color:#666;font-size:.85rem}
svg.chart{display:block;max-width:100%;height:auto;font-family:system-ui,sans-serif}
table{border-collapse:collapse;width:100%;margin-top:.4rem;font-size:13px}
th,td{border:1px solid #ccc;padding:.25rem .45rem;text-align:left;vertical-align:top;
white-space:nowrap}
tr.detail td{white-space:normal;border-top:none;padding:.15rem .45rem .35rem 1.2rem;
font-size:.92em}
th{background:#f0f0f0;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.status{font-weight:600;white-space:nowrap}
tr td:first-child{border-left-width:6px}
tr.ok td:first-child{border-left-color:#2e7d32}
tr.failed td:first-child{border-left-color:#c62828}
tr.suspect td:first-child{border-left-color:#6a1b9a}
tr.unverified td:first-child{border-left-color:#ef8f00}
tr.cpu td:first-child{border-left-color:#607d8b}
tr.failed td.status{color:#c62828}
tr.suspect td.status{color:#6a1b9a}
tr.detail div.failure{color:#c62828}
tr.detail div.flag{color:#6a1b9a}
tr.detail div.warning{color:#8a5a00}
tr.detail div.note{color:#555}
details{margin-top:1rem}
code{font-family:ui-monospace,monospace;font-size:.9em}
"""

# a row's CSS class by its status (fleet/rows.py STATUSES)
_ROW_CLASS = {
    "ok": "ok",
    "failed": "failed",
    "suspect": "suspect",
    "reboot required": "unverified",
    "not verified": "unverified",
    "cpu only": "cpu",
}


def cells(row: MachineRow) -> tuple[str, ...]:
    """The row's cells, in the page's COLUMNS order."""
    return text_cells(row, COLUMNS)


def _row(row: MachineRow) -> str:
    """The machine's row, then (when there is any) a row below it with every failure, report
    set aside, warning and note, one line each: the message in full, not squeezed in a cell."""
    tds = []
    for name, cell in zip(COLUMNS, cells(row), strict=True):
        cls = ' class="num"' if name in _NUMERIC else ' class="status"' if name == "status" else ""
        tds.append(f"<td{cls}>{escape(cell)}</td>")
    state = _ROW_CLASS[row.status]
    title = escape(f"{row.folder}: {', '.join(row.sources) or 'no reports'}")
    out = f'<tr class="{state}" title="{title}">{"".join(tds)}</tr>'
    lines = "".join(f'<div class="{kind}">{escape(text)}</div>' for kind, text in detail_lines(row))
    if lines:
        out += f'\n<tr class="{state} detail"><td colspan="{len(COLUMNS)}">{lines}</td></tr>'
    return out


def render_html(report: FleetReport, title: str = "egpu-setup fleet report") -> str:
    """The page: title and summary, the two charts, the table, the files skipped."""
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = "\n".join(_row(r) for r in report.rows)
    skipped = ""
    if report.skipped:
        items = "".join(
            f"<li><code>{escape(p)}</code>: {escape(why)}</li>" for p, why in report.skipped
        )
        n = plural(len(report.skipped), "file")
        skipped = f"<details><summary>{n} skipped</summary><ul>{items}</ul></details>"
    when = report.now.strftime("%Y-%m-%d %H:%M UTC") if report.now else ""
    strict = (
        "--strict counts a CPU-only verify as ok (--cpu-ok)"
        if report.cpu_ok
        else "--strict: ok means verified on the eGPU; a CPU-only verify is not"
    )
    h2d = chart(
        h2d_lanes(report.rows),
        kind="host-to-device bandwidth",
        unit="GB/s",
        floor_label="profile minimum",
        band=True,
    )
    tflops = chart(
        tflops_lanes(report.rows),
        kind="matmul throughput",
        unit="TFLOPS",
        floor_label="profile's rate",
        band=False,
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
        f"<title>{escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{escape(title)}</h1>\n"
        f'<p class="summary">{escape(summary_line(report))}</p>\n'
        f'<p class="meta">{escape(when)} · {escape(strict)}</p>\n'
        "<h2>Host-to-device bandwidth (pinned copy) against the link's ceiling</h2>\n"
        f"{h2d}\n"
        "<h2>Matmul throughput against the profile</h2>\n"
        f"{tflops}\n"
        "<h2>Machines</h2>\n"
        f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>\n"
        f"{skipped}\n</body>\n</html>\n"
    )
