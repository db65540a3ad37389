"""Run `_child.py` in the target Python: a session of its own, streamed records, a hard timeout.

`spawn()` is the one place that starts a process here: (argv, env, timeout, line callback) ->
Spawned(rc, out, err, ...). The child's stdout carries its records, one JSON line each; every
line goes to the callback the moment it arrives, so the parent can print each check while the
child still works. Reads never block past the deadline: a child that hangs, or a grandchild like
nvidia-smi that keeps the pipe open, cannot hang the parent.

On timeout the child's whole session is ended: SIGTERM, then SIGKILL, to its process group *and*
to every process that carries this run's token in its environment, which reaches a grandchild
that called setsid() (a DDP rank or a daemon leaves the group, not the environment it inherited).
A process stuck in uninterruptible sleep inside the driver ignores even SIGKILL, so it is
reported ("stuck in D state"), not waited on forever (an eGPU that fell off the bus mid-run:
NVIDIA/open-gpu-kernel-modules issue #842).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError

log = logging.getLogger("egpu_setup.verify")

CHILD = Path(__file__).with_name("_child.py")
TERM_GRACE_S = 2.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # SIGKILL -> give up waiting (uninterruptible sleep)
EOF_GRACE_S = 2.0  # child exited -> stop waiting for a grandchild to close the pipe
TAIL_CHARS = 4000
RUN_TOKEN = "EGPU_SETUP_VERIFY_RUN"  # inherited by every process the child starts


@dataclass(frozen=True)
class Spawned:
    """What a spawned command left behind."""

    rc: int | None  # None: killed on timeout and still not reaped (stuck)
    out: str  # every stdout line, also those the callback saw
    err: str  # the tail of stderr
    timed_out: bool = False
    stuck: tuple[int, ...] = ()  # pids still alive after SIGKILL
    pid: int = 0
    seconds: float = 0.0


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    on_line: Callable[[str], None],
    *,
    cwd: Path | None = None,
    owner: tuple[int, int] | None = None,
) -> Spawned:
    """Run argv (a list, never a shell) in a new session, streaming stdout lines to `on_line`;
    kill the whole session at `timeout` seconds. OSError when argv[0] cannot be executed."""
    token = secrets.token_hex(8)
    t0 = time.monotonic()
    proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env={**env, RUN_TOKEN: token},
        start_new_session=True,  # one kill reaches nvidia-smi and the DDP ranks too
        user=owner[0] if owner else None,
        group=owner[1] if owner else None,
        extra_groups=[] if owner else None,
    )
    out_lines: list[str] = []
    err = bytearray()
    partial = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}  # type: ignore[union-attr]
    sel = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)  # type: ignore[union-attr]
        sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
    deadline = t0 + timeout
    exited_at: float | None = None
    timed_out = False
    stuck: tuple[int, ...] = ()
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > EOF_GRACE_S:
                break  # a leftover grandchild holds the pipe open: end_session() below
            for key, _ in sel.select(min(deadline - now, 0.2)):
                fd = key.fileobj.fileno()  # type: ignore[union-attr]
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    chunk = b"\n" if partial[fd] else b""
                data = partial[fd] + chunk
                *lines, partial[fd] = data.split(b"\n")
                if fd == proc.stdout.fileno():  # type: ignore[union-attr]
                    for raw in lines:
                        line = raw.decode("utf-8", errors="replace")
                        out_lines.append(line)
                        on_line(line)
                else:
                    err += b"".join(raw + b"\n" for raw in lines)
                    del err[: max(0, len(err) - 64 * 1024)]
    except BaseException:  # Ctrl-C, or the callback failed: never leave a child on the GPU
        end_session(proc, token)
        raise
    finally:
        sel.close()
    if not timed_out:
        try:  # it closed its pipes but still runs: it keeps its time, no more
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    # On timeout this is the kill; after a normal exit it ends what the child left behind.
    stuck = end_session(proc, token)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=0 if stuck else KILL_WAIT_S)
    for stream in (proc.stdout, proc.stderr):
        stream.close()  # type: ignore[union-attr]
    return Spawned(
        rc=proc.returncode,
        out="\n".join(out_lines),
        err=err.decode("utf-8", errors="replace")[-TAIL_CHARS:],
        timed_out=timed_out,
        stuck=stuck,
        pid=proc.pid,
        seconds=time.monotonic() - t0,
    )


def session_members(pgid: int | None, token: str) -> set[int]:
    """Processes carrying `token` in their environment, plus those of process group `pgid`
    (given only while the child that leads it is not reaped, so the id cannot be a reused one)."""
    found: set[int] = set()
    needle = f"{RUN_TOKEN}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if pgid is not None and os.getpgid(pid) == pgid:
                found.add(pid)
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.add(pid)
        except OSError:  # gone, or another user's process (not ours to read, nor to kill)
            continue
    return found


def end_session(proc: subprocess.Popen[bytes], token: str) -> tuple[int, ...]:
    """SIGTERM then SIGKILL to every member of the child's session; the pids that survived."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
        members = session_members(_group(proc), token)
        if not members:
            return ()
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()  # reap our own child so it does not linger as a zombie member
            members = {p for p in members if _alive(p)}
            if not members:
                return ()
            time.sleep(0.05)
    survivors = tuple(sorted(p for p in session_members(_group(proc), token) if _alive(p)))
    for pid in survivors:
        log.warning(
            "verify process %d did not die after SIGKILL (state %s): not waiting for it",
            pid,
            process_state(pid),
        )
    return survivors


def _group(proc: subprocess.Popen[bytes]) -> int | None:
    return proc.pid if proc.poll() is None else None


def _alive(pid: int) -> bool:
    """True unless `pid` is gone or a zombie (a zombie has already died)."""
    state = process_state(pid)
    return state is not None and state != "Z"


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` ("D" = uninterruptible sleep), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # the command name is in parentheses and may itself contain spaces or parentheses
    return text.rsplit(")", 1)[-1].split()[0] if ")" in text else None


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
