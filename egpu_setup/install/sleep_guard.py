"""`egpu-setup sleep-guard`: no sleep while a CUDA process holds the eGPU, and logind says who.

A suspend with CUDA contexts on an eGPU is the resume most likely to lose it (docs/design.md,
resume-check), and it ends the job either way. So egpu-setup-sleep-guard.service watches the
processes holding the CUDA node (/dev/nvidia-uvm: every CUDA context opens it, a display server
alone does not; the same rule resume-check uses) and, while there are any, holds a logind sleep
inhibitor lock whose reason names them: `systemd-inhibit --what=sleep --mode=block --who=egpu-setup
--why="CUDA on the eGPU: pid 4242 python3 (alice)" COMMAND` holds the lock exactly as long as
COMMAND runs (systemd-inhibit(1)). COMMAND is this program again (`sleep-guard --hold PIDS`),
which exits as soon as the set of processes is no longer PIDS; the guard then takes the lock
again with the new reason, or none when no process is left.

The inhibitor starts through the Host like every process (host/process.py): by absolute path,
in a session of its own, killed by the kernel when the guard dies (PR_SET_PDEATHSIG), and the
`--hold` child ends itself when its parent is no longer the inhibitor that started it, so a
guard killed with SIGKILL leaves nothing running and no lock held. Between one lock and the next
(only when the set of processes changes) there is a moment with none, the time systemd-inhibit
takes to start and call logind.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from egpu_setup.detect.processes import ProcEntry, probe_procs
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host
from egpu_setup.host.process import start_time
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.sleep_guard")

WHO = "egpu-setup"
MODES = ("block", "delay")
WHY_MAX = 400  # logind shows the reason in one line (systemd-inhibit --list)
# seconds between looks at /proc: a job that starts is covered within this time
DEFAULT_INTERVAL_S = 5.0
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.2, 300.0


@dataclass(frozen=True)
class Holder:
    """A process holding the CUDA node."""

    pid: int
    comm: str
    user: str  # the account name, else the uid as digits, else "?"

    def describe(self) -> str:
        return f"pid {self.pid} {self.comm} ({self.user})"


@dataclass(frozen=True)
class GuardConfig:
    """How the guard runs: what the unit's command line says (egpu-setup-sleep-guard.service)."""

    inhibitor: str  # absolute path of systemd-inhibit
    node: str  # the CUDA node, /dev/nvidia-uvm
    mode: str  # "block" / "delay"
    interval: float


@dataclass(frozen=True)
class Lock:
    """One inhibitor lock: the argv that holds it while `pids` hold the node."""

    argv: tuple[str, ...]
    pids: tuple[int, ...]


def check_node(node: str, interval: float) -> None:
    """The node is an absolute path and the interval in range (UsageError otherwise)."""
    _check_absolute("--node", node, "/dev/nvidia-uvm")
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise UsageError(
            f"--interval {interval:g} is out of range",
            f"use {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} seconds",
        )


def check_config(inhibitor: str, node: str, mode: str, interval: float) -> GuardConfig:
    """The guard's settings, checked (UsageError: exit 2, nothing started)."""
    _check_absolute("--inhibitor", inhibitor, "/usr/bin/systemd-inhibit")
    check_node(node, interval)
    if mode not in MODES:
        raise UsageError(
            f"--inhibit {mode!r} is not one of {', '.join(MODES)}", "use block or delay"
        )
    if not os.path.isfile(inhibitor) or not os.access(inhibitor, os.X_OK):
        raise UsageError(
            f"{inhibitor} is not an executable file",
            "install systemd (it ships systemd-inhibit), or give --inhibitor its path",
        )
    return GuardConfig(inhibitor, node, mode, float(interval))


def _check_absolute(what: str, path: str, example: str) -> None:
    if not path.startswith("/") or any(c in path for c in "\0\n"):
        raise UsageError(
            f"{what} {path!r} is not an absolute path", f"give {what} as one, e.g. {example}"
        )


# -- pure ---------------------------------------------------------------------------------------


def cuda_holders(
    procs: Iterable[ProcEntry], node: str, users: dict[int, str], exclude: Iterable[int] = ()
) -> tuple[Holder, ...]:
    """The processes that hold `node` open or mapped, by pid; `users` names the uids."""
    skip = set(exclude)
    out = [
        Holder(p.pid, p.comm, users.get(p.uid, str(p.uid)) if p.uid is not None else "?")
        for p in procs
        if p.pid not in skip and node in p.paths
    ]
    return tuple(sorted(out, key=lambda h: h.pid))


