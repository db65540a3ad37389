"""The fleet page: one self-contained HTML file, the charts on top, the table below.

Inline CSS and inline SVG only: no script, no external asset of any kind, and a Content Security
Policy (`default-src 'none'`) that forbids both should anything slip through. Drawn by a Jinja2
template with autoescape on (https://jinja.palletsprojects.com/en/stable/api/#autoescaping): every
value from a report is escaped where it lands, and only the charts (fleet/svg.py, which escapes
its own text) and the fixed stylesheet are passed in as markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from egpu_setup.fleet.rows import FleetReport, MachineRow
from egpu_setup.fleet.svg import chart, h2d_lanes, tflops_lanes
from egpu_setup.fleet.text import (
    ENCLOSURE_COLUMNS,
    detail_lines,
    enclosure_cells,
    plural,
    summary_line,
)
from egpu_setup.fleet.text import cells as text_cells

if TYPE_CHECKING:
    import jinja2

COLUMNS = (
    "machine", "status", "device", "GPU", "connection", "link (ceiling)", "H2D GB/s",
    "TFLOPS", "AMP", "torch", "driver", "install", "kernels", "peak C (limit)", "throttled",
    "Xid", "time (UTC)", "age",
)  # fmt: skip
_NUMERIC = {"H2D GB/s", "TFLOPS", "age", "peak C (limit)", "throttled"}

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


_PAGE = """\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{{ title }}</title>
<style>{{ css }}</style>
</head>
<body>
<h1>{{ title }}</h1>
<p class="summary">{{ summary }}</p>
<p class="meta">{{ when }} · {{ strict }}</p>
<h2>Host-to-device bandwidth (pinned copy) against the link's ceiling</h2>
{{ h2d }}
<h2>Matmul throughput against the profile</h2>
{{ tflops }}
<h2>Machines</h2>
<table>
<thead><tr>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in rows -%}
<tr class="{{ row.state }}" title="{{ row.title }}">
{%- for cls, cell in row.cells %}<td{% if cls %} class="{{ cls }}"{% endif %}>{{ cell }}</td>
{%- endfor %}</tr>
{%- if row.lines %}
<tr class="{{ row.state }} detail"><td colspan="{{ columns|length }}">
{%- for kind, text in row.lines %}<div class="{{ kind }}">{{ text }}</div>{% endfor -%}
</td></tr>
{%- endif %}
{% endfor -%}
</tbody>
</table>
{% if enclosures -%}
<h2>Enclosures: the machines each one met, and the link it trained there</h2>
<table class="enclosures">
<thead><tr>{% for c in enclosure_columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>
{% for box in enclosures -%}
<tr class="{{ box.state }}" data-enclosure="{{ box.id }}">
{%- for cell in box.cells %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor -%}
</tbody>
</table>
{% endif -%}
{% if skipped -%}
<details><summary>{{ skipped_count }} skipped</summary><ul>
{%- for path, why in skipped %}<li><code>{{ path }}</code>: {{ why }}</li>{% endfor -%}
</ul></details>
{%- endif %}
</body>
</html>
"""


def _template() -> jinja2.Template:
    # Imported here: jinja2 stays off the CLI startup path (tests/test_startup.py).
    import jinja2

    env = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    return env.from_string(_PAGE)


def _row(row: MachineRow) -> dict[str, object]:
    """The machine's row, then (when there is any) a row below it with every failure, report
    set aside, warning and note, one line each: the message in full, not squeezed in a cell."""
    classes = ["num" if n in _NUMERIC else "status" if n == "status" else "" for n in COLUMNS]
    return {
        "state": _ROW_CLASS[row.status],
        "title": f"{row.folder}: {', '.join(row.sources) or 'no reports'}",
        "cells": list(zip(classes, cells(row), strict=True)),
        "lines": list(detail_lines(row)),
    }


def render_html(report: FleetReport, title: str = "egpu-setup fleet report") -> str:
    """The page: title and summary, the two charts, the table, the files skipped."""
    from markupsafe import Markup

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
    return _template().render(
        title=title,
        css=Markup(_CSS),  # our own constant stylesheet
        summary=summary_line(report),
        when=when,
        strict=strict,
        h2d=Markup(h2d),  # fleet/svg.py escapes every string it draws
        tflops=Markup(tflops),  # the same
        columns=COLUMNS,
        rows=[_row(r) for r in report.rows],
        enclosure_columns=ENCLOSURE_COLUMNS,
        enclosures=[
            {
                "state": "failed" if b.degraded_everywhere else "ok",
                "id": b.enclosure.unique_id,
                "cells": enclosure_cells(b),
            }
            for b in report.enclosures
        ],
        skipped=list(report.skipped),
        skipped_count=plural(len(report.skipped), "file"),
    )
