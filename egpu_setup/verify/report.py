"""The verify report: the JSON contract, the table, and the file a lab collects.

The table is built from three pieces (header, one line per check, summary) so that the live
printer (`live.py`) prints exactly what `render_table` would, one check at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.verify.checks import ID_WIDTH, Check

SCHEMA_VERIFY = "egpu-setup/verify/1"
_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip", "info": "INFO"}


@dataclass(frozen=True)
class VerifyReport:
    checks: tuple[Check, ...]
    device: dict[str, Any]
    python: str
    profile: str | None
    options: dict[str, Any]
    outcome: str  # how the child ended: finished / timeout / crashed / failed
    started: float
    seconds: float
    hostname: str
    host: dict[str, Any] = field(default_factory=dict)
    machine_id_sha256: str | None = None  # egpu_setup/host/identity.py

    @property
    def ok(self) -> bool:
        return self.outcome == "finished" and not any(c.status == "fail" for c in self.checks)

    @property
    def device_kind(self) -> str:
        """ "cpu" when the run verified the CPU path only (no GPU at all), else "cuda"."""
        return "cpu" if self.device.get("type") == "cpu" else "cuda"

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERIFY,
            "ok": self.ok,
            # "cpu": this report proves torch trains on the CPU and verifies no GPU; a fleet
            # report must not count it as a working eGPU.
            "device_kind": self.device_kind,
            "device": self.device,
            "checks": [c.to_json() for c in self.checks],
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "hostname": self.hostname,
            # which machine ran it: `egpu-setup report` keeps machines apart by it
            "machine_id_sha256": self.machine_id_sha256,
            "host": self.host,
            "python": self.python,
            "profile": self.profile,
            "options": self.options,
            "outcome": self.outcome,
            "seconds": self.seconds,
        }

    def save(self, state_dir: Path) -> Path:
        """Write <state>/reports/verify-<UTC time>.json atomically; return its path."""
        from egpu_setup.state.reports import save_report

        return save_report(state_dir, "verify", self.to_json(), self.started)


def render_header(device: dict[str, Any], python: str) -> str:
    """The first line: what was verified, with which torch, in which Python."""
    if device.get("type") == "cuda" and device.get("name"):
        where = (
            f"{device['name']} (cuda:{device.get('index', '?')}, {device.get('pci_bus_id') or '?'})"
        )
    else:
        where = (
            "device: cpu (no GPU is verified)"
            if device.get("type") == "cpu"
            else ("no CUDA device")
        )
    torch = f" · torch {device['torch']}" if device.get("torch") else ""
    from egpu_setup.text import plain

    return plain(f"egpu-setup verify · {where}{torch} · {python}")


def render_check(c: Check) -> list[str]:
    """One check's line, and its hint under a failure or a warning."""
    from egpu_setup.text import plain  # details quote the venv, the GPU, the progress log

    secs = f"  ({c.seconds:.1f} s)" if c.seconds is not None and c.seconds >= 0.05 else ""
    lines = [f"  {_MARK[c.status]}  {c.id.ljust(ID_WIDTH)}  {plain(c.detail)}{secs}"]
    if c.hint and c.status in ("fail", "warn"):
        lines.append(f"  {' ' * 4}  {' ' * ID_WIDTH}  hint: {plain(c.hint)}")
    return lines


def render_summary(report: VerifyReport) -> list[str]:
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in _MARK}
    verdict = "OK" if report.ok else "FAILED"
    if report.device_kind == "cpu":
        verdict += " (device: cpu)"
    return [
        "",
        f"{verdict}: {counts['pass']} passed, {counts['info']} info, {counts['warn']} warnings, "
        f"{counts['fail']} failed, {counts['skip']} skipped in {report.seconds:.1f} s",
    ]


def render_table(report: VerifyReport) -> str:
    """The human view: one line per check, hints under failures and warnings, a verdict."""
    lines = [render_header(report.device, report.python), ""]
    for c in report.checks:
        lines += render_check(c)
    lines += render_summary(report)
    return "\n".join(lines)
