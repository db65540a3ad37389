"""A child in a session of its own, every descendant tracked: streamed stdout lines, a hard
deadline, and nothing of it left running afterwards. `egpu-setup verify` starts its child
(which starts DDP ranks and nvidia-smi) through this.

`spawn()` -> Spawned(rc, out, err, ...): the child's stdout lines go to the callback the moment
they arrive, so the parent can print each check while the child still works. Reads never block
past the deadline: a child that hangs, or a grandchild like nvidia-smi that keeps the pipe open,
cannot hang the parent.

Where host/process.py ends a command's session by its session id (apt, pip and the commands of
a plan stay in it), this one also marks the child's environment with a token of this run:
after a timeout, and after a normal exit too, SIGTERM then SIGKILL go to the child's process
group *and* to every process that carries the token, which reaches a grandchild that called
setsid() (a DDP rank or a daemon leaves the session, not the environment it inherited). A
process stuck in uninterruptible sleep inside the driver ignores even SIGKILL, so it is
reported ("stuck in D state"), not waited on forever (an eGPU that fell off the bus mid-run:
NVIDIA/open-gpu-kernel-modules issue #842).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from egpu_setup.host.process import (
    die_with_parent,
    prepare,
    started_session,
    stat_fields,
)
from egpu_setup.host.umask import safe_umask
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.verify")

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
    kill the whole session at `timeout` seconds; the child dies with this process (host/process.py:
    die_with_parent). OSError when argv[0] cannot be executed."""
    token = secrets.token_hex(8)
    t0 = time.monotonic()
    proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
        prepare(argv),  # absolute, Python isolated: host/process.py
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env={**env, RUN_TOKEN: token},
        start_new_session=True,  # one kill reaches nvidia-smi and the DDP ranks too
        user=owner[0] if owner else None,
        group=owner[1] if owner else None,
        extra_groups=[] if owner else None,
        umask=safe_umask(),  # host/umask.py: never a caller's 000
        preexec_fn=die_with_parent(),  # no threads start children here
    )
    started_session(proc.pid)
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
    fields = stat_fields(pid)
    return fields[0] if fields else None
