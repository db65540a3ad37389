"""The fleet table for a terminal: aligned columns, each machine's problems on lines below it.

Every value passes through `plain`: hostnames, check ids and messages come from machines we do
not control, and an escape sequence among them must not drive the terminal.
"""

from __future__ import annotations

from egpu_setup.fleet.enclosures import EnclosureRow
from egpu_setup.fleet.rows import FleetReport, MachineRow
from egpu_setup.text import plain

COLUMNS = (
    "machine", "status", "device", "GPU", "connection", "link (ceiling)", "H2D GB/s", "TFLOPS",
    "torch", "driver", "kernels", "peak C (limit)", "throttled", "Xid", "time (UTC)", "age",
)  # fmt: skip
# The lab by enclosure (fleet/enclosures.py), below the machines when any report names one.
ENCLOSURE_COLUMNS = ("enclosure", "unique id", "machines (link)", "verdict")

# The marks before a machine's lines below its row: a failure, a report set aside or a file
# that could not be read, a warning, a note.
_MARK = {"failure": "!", "flag": "?", "warning": "~", "note": "-"}


def cell_values(row: MachineRow) -> dict[str, str]:
    """Every column either table shows, by name ("-": unknown or not measured)."""
    return {
        "machine": row.machine,
        "status": row.status,
        "device": row.device or "-",
        "GPU": gpu_text(row),
        "connection": row.connection or "-",
        "link (ceiling)": link_text(row),
        "H2D GB/s": h2d_text(row),
        "TFLOPS": tflops_text(row),
        "AMP": amp_text(row),
        "torch": row.torch or "-",
        "driver": row.driver or "-",
        "install": row.install or "-",
        "kernels": row.kernels.text() if row.kernels else "-",
        "peak C (limit)": peak_text(row),
        "throttled": duration_text(row.health.throttle_s) if row.health else "-",
        "Xid": xid_text(row),
        "time (UTC)": row.time.strftime("%Y-%m-%d %H:%M") if row.time else "-",
        "age": age_text(row.age_s),
    }


def cells(row: MachineRow, columns: tuple[str, ...] = COLUMNS) -> tuple[str, ...]:
    """The row's cells, in `columns` order (the terminal's by default)."""
    values = cell_values(row)
    return tuple(values[c] for c in columns)


def gpu_text(row: MachineRow) -> str:
    """The GPU's name without the vendor every row shares (JSON keeps the name as reported)."""
    name = row.gpu or "-"
    return name[len("NVIDIA ") :] if name.startswith("NVIDIA ") else name


def link_text(row: MachineRow) -> str:
    """The trained link, and the ceiling when it differs: "2.5 GT/s x1 of 8 GT/s x4" (trained
    below it), "16 GT/s x4, tunnel 8 GT/s x4" (the GPU's own link to the enclosure's bridge is
    faster than the tunnel behind it carries)."""
    if row.link is None:
        return "-"
    text = row.link.text()
    ceiling = row.ceiling
    if ceiling is None or ceiling.text() == text:
        return text
    trained = (row.link.speed_gts or 0) * (row.link.width or 0)
    if trained > (ceiling.speed_gts or 0) * (ceiling.width or 0):
        return f"{text}, tunnel {ceiling.text()}"
    return f"{text} of {ceiling.text()}"


def h2d_text(row: MachineRow) -> str:
    m = row.h2d
    if m.value is None:
        return "-"
    parts = [f"{m.value:.2f}"]
    if m.ceiling:
        parts.append(f"of {m.ceiling:.2f}")
    if m.expected is not None:
        parts.append(f"min {m.expected:g}")
    return " ".join(parts)


def tflops_text(row: MachineRow) -> str:
    m = row.tflops
    if m.value is None:
        return "-"
    text = f"{_sig(m.value)} {m.label or ''}".rstrip()
    return text + (f" of {_sig(m.expected)}" if m.expected else "")


def amp_text(row: MachineRow) -> str:
    """The AMP training result, with the device when it was the CPU: a CPU's "ok" says torch
    trains there, nothing about an eGPU."""
    if row.amp is None:
        return "-"
    return f"{row.amp} (cpu)" if row.device == "cpu" and row.amp != "skipped" else row.amp


def peak_text(row: MachineRow) -> str:
    """The term's peak temperature against the profile's limit: "91 (88)"."""
    h = row.health
    if h is None or h.peak_c is None:
        return "-"
    return f"{h.peak_c:g}" + (f" ({h.limit_c:g})" if h.limit_c is not None else "")


def duration_text(seconds: float) -> str:
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return f"{seconds / 3600:.1f} h"


def xid_text(row: MachineRow) -> str:
    """The term's Xid events by code, most frequent first ("79 x2, 13 x1"); "0" when the
    sampler ran and saw none."""
    if row.health is None:
        return "-"
    return ", ".join(f"{code} x{n}" for code, n in row.health.xids) or "0"


def enclosure_cells(row: EnclosureRow) -> tuple[str, ...]:
    """One enclosure's cells, in ENCLOSURE_COLUMNS order."""
    met = ", ".join(f"{m.machine} ({m.link.text() if m.link else '?'})" for m in row.meetings)
    return (row.enclosure.model, row.enclosure.unique_id, met, row.verdict())


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0:
        return "future"  # a laptop whose clock runs ahead: said, not hidden
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 48 * 3600:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} d"


def detail_lines(row: MachineRow) -> list[tuple[str, str]]:
    """(kind, text) of every line shown below the row."""
    out = [("failure", p.text()) for p in row.failures]
    out += [("flag", p.text()) for p in row.flags]
    out += [("warning", p.text()) for p in row.warnings]
    out += [("note", n) for n in row.notes]
    return out


def summary_line(report: FleetReport) -> str:
    s = report.summary
    parts = [f"{s['ok']} ok", f"{s['failed']} failed", f"{s['unverified']} not verified"]
    if s["cpu"]:
        parts.append(f"{s['cpu']} cpu only" + (" (counted ok)" if report.cpu_ok else ""))
    if s["suspect"]:
        parts.append(f"{s['suspect']} suspect")
    return f"{plural(s['hosts'], 'machine')}: " + ", ".join(parts)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def render_text(report: FleetReport) -> str:
    """An aligned plain-text table, problems under each row, and a one-line summary."""
    table = [COLUMNS, *(tuple(plain(c) for c in cells(r)) for r in report.rows)]
    widths = _widths(table)
    lines = [_line(COLUMNS, widths)]
    for row, text_row in zip(report.rows, table[1:], strict=True):
        lines.append(_line(text_row, widths))
        lines += [f"    {_MARK[kind]} {plain(text)}" for kind, text in detail_lines(row)]
    boxes = report.enclosures
    if boxes:
        lines += ["", *_aligned([ENCLOSURE_COLUMNS, *(enclosure_cells(b) for b in boxes)])]
    lines.append("")
    skipped = len(report.skipped)
    lines.append(summary_line(report) + (f"; {plural(skipped, 'file')} skipped" if skipped else ""))
    return "\n".join(lines) + "\n"


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    plain_table = [tuple(plain(c) for c in r) for r in table]
    widths = _widths(plain_table)
    return [_line(r, widths) for r in plain_table]


def _widths(table: list[tuple[str, ...]]) -> list[int]:
    return [max(len(r[i]) for r in table) for i in range(len(table[0]))]


def _line(row: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def _sig(value: float) -> str:
    """Three significant figures: 148, 61.2, 0.0131."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
