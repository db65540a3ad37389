"""The verify report: the JSON contract, the table, and the file a lab collects."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.verify.checks import Check

SCHEMA_VERIFY = "egpu-setup/verify/1"
_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


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

    @property
    def ok(self) -> bool:
        return self.outcome == "finished" and not any(c.status == "fail" for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERIFY,
            "ok": self.ok,
            "device": self.device,
            "checks": [c.to_json() for c in self.checks],
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "hostname": self.hostname,
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


def render_table(report: VerifyReport) -> str:
    """The human view: one line per check, hints under failures and warnings, a verdict."""
    dev = report.device
    if dev.get("type") == "cuda" and dev.get("name"):
        where = f"{dev['name']} (cuda:{dev.get('index', '?')}, {dev.get('pci_bus_id') or '?'})"
    else:
        where = "CPU" if dev.get("type") == "cpu" else "no CUDA device"
    torch = f" · torch {dev['torch']}" if dev.get("torch") else ""
    lines = [f"egpu-setup verify · {where}{torch} · {report.python}", ""]
    width = max((len(c.id) for c in report.checks), default=10)
    for c in report.checks:
        secs = f"  ({c.seconds:.1f} s)" if c.seconds is not None and c.seconds >= 0.05 else ""
        lines.append(f"  {_MARK[c.status]}  {c.id.ljust(width)}  {c.detail}{secs}")
        if c.hint and c.status in ("fail", "warn"):
            lines.append(f"  {' ' * 4}  {' ' * width}  hint: {c.hint}")
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in _MARK}
    verdict = "OK" if report.ok else "FAILED"
    lines += [
        "",
        f"{verdict}: {counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed, "
        f"{counts['skip']} skipped in {report.seconds:.1f} s",
    ]
    return "\n".join(lines)
