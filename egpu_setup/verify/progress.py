"""The progress marker: a JSON-lines log under <state>/verify/, fsynced line by line.

The parent writes `start` before it launches the child (persist "verify started" first, so a
run that takes the machine down is still on disk), `step` for each step the child announces (the
child waits until that line is on disk before the step starts, and only reads this log: it is
root's when root runs verify, never handed to the venv's owner), and `end` with the outcome.
A log whose last run has no `end` means the machine (or the tool) died mid-run: a CUDA hard
lock that took the host down. The next run reports that step, then starts a new log.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.errors import EgpuSetupError
from egpu_setup.state.atomic import make_dirs, open_file, rename
from egpu_setup.state.paths import read_state


@dataclass(frozen=True)
class PreviousRun:
    """A verify run that never wrote its `end` line."""

    started: float | None
    step: str | None
    step_time: float | None
    pid: int | None
    python: str | None
    device: str | None = None  # the --device of that run ("cpu", "auto", "cuda:1")

    def describe(self) -> str:
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
            if self.started
            else "?"
        )
        step = f"at step `{self.step}`" if self.step else "before its first step"
        return f"the verify started {when} stopped {step} and never finished"


def parse_progress(text: str) -> PreviousRun | None:
    """The unfinished last run in a progress log, or None when it finished (or there is none)."""
    run: dict[str, Any] | None = None
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut by power loss
        if not isinstance(event, dict):
            continue
        kind = event.get("event")
        if kind == "start":
            given = event.get("options")
            options: dict[str, Any] = given if isinstance(given, dict) else {}
            run = {
                "started": event.get("time"),
                "python": event.get("python"),
                "step": None,
                "device": options.get("device"),
            }
        elif run is not None and kind == "step":
            run.update(step=event.get("step"), step_time=event.get("time"), pid=event.get("pid"))
        elif kind == "end":
            run = None
    if run is None:
        return None
    num = (int, float)
    return PreviousRun(
        started=run["started"] if isinstance(run.get("started"), num) else None,
        step=run["step"] if isinstance(run.get("step"), str) else None,
        step_time=run.get("step_time") if isinstance(run.get("step_time"), num) else None,
        pid=run.get("pid") if isinstance(run.get("pid"), int) else None,
        python=run["python"] if isinstance(run.get("python"), str) else None,
        device=run["device"] if isinstance(run.get("device"), str) else None,
    )


class ProgressLog:
    """<state>/verify/progress.jsonl; the previous run's log is kept as progress.prev.jsonl."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.path = directory / "progress.jsonl"

    def _text(self) -> str | None:
        """The log's text, read as the state is (state/paths.read_state: by descriptor, no link
        followed); None when it is missing or cannot be read."""
        try:
            raw = read_state(self.path)
        except (OSError, EgpuSetupError):
            return None
        return None if raw is None else raw.decode("utf-8", errors="replace")

    def previous(self) -> PreviousRun | None:
        text = self._text()
        return None if text is None else parse_progress(text)

    def begin(self, python: str, options: dict[str, Any]) -> None:
        """Rotate the old log away, then durably record that a run starts."""
        make_dirs(self.dir)
        with contextlib.suppress(FileNotFoundError):
            rename(self.path, "progress.prev.jsonl")
        self.append({"event": "start", "python": python, "pid": os.getpid(), "options": options})

    def step(self, name: str, pid: int | None, seq: int | None) -> None:
        """The child announced step `name` (it waits for this line before the step starts)."""
        self.append({"event": "step", "step": name, "pid": pid, "seq": seq})

    def end(self, outcome: str, step: str | None) -> None:
        self.append({"event": "end", "outcome": outcome, "step": step})

    def last_step(self) -> str | None:
        """The step the child announced last in this run."""
        text = self._text()
        if text is None:
            return None
        step = None
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "step":
                    step = event.get("step")
        return step if isinstance(step, str) else None

    def append(self, event: dict[str, Any]) -> None:
        line = json.dumps({**event, "time": event.get("time", time.time())}) + "\n"
        fd = open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
