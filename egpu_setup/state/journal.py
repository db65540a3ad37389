"""The step journal: append-only JSON lines, each fsync'ed before the step it announces starts."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.state.atomic import open_file
from egpu_setup.state.paths import StatePaths, denied, read_state, refuse_link
from egpu_setup.text import redact_tree


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
        # step descriptions and errors may quote an index URL: its token stays out (text.py)
        line = json.dumps(redact_tree({"time": round(time.time(), 3), **event})) + "\n"
        try:
            refuse_link(self.paths.state_dir)
            # O_NOFOLLOW, from the anchor's descriptor down: a link planted as the journal, or
            # as any directory above it, must not make root append to its target
            fd = open_file(
                refuse_link(self.path),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK,
                0o600,
                anchor=self.paths.anchor,
            )
        except PermissionError as exc:
            raise denied(self.path, "write") from exc
        except OSError as exc:
            raise EgpuSetupError(
                f"cannot write the journal {self.path}: {exc.strerror or exc}",
                "free space or remount the filesystem read-write, then run again",
            ) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UsageError(
                    f"{self.path} is not a regular file",
                    "move it away; egpu-setup starts a new one",
                )
            os.write(fd, line.encode())
            os.fsync(fd)
        except OSError as exc:
            raise EgpuSetupError(
                f"cannot write the journal {self.path}: {exc.strerror or exc}",
                "free space or remount the filesystem read-write, then run again",
            ) from exc
        finally:
            os.close(fd)

    def events(self) -> Iterator[dict[str, Any]]:
        raw = read_state(self.path, anchor=self.paths.anchor)
        if raw is None:
            return
        for line in raw.decode("utf-8", errors="replace").splitlines():
            # a line cut by power loss is skipped, and so is one of another shape
            with contextlib.suppress(ValueError, RecursionError):
                event = json.loads(line)
                if isinstance(event, dict) and _well_formed(event):
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


def _well_formed(event: dict[str, Any]) -> bool:
    """The fields last_run reads have the types egpu-setup writes (a hand-edited or foreign
    journal is skipped line by line, never a traceback)."""
    types = {"run": str, "event": str, "step": int, "status": str, "boot_id": (str, type(None))}
    if not all(isinstance(event[k], t) for k, t in types.items() if k in event):  # type: ignore[arg-type]
        return False
    steps = event.get("steps", [])
    return isinstance(steps, list) and all(isinstance(s, str) for s in steps)


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
