"""The day after: re-running install once the reboot it asked for has happened.

egpu-setup-verify.service ran `egpu-setup verify` at that boot and saved its report under
<state>/reports/ (templates/systemd/egpu-setup-verify.service.j2); a run that finds nothing to do
shows that result, or the newest verify since (a person may have run one by hand after a fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egpu_setup.host.machine import Host
from egpu_setup.state.paths import StatePaths


@dataclass(frozen=True)
class VerifySeen:
    """The newest verify report since the reboot an install asked for (report None: none ran
    yet; `pending`: egpu-setup-verify.service is still armed for a boot)."""

    report: dict[str, Any] | None
    path: str | None
    pending: bool

    @property
    def ok(self) -> bool | None:
        return None if self.report is None else bool(self.report.get("ok"))

    def text(self) -> str:
        if self.report is None:
            if self.pending:
                return (
                    "the verify after the reboot has not run yet: egpu-setup-verify.service "
                    "runs it once at the next boot (`systemctl status egpu-setup-verify.service`)"
                )
            return "no verify report since the reboot: run `egpu-setup verify`"
        r = self.report
        device = r.get("device") or {}
        what = device.get("name") or ("the CPU" if r.get("device_kind") == "cpu" else "the GPU")
        checks = [c for c in r.get("checks") or [] if isinstance(c, dict)]
        failed = [str(c.get("id")) for c in checks if _failed(c)]
        head = f"verify at {r.get('time', '?')} on {what}"
        if r.get("ok"):
            passed = sum(1 for c in checks if c.get("status", "pass") == "pass" and c.get("ok"))
            return f"{head}: OK ({passed} checks passed; {self.path})"
        listed = ", ".join(failed) or str(r.get("outcome") or "failed")
        return f"{head}: FAILED ({listed}; {self.path}): run `egpu-setup verify` to see why"


def _failed(check: dict[str, Any]) -> bool:
    status = check.get("status")
    return status == "fail" if status else not check.get("ok")


def after_reboot(paths: StatePaths, target: Host) -> VerifySeen | None:
    """What the verify after the install's reboot found, when the last run asked for a reboot
    and this machine has booted since; None otherwise (nothing to say)."""
    import os

    from egpu_setup.execute.executor import boot_id
    from egpu_setup.state.journal import Journal
    from egpu_setup.state.verify_marker import VERIFY_MARKER

    if target.kind != "live" or not os.access(paths.state_dir, os.R_OK):
        return None
    journal = Journal(paths)
    last = journal.last_run()
    if last is None or last.status != "reboot":
        return None
    if last.boot_id and last.boot_id == boot_id(target):
        return None  # not rebooted yet: the plan still says "reboot needed"
    since = _ended_at(journal, last.run_id)
    report, path = newest_verify(target, str(paths.state_dir / "reports"), since)
    return VerifySeen(report, path, pending=target.exists(VERIFY_MARKER))


def _ended_at(journal: Any, run_id: str) -> float:
    ended = 0.0
    for e in journal.events():
        if e.get("event") == "run-end" and e.get("run") == run_id:
            t = e.get("time")
            ended = float(t) if isinstance(t, int | float) else ended
    return ended


def newest_verify(
    host: Host, reports: str, since: float
) -> tuple[dict[str, Any] | None, str | None]:
    """The newest verify report in `reports` made after `since` (epoch seconds), read through
    the host; (None, None) when there is none. A report that is not valid JSON is skipped."""
    import calendar
    import time

    from egpu_setup.state.reports import saved_reports, sequence_of

    # The order the machine saved them in (state/reports.py), never its clock: a verify saved
    # after the newest install report is after that install, whatever the clock says since.
    installs = [sequence_of(d) for d, _ in saved_reports(host, [reports], "install")]
    install_seq = max((s for s in installs if s is not None), default=None)
    for data, path in reversed(saved_reports(host, [reports])):
        seq = sequence_of(data)
        if seq is not None and install_seq is not None:
            return (data, path) if seq > install_seq else (None, None)
        try:
            when = calendar.timegm(time.strptime(str(data.get("time")), "%Y-%m-%dT%H:%M:%SZ"))
        except ValueError:
            continue
        # a report from before sequences: its time is its start, to the second, so a verify
        # that began within the second the install ended still counts
        if when + 1 >= since:
            return data, path
    return None, None
