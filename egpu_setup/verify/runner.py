"""Run `_child.py` in the target Python: own process group, hard timeout, kill, never hang.

The child's results and output go to files, not pipes, so a child that hangs (or a grandchild
like nvidia-smi that holds a pipe open) can never block the parent on a read. On timeout the
whole process group gets SIGTERM, then SIGKILL; a process stuck in uninterruptible sleep inside
the driver ignores even SIGKILL, so it is reported ("stuck in D state"), not waited on forever
(reference/hotplug-security.md §7 row 10).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError

log = logging.getLogger("egpu_setup.verify")

CHILD = Path(__file__).with_name("_child.py")
TERM_GRACE_S = 2.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # SIGKILL -> give up waiting (uninterruptible sleep)
TAIL_CHARS = 4000


@dataclass(frozen=True)
class ChildOutcome:
    """How the child ended, and everything it wrote before that."""

    outcome: str  # finished / timeout / crashed / failed
    returncode: int | None
    signal_name: str | None
    records: tuple[dict[str, Any], ...]
    output_tail: str
    seconds: float
    pid: int
    stuck: bool = False  # still alive after SIGKILL

    @property
    def finished(self) -> bool:
        return self.outcome == "finished"


def child_argv(python: str, isolated: bool) -> list[str]:
    """`-I`: no PYTHONPATH, no user site, no script dir on sys.path, so nothing from our own
    environment leaks into the target venv. For a user-chosen --python, `-E` only: its user-site
    torch (`pip install --user`) is a legitimate install."""
    return [python, "-I" if isolated else "-E", str(CHILD)]


def venv_owner(python: str) -> tuple[int, int] | None:
    """(uid, gid) to run the child as, when we are root and the interpreter's environment belongs
    to another user (a venv in a home directory): its pyvenv.cfg, else the interpreter file.
    None: run as we are."""
    if os.geteuid() != 0:
        return None
    py = Path(python)
    marker = py.parent.parent / "pyvenv.cfg"
    try:
        st = (marker if marker.is_file() else py).stat()
    except OSError:
        return None
    return None if st.st_uid == 0 else (st.st_uid, st.st_gid)


def run_child(
    python: str, isolated: bool, config: dict[str, Any], work_dir: Path, timeout: float
) -> ChildOutcome:
    """Start the child with `config`, wait at most `timeout` seconds, return its outcome."""
    config_path = work_dir / "config.json"
    results = Path(config["results"])
    output = work_dir / "child.log"
    config_path.write_text(json.dumps(config, indent=2))
    owner = venv_owner(python)
    if owner is not None:
        # Root never runs a Python another user can change: the child runs as that user, and
        # gets only its scratch directory and the progress file.
        for path in (work_dir, config_path, config.get("progress")):
            if path and os.path.exists(path):
                os.chown(path, *owner)
    argv = [*child_argv(python, isolated), str(config_path)]
    log.debug("verify child: %s", argv)
    t0 = time.monotonic()
    with open(output, "wb") as out:
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work_dir,
                # its own process group: one kill also reaches nvidia-smi and the DDP ranks
                start_new_session=True,
                user=owner[0] if owner else None,
                group=owner[1] if owner else None,
                extra_groups=[] if owner else None,
            )
        except OSError as exc:
            raise UsageError(
                f"cannot run the target Python {python}: {exc.strerror or exc}",
                "pass a working interpreter with --python PATH or a venv with --venv PATH",
            ) from exc
        stuck = False
        try:
            rc: int | None = proc.wait(timeout=timeout)
            outcome = "finished" if rc == 0 else "crashed" if rc < 0 else "failed"
        except subprocess.TimeoutExpired:
            outcome = "timeout"
            rc, stuck = _kill_group(proc)
        except BaseException:  # Ctrl-C: never leave a child behind on the GPU
            _kill_group(proc)
            raise
    seconds = time.monotonic() - t0
    records = tuple(_read_records(results))
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
        records=records,
        output_tail=_tail(output),
        seconds=seconds,
        pid=proc.pid,
        stuck=stuck,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> tuple[int | None, bool]:
    """SIGTERM then SIGKILL to the child's process group; (returncode, stuck)."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=wait), False
        except subprocess.TimeoutExpired:
            continue
    log.warning(
        "verify child %d did not die after SIGKILL (state %s): not waiting for it",
        proc.pid,
        process_state(proc.pid),
    )
    return None, True


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` ("D" = uninterruptible sleep), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # the command name is in parentheses and may itself contain spaces or parentheses
    return text.rsplit(")", 1)[-1].split()[0] if ")" in text else None


def _read_records(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_CHARS))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
