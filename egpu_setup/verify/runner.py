"""Run `_child.py` in the target Python: streamed records, a hard timeout, as the right user.

The child starts through host/tracked_session.py (a session of its own, every descendant
ended at the deadline or after it exits). Its stdout carries its records, one JSON line each,
passed on as they arrive; root runs a Python another user can change only as that user
(host/trust.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError
from egpu_setup.host.tracked_session import spawn
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.verify")

CHILD = Path(__file__).with_name("_child.py")


@dataclass(frozen=True)
class ChildOutcome:
    """How the child ended, and every record it sent before that."""

    outcome: str  # finished / timeout / crashed / failed
    returncode: int | None
    signal_name: str | None
    records: tuple[dict[str, Any], ...]
    output_tail: str
    seconds: float
    pid: int
    stuck: bool = False  # still alive after SIGKILL
    stuck_pids: tuple[int, ...] = field(default=())

    @property
    def finished(self) -> bool:
        return self.outcome == "finished"


def child_argv(python: str, isolated: bool) -> list[str]:
    """`-I`: no PYTHONPATH, no user site, no script dir on sys.path, so nothing from our own
    environment leaks into the target venv. For a user-chosen --python, `-E` only: its user-site
    torch (`pip install --user`) is a legitimate install."""
    return [python, "-I" if isolated else "-E", str(CHILD)]


def venv_owner(python: str, isolated: bool = True) -> tuple[int, int] | None:
    """(uid, gid) to run the child as, when we are root and what that Python runs at startup is
    not all root's (host/trust.py: the executable and its links, both pyvenv.cfg places, the
    stdlib, site-packages); None: run as we are. UsageError when nobody can run it safely."""
    from egpu_setup.host.trust import run_as

    home = None if isolated else os.environ.get("HOME")  # -E keeps the user site of $HOME
    return run_as(python, user_site_home=home)


def parse_record(line: str) -> dict[str, Any] | None:
    """One record line of the child, or None for anything that is not a JSON object."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def run_child(
    python: str,
    isolated: bool,
    config: dict[str, Any],
    work_dir: Path,
    timeout: float,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> ChildOutcome:
    """Start the child with `config`, pass each record to `on_record` as it arrives, wait at
    most `timeout` seconds, return its outcome."""
    config_path = work_dir / "config.json"
    config_path.write_text(json.dumps(config, indent=2))
    owner = venv_owner(python, isolated)
    if owner is not None:
        # Root never runs a Python another user can change: the child runs as that user, and
        # gets only its scratch directory and the progress file.
        for path in (work_dir, config_path, config.get("progress")):
            if path and os.path.exists(path):
                os.chown(path, *owner)
    argv = [*child_argv(python, isolated), str(config_path)]
    log.debug("verify child: %s", argv)
    records: list[dict[str, Any]] = []

    def line(text: str) -> None:
        rec = parse_record(text)
        if rec is None:
            return
        records.append(rec)
        if on_record is not None:
            on_record(rec)

    try:
        res = spawn(argv, dict(os.environ), timeout, line, cwd=work_dir, owner=owner)
    except OSError as exc:
        raise UsageError(
            f"cannot run the target Python {python}: {exc.strerror or exc}",
            "pass a working interpreter with --python PATH or a venv with --venv PATH",
        ) from exc
    rc = res.rc
    if res.timed_out:
        outcome = "timeout"
    elif rc == 0:
        outcome = "finished"
    else:
        outcome = "crashed" if rc is not None and rc < 0 else "failed"
    if outcome == "finished" and not any(r.get("kind") == "end" for r in records):
        outcome = "failed"  # exited 0 without finishing: something called sys.exit early
    sig = None
    if rc is not None and rc < 0:
        with contextlib.suppress(ValueError):
            sig = signal.Signals(-rc).name
    return ChildOutcome(
        outcome=outcome,
        returncode=rc,
        signal_name=sig,
        records=tuple(records),
        output_tail=res.err,
        seconds=res.seconds,
        pid=res.pid,
        stuck=bool(res.stuck),
        stuck_pids=res.stuck,
    )
