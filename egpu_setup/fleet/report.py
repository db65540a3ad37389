"""Fleet reports: merge the install/verify JSON reports of many machines into one table.

Every `egpu-setup install` and `verify` saves a JSON report under <state>/reports/ (DESIGN.md,
"Files on a provisioned machine"); the Ansible role fetches them to the controller, one folder per
host. This module reads those files (user-given report files: the host-access rule allows it),
keeps the newest install and the newest verify report of every host, and renders one row per host
as text, JSON or a self-contained HTML page.

Reports come from machines we do not control, so nothing in them is trusted: every value is
type-checked on the way in (a wrong type is "unknown", never a crash) and the HTML escapes every
string it prints, so a hostile hostname cannot inject markup.

A machine is the folder its reports were collected into (the Ansible fetch layout,
<dest>/<inventory_hostname>/...), never the hostname a report claims: a report copied into
lab-01's folder that claims to be lab-04 stays lab-01's, flagged, and cannot stand in for lab-04's
own. Reports given without such a folder fall back to the claimed hostname, told apart by the
hash of /etc/machine-id each install report records when laptops cloned from one image share it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError
from egpu_setup.text import plain

log = logging.getLogger("egpu_setup.report")

SCHEMA_REPORT = "egpu-setup/report/1"
SCHEMA_VERIFY = "egpu-setup/verify/1"
SCHEMA_INSTALL = "egpu-setup/install/1"
# The dry run and `resolve --json` print a resolution; a lab may save those too. They carry no
# outcome, so they are recognised (not "unknown file") but only fill in the planned driver/torch.
SCHEMA_RESOLUTION = "egpu-setup/resolution/1"

# A report is a few kilobytes; anything far larger is not one of ours (or is hostile).
MAX_REPORT_BYTES = 8 * 1024 * 1024

# The verify check ids behind two columns (egpu_setup/verify/_child.py): the pinned host-to-device
# copy, whose value is GB/s, and the mixed-precision training smoke run.
H2D_CHECK = "h2d-bandwidth"
AMP_CHECK = "amp-training"

# verify-20261129T164900Z.json / install-2026-11-29T16:49:00.json: the timestamp in the name is
# the fallback when a report carries no "time" key.
_NAME_TIME = re.compile(r"(\d{4}-?\d{2}-?\d{2})[T_-]?(\d{2}:?\d{2}:?\d{2})?")


@dataclass(frozen=True)
class LoadedReport:
    """One JSON report file, parsed and classified."""

    path: Path
    kind: str  # "verify" / "install" / "resolution"
    hostname: str  # who it is filed under: its fetch folder, else what it claims
    time: datetime | None
    data: Mapping[str, Any]
    claimed: str | None = None  # the hostname the report itself states
    folder: str | None = None  # the fetch folder it was collected into
    machine: str | None = None  # sha256 of the machine's /etc/machine-id, when recorded


@dataclass(frozen=True)
class HostRow:
    """One line of the fleet table: the newest install and verify outcome of one machine."""

    hostname: str
    gpu: str | None = None
    connection: str | None = None
    link: str | None = None
    driver: str | None = None
    torch: str | None = None
    h2d_gbps: float | None = None
    amp: str | None = None  # "ok" / "failed" / "skipped" / None (never ran)
    install: str | None = None  # "ok" / "changed" / "reboot required" / "failed" / "planned" / None
    verify: str | None = None  # "ok" / "failed" / None
    failures: tuple[str, ...] = ()
    time: str | None = None  # ISO time of the newest report used
    sources: tuple[str, ...] = field(default=(), compare=False)

    @property
    def ok(self) -> bool:
        """True when the machine was verified and nothing failed."""
        return self.verify == "ok" and not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "ok": self.ok,
            "gpu": self.gpu,
            "connection": self.connection,
            "link": self.link,
            "driver": self.driver,
            "torch": self.torch,
            "h2d_gbps": self.h2d_gbps,
            "amp": self.amp,
            "install": self.install,
            "verify": self.verify,
            "failures": list(self.failures),
            "time": self.time,
            "sources": list(self.sources),
        }


@dataclass(frozen=True)
class FleetReport:
    """The merged table plus what was skipped and why."""

    rows: tuple[HostRow, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (path, reason)

    @property
    def summary(self) -> dict[str, int]:
        return {
            "hosts": len(self.rows),
            "ok": sum(r.ok for r in self.rows),
            "failed": sum(bool(r.failures) for r in self.rows),
            # a host that failed to install is "failed", not also "not verified"
            "unverified": sum(r.verify is None and not r.failures for r in self.rows),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_REPORT,
            "summary": self.summary,
            "hosts": [r.to_json() for r in self.rows],
            "skipped": [{"path": p, "reason": why} for p, why in self.skipped],
        }


# -- loading ---------------------------------------------------------------------------------------


def find_report_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Every *.json file under the given directories (recursively) or the given files, sorted."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            # os.walk without followlinks: a link loop in a fetched tree cannot hang us.
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames.sort()
                found.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".json"))
        else:
            raise UsageError(
                f"report path not found: {p}",
                "pass directories holding verify-*.json / install-*.json reports",
            )
    return found


def load_report(path: Path, base: Path | None = None) -> LoadedReport:
    """Parse one report file; raises ValueError (with a reason) for anything that is not ours."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"cannot read: {exc.strerror or exc}") from exc
    if size > MAX_REPORT_BYTES:
        raise ValueError(f"too large for a report ({size} bytes)")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    except RecursionError:  # "[[[[…" nested past the parser's depth: one bad file, not all
        raise ValueError("not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    schema = data.get("schema")
    kinds = {SCHEMA_VERIFY: "verify", SCHEMA_INSTALL: "install", SCHEMA_RESOLUTION: "resolution"}
    if schema not in kinds:
        raise ValueError(f"not an egpu-setup install/verify report (schema {schema!r})")
    kind = kinds[schema]
    # `install --yes --json` prints the resolution plus the run's "result": an install outcome.
    if kind == "resolution" and isinstance(data.get("result"), dict):
        kind = "install"
    claimed, folder = _claimed(data), _folder(path, base)
    machine = data.get("machine_id")
    return LoadedReport(
        path=path,
        kind=kind,
        hostname=folder or claimed or f"? ({path.name})",
        time=_report_time(data, path),
        data=data,
        claimed=claimed,
        folder=folder,
        machine=machine if isinstance(machine, str) and _HEX64.fullmatch(machine) else None,
    )


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _claimed(data: Mapping[str, Any]) -> str | None:
    """The hostname the report states (in "host", or at the top)."""
    for candidate in (_get(data.get("host"), "hostname"), data.get("hostname")):
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()
    return None


def _folder(path: Path, base: Path | None) -> str | None:
    """The folder the controller fetched it into: <dest>/<inventory_hostname>/....json."""
    if base is None or path.parent == base:
        return None
    try:
        return path.relative_to(base).parts[0]
    except ValueError:
        return None


def _report_time(data: Mapping[str, Any], path: Path) -> datetime | None:
    for key in ("time", "finished", "finished_at", "started", "started_at"):
        value = data.get(key)
        if isinstance(value, str):
            parsed = _parse_time(value)
            if parsed is not None:
                return parsed
    m = _NAME_TIME.search(path.name)
    if m:
        day = m.group(1).replace("-", "")
        clock = (m.group(2) or "000000").replace(":", "")
        try:
            return datetime.strptime(day + clock, "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc)
        except ValueError:
            return None
    return None


def _parse_time(value: str) -> datetime | None:
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        m = re.fullmatch(r"(\d{8})T(\d{6})(?:Z|\+00:?00)?", value.strip())
        if not m:
            return None
        parsed = datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H%M%S")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def collect(paths: Sequence[str | os.PathLike[str]]) -> FleetReport:
    """Load every report under `paths` and merge them into one row per host."""
    loaded: list[LoadedReport] = []
    skipped: list[tuple[str, str]] = []
    for raw in paths:
        base = Path(raw) if Path(raw).is_dir() else None
        for path in find_report_files([raw]):
            try:
                loaded.append(load_report(path, base))
            except ValueError as exc:
                log.warning("skipping %s: %s", path, exc)
                skipped.append((str(path), str(exc)))
    if not loaded:
        where = ", ".join(str(p) for p in paths)
        raise UsageError(
            f"no egpu-setup reports found in {where}",
            "reports are saved by `egpu-setup verify` under /var/lib/egpu-setup/reports/; "
            "fetch them with the Ansible role or copy them here",
        )
    return FleetReport(rows=merge(loaded), skipped=tuple(skipped))


def merge(reports: Iterable[LoadedReport]) -> tuple[HostRow, ...]:
    """One row per machine from its newest verify and newest install report, sorted by name."""
    reports = list(reports)
    by_host: dict[str, dict[str, LoadedReport]] = {}
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    # a claimed hostname that several machines share (no fetch folder tells them apart)
    machines: dict[str, set[str]] = {}
    for rep in reports:
        if rep.folder is None and rep.machine is not None:
            machines.setdefault(rep.hostname, set()).add(rep.machine)
    for rep in reports:
        key = rep.hostname
        if rep.folder is None and rep.machine and len(machines.get(key, ())) > 1:
            key = f"{key} (machine {rep.machine[:12]})"
        slot = by_host.setdefault(key, {})
        prev = slot.get(rep.kind)
        if prev is None or (rep.time or oldest, str(rep.path)) >= (
            prev.time or oldest,
            str(prev.path),
        ):
            slot[rep.kind] = rep
    return tuple(_row(name, by_host[name]) for name in sorted(by_host, key=str.lower))


def _row(hostname: str, reps: Mapping[str, LoadedReport]) -> HostRow:
    verify = reps.get("verify")
    install = reps.get("install")
    plan = reps.get("resolution")
    # Newest first: host facts from the latest report win.
    ordered = sorted(
        (r for r in (verify, install, plan) if r is not None),
        key=lambda r: r.time or datetime.min.replace(tzinfo=timezone.utc),
        reverse=True,
    )
    hosts = [r.data.get("host") for r in ordered]
    device = verify.data.get("device") if verify else None

    gpu = _first_str(*(_get(h, "gpu", "name") for h in hosts), *(_get(h, "gpu") for h in hosts))
    gpu = gpu or _first_str(_get(device, "name"), _get(plan.data if plan else None, "gpu", "name"))
    connection = _first_str(*(_get(h, "connection") for h in hosts), _get(device, "connection"))
    link = _first(*(_format_link(_get(h, "link")) for h in hosts))
    driver = _first_str(
        *(_get(h, "driver") for h in hosts),
        *(_get(h, "driver", "version") for h in hosts),
        _get(device, "driver"),
        _get(install.data if install else None, "driver", "installed"),
    )
    torch = _first_str(
        *(_get(h, "torch") for h in hosts),
        *(_get(h, "torch", "version") for h in hosts),
        _get(device, "torch"),
        _get(device, "torch_version"),
    )
    for rep in (install, plan):  # what the resolution chose, when nothing newer says
        if rep is not None:
            gpu = gpu or _first_str(_get(rep.data, "gpu", "name"))
            driver = driver or _first_str(_get(rep.data, "driver", "installed"))
            torch = torch or _first_str(_get(rep.data, "torch", "version"))

    failures, h2d, amp, verify_state = _verify_columns(verify)
    install_state = _install_state(install)
    if install is not None and install_state == "failed":
        failures.insert(0, _install_failure(install))
    for rep in ordered:  # filed under one machine, claiming to be another: someone must look
        if rep.folder and rep.claimed and rep.claimed != rep.folder:
            failures.append(f"{rep.path.name} claims to be {rep.claimed}")

    newest = ordered[0].time if ordered and ordered[0].time else None
    return HostRow(
        hostname=hostname,
        gpu=gpu,
        connection=connection,
        link=link,
        driver=driver,
        torch=torch,
        h2d_gbps=h2d,
        amp=amp,
        install=install_state or ("planned" if plan else None),
        verify=verify_state,
        failures=tuple(failures),
        time=newest.isoformat(timespec="seconds") if newest else None,
        sources=tuple(str(r.path) for r in ordered),
    )


def _verify_columns(
    verify: LoadedReport | None,
) -> tuple[list[str], float | None, str | None, str | None]:
    """(failed checks, host-to-device GB/s, AMP result, verify state) of a verify report."""
    failures: list[str] = []
    h2d: float | None = None
    amp: str | None = None
    if verify is None:
        return failures, h2d, amp, None
    checks = [c for c in _list(verify.data.get("checks")) if isinstance(c, dict)]
    for check in checks:
        cid = str(check.get("id") or "?")
        ok = check.get("ok")
        if cid == H2D_CHECK and h2d is None:
            h2d = _number(check.get("value"))
        if cid == AMP_CHECK and amp is None:
            amp = "ok" if ok is True else "skipped" if ok is None else "failed"
        if ok is False:
            failures.append(f"verify:{cid}")
    state = "ok" if verify.data.get("ok") is True and not failures else "failed"
    if state == "failed" and not failures:
        failures.append("verify")
    return failures, h2d, amp, state


def _install_failure(install: LoadedReport) -> str:
    """`install:<the step that failed>`, as far as the report says which."""
    result_steps = _list(_get(install.data, "result", "steps"))
    failed = [st for st in result_steps if isinstance(st, dict) and st.get("status") == "failed"]
    step = _first_str(
        _get(failed[0], "kind") if failed else None,
        _get(install.data, "failed_step"),
        _get(install.data, "failed_step", "id"),
        _get(install.data, "failed_step", "kind"),
    )
    return f"install:{step}" if step else "install"


def _install_state(install: LoadedReport | None) -> str | None:
    if install is None:
        return None
    data = install.data
    result = data.get("result")
    if isinstance(result, dict):  # the `install --json` output itself
        steps = [st for st in _list(result.get("steps")) if isinstance(st, dict)]
        if result.get("reboot_required"):
            return "reboot required"
        if any(st.get("status") == "failed" for st in steps):
            return "failed"
        return "changed" if any(st.get("status") == "done" for st in steps) else "ok"
    code = data.get("exit_code")
    if code == 3 or data.get("reboot_required") is True:
        return "reboot required"
    if data.get("ok") is False or (isinstance(code, int) and code not in (0, 3)):
        return "failed"
    if data.get("ok") is True or code == 0:
        changed = data.get("changed")
        return "changed" if changed not in (None, False, 0, []) else "ok"
    return None


def _format_link(link: Any) -> str | None:
    """'16 GT/s x4' (and '/ 16 GT/s x16' when it trained below the card's maximum)."""
    if isinstance(link, str):
        return link.strip() or None
    if not isinstance(link, dict):
        return None
    speed, width = _number(link.get("speed_gts")), _number(link.get("width"))
    if speed is None and width is None:
        return None
    text = f"{_num_text(speed)} GT/s x{_num_text(width)}"
    mspeed, mwidth = _number(link.get("max_speed_gts")), _number(link.get("max_width"))
    if (mspeed, mwidth) != (None, None) and (mspeed, mwidth) != (speed, width):
        text += f" (max {_num_text(mspeed)} GT/s x{_num_text(mwidth)})"
    return text


def _num_text(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:g}"


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    # bool is an int subclass; true is not a bandwidth.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None  # NaN is unknown


def _first_str(*values: Any) -> str | None:
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{v:g}"
        if isinstance(v, str) and v.strip():
            return v.strip()
    return None


def _first(*values: str | None) -> str | None:
    return next((v for v in values if v), None)


# -- rendering -------------------------------------------------------------------------------------

COLUMNS = ("host", "GPU", "connection", "link", "driver", "torch", "H2D GB/s", "AMP", "failures")


def _cells(row: HostRow) -> tuple[str, ...]:
    failures = ", ".join(row.failures)
    if not failures and row.verify != "ok":
        # Only failures belong here: an install that changed things and went fine is no failure,
        # it is merely unproven until verify runs. A pending reboot is why it has not run yet.
        failures = "not verified"
        if row.install == "reboot required":
            failures += " (reboot required)"
    failures = failures or "-"
    return (
        row.hostname,
        row.gpu or "-",
        row.connection or "-",
        row.link or "-",
        row.driver or "-",
        row.torch or "-",
        f"{row.h2d_gbps:.2f}" if row.h2d_gbps is not None else "-",
        row.amp or "-",
        failures,
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _summary_line(report: FleetReport) -> str:
    s = report.summary
    return (
        f"{_plural(s['hosts'], 'host')}: {s['ok']} ok, {s['failed']} failed, "
        f"{s['unverified']} not verified"
    )


def render_text(report: FleetReport) -> str:
    """An aligned plain-text table plus a one-line summary."""
    rows = [COLUMNS, *(tuple(plain(c) for c in _cells(r)) for r in report.rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    lines.append(
        _summary_line(report)
        + (f"; {_plural(len(report.skipped), 'file')} skipped" if report.skipped else "")
    )
    return "\n".join(lines) + "\n"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2rem;color:#1b1b1b;background:#fff}
h1{font-size:1.3rem;margin:0 0 .3rem}
p.summary{margin:.2rem 0 1rem;color:#444}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f0f0f0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.ok td:first-child{border-left:6px solid #2e7d32}
tr.failed td:first-child{border-left:6px solid #c62828}
tr.unverified td:first-child{border-left:6px solid #f9a825}
tr.failed td.failures{color:#c62828;font-weight:600}
details{margin-top:1rem}
code{font-family:ui-monospace,monospace;font-size:.9em}
"""


def render_html(report: FleetReport, title: str = "egpu-setup fleet report") -> str:
    """A self-contained HTML page: inline CSS, no scripts, no external assets, all text escaped."""
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body: list[str] = []
    for row in report.rows:
        state = "ok" if row.ok else "failed" if row.failures else "unverified"
        cells = _cells(row)
        tds = []
        for i, cell in enumerate(cells):
            cls = ' class="num"' if COLUMNS[i] == "H2D GB/s" else ""
            cls = ' class="failures"' if COLUMNS[i] == "failures" else cls
            tds.append(f"<td{cls}>{escape(cell)}</td>")
        title_attr = escape(f"{row.time or 'time unknown'} from {', '.join(row.sources)}")
        body.append(f'<tr class="{state}" title="{title_attr}">{"".join(tds)}</tr>')
    skipped = ""
    if report.skipped:
        items = "".join(
            f"<li><code>{escape(p)}</code>: {escape(why)}</li>" for p, why in report.skipped
        )
        n = _plural(len(report.skipped), "file")
        skipped = f"<details><summary>{n} skipped</summary><ul>{items}</ul></details>"
    summary = _summary_line(report)
    # default-src 'none' also forbids scripts and remote loads should anything slip through.
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
        f"<title>{escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f'<h1>{escape(title)}</h1>\n<p class="summary">{escape(summary)}</p>\n'
        f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n"
        f"</table>\n{skipped}\n</body>\n</html>\n"
    )