def inhibit_why(holders: tuple[Holder, ...]) -> str:
    """The lock's reason: every holder, cut at WHY_MAX with the number left out."""
    parts = [h.describe() for h in holders]
    text = "CUDA on the eGPU: " + ", ".join(parts)
    shown = len(parts)
    while len(text) > WHY_MAX and shown > 1:
        shown -= 1
        text = f"CUDA on the eGPU: {', '.join(parts[:shown])} and {len(parts) - shown} more"
    return "".join(c if c.isprintable() else "?" for c in text)[:WHY_MAX]


def lock_for(
    config: GuardConfig, holders: tuple[Holder, ...], hold_argv: tuple[str, ...]
) -> Lock | None:
    """The inhibitor lock `holders` call for (None: nobody, no lock). `hold_argv` is the
    command that keeps it while they are the same; their pids follow it."""
    if not holders:
        return None
    pids = tuple(h.pid for h in holders)
    argv = (
        config.inhibitor,
        "--what=sleep",
        f"--mode={config.mode}",
        f"--who={WHO}",
        f"--why={inhibit_why(holders)}",
        *hold_argv,
        *(str(p) for p in pids),
    )
    return Lock(argv, pids)


# -- probes -------------------------------------------------------------------------------------


def _user_names(uids: Iterable[int | None]) -> dict[int, str]:
    import pwd

    names = {}
    for uid in {u for u in uids if u is not None}:
        try:
            names[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            continue
    return names


def probe_holders(host: Host, node: str, exclude: Iterable[int] = ()) -> tuple[Holder, ...]:
    """The processes holding `node` now; none when it does not exist (no eGPU, no driver)."""
    if not host.exists(node):
        return ()
    procs = list(probe_procs(host))
    return cuda_holders(procs, node, _user_names(p.uid for p in procs), exclude)


# -- the loops ----------------------------------------------------------------------------------


def hold_argv(config: GuardConfig) -> tuple[str, ...]:
    """The command the inhibitor runs: this egpu-setup, isolated, in `--hold` mode, told which
    guard it serves (pid and start time: a pid alone may be reused)."""
    me = os.getpid()
    return (
        sys.executable,
        "-I",
        "-m",
        "egpu_setup",
        "sleep-guard",
        f"--node={config.node}",
        f"--interval={config.interval:g}",
        f"--guard={me}:{start_time(me)}",
        "--hold",
    )


def run_guard(host: Host, config: GuardConfig) -> None:
    """Watch the node and hold a lock while it is held, until stopped (the unit's SIGTERM)."""
    me = {os.getpid()}
    seen = False
    while True:
        holders = probe_holders(host, config.node, me)
        lock = lock_for(config, holders, hold_argv(config))
        if lock is None:
            if seen:
                log.info("no CUDA process holds the eGPU any more: sleep allowed")
            seen = False
            time.sleep(config.interval)
            continue
        seen = True
        log.info("holding sleep off (%s): %s", config.mode, inhibit_why(holders))
        result = host.stream(lock.argv)
        if result.rc != 0:
            # logind refused or is not running: say so, and look again after a pause
            log.warning(
                "%s exited with %s: %s", config.inhibitor, result.rc, result.tail(5).strip()
            )
            time.sleep(config.interval)


def parse_guard(value: str) -> tuple[int, int]:
    """`--guard PID:START` (UsageError unless two numbers)."""
    pid, _, start = value.partition(":")
    if not (pid.isdigit() and start.isdigit()):
        raise UsageError(f"--guard {value!r} is not PID:START", "it is set by the guard itself")
    return int(pid), int(start)


def hold(
    host: Host, node: str, interval: float, guard: tuple[int, int], pids: tuple[int, ...]
) -> None:
    """Run under the inhibitor: return once the holders of `node` are no longer `pids`, the
    inhibitor that started this is gone (and its lock with it), or the guard is. The guard is
    checked by its start time too: killed while this started, it may be gone before the first
    look at the parent."""
    parent = os.getppid()
    me = {os.getpid(), parent}
    wanted = tuple(sorted(pids))
    while True:
        if os.getppid() != parent or start_time(guard[0]) != guard[1]:
            return
        if tuple(h.pid for h in probe_holders(host, node, me)) != wanted:
            return
        time.sleep(interval)
