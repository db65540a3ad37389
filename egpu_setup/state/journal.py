"""The step journal: append-only JSON lines, each fsync'ed before the step it announces starts."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from egpu_setup.state.paths import StatePaths, denied


@dataclass(frozen=True)
class RunSummary:
    """The last run as the journal tells it."""

    run_id: str
    status: str  # running (= interrupted when nobody holds the lock) / ok / failed / reboot
    begun: tuple[int, ...]
    done: tuple[int, ...]
    steps: tuple[str, ...]
    boot_id: str | None

    @property
    def interrupted_at(self) -> int | None:
        open_steps = [i for i in self.begun if i not in self.done]
        return open_steps[-1] if open_steps else None


class Journal:
    """Append-only JSON lines, each fsync'ed before the step it announces starts."""

    def __init__(self, paths: StatePaths):
        self.path = paths.journal
        self.paths = paths

    def append(self, event: dict[str, Any]) -> None:
        line = json.dumps({"time": round(time.time(), 3), **event}) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except PermissionError as exc:
            raise denied(self.path, "write") from exc
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def events(self) -> Iterator[dict[str, Any]]:
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return
        except PermissionError as exc:
            raise denied(self.path, "read") from exc
        for line in text.splitlines():
            with contextlib.suppress(ValueError):  # a line cut by power loss is skipped
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event

    def last_run(self) -> RunSummary | None:
        run: dict[str, Any] | None = None
        for e in self.events():
            if e.get("event") == "run-begin":
                run = {
                    "run_id": e.get("run", "?"),
                    "status": "running",
                    "begun": [],
                    "done": [],
                    "steps": e.get("steps", []),
                    "boot_id": e.get("boot_id"),
                }
            elif run is not None and e.get("run") == run["run_id"]:
                if e.get("event") == "step-begin":
                    run["begun"].append(e.get("step"))
                elif e.get("event") == "step-done":
                    run["done"].append(e.get("step"))
                elif e.get("event") == "run-end":
                    run["status"] = e.get("status", "ok")
                    if e.get("boot_id"):
                        run["boot_id"] = e["boot_id"]
        if run is None:
            return None
        return RunSummary(
            run["run_id"],
            run["status"],
            tuple(run["begun"]),
            tuple(run["done"]),
            tuple(run["steps"]),
            run["boot_id"],
        )


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
