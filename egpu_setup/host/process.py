"""Child processes: the one place egpu-setup starts a program, always from an argv list.

Every process goes through a Host (host/machine.py), which adds the chroot of `--root` and refuses
a recording; this module does the spawning for all of them:

- `spawn(argv, on_line=...)` passes each line of output to `on_line` as it comes (apt, pip, the
  plan's commands), keeps the output, and holds a deadline whether or not the child prints.
  (`egpu-setup verify`'s child, whose DDP ranks may leave the session, starts through
  host/tracked_session.py, which tracks its descendants by a token in their environment.)
  stdin is closed, or a pipe holding the few bytes the caller gives (`input`: a secret such as
  a password, which an argv would show to every user in /proc/PID/cmdline) and then closed:
  nothing ever waits for an answer from a terminal.
- The child leads a session of its own (start_new_session=True: a new session and process group,
  both numbered by its pid). On timeout, or when this process is interrupted, the whole session
  is ended: the process group, and every process still in the session after moving to a group
  of its own (the session id is field 6 of /proc/PID/stat, proc(5)). SIGTERM first when a grace
  period is given (on Ctrl-C: SIGINT, what a terminal would have sent), then SIGKILL.
- Every child starts the same way (`prepare`): its program by absolute path (a bare name is
  looked up in SYSTEM_PATH, never in the caller's PATH, so an empty entry cannot mean the working
  directory), cwd `/`, an environment of SYSTEM_PATH, HOME and the few variables _PASSED_ON names
  plus what the caller passes (never the caller's PYTHON*, PIP_*, UV_*, VIRTUAL_ENV or LD_*), and
  every Python isolated with `-I` (https://docs.python.org/3/using/cmdline.html#cmdoption-I: no
  PYTHON* variables, no user site, neither the working nor the script's directory on sys.path),
  so `python -m venv` run from a folder holding a `venv.py` runs the stdlib's venv.
- Every child dies with egpu-setup: the kernel sends it SIGKILL when its parent dies
  (PR_SET_PDEATHSIG, prctl(2)), and its session is told to the recorders of `recording()` (the
  run lock, state/lock.py, keeps them) so the next run ends a grandchild a kill -9 orphaned.
- Every child starts with at least the umask 022 (`host/umask.py`), whatever the caller's shell
  had: a root run from a `umask 000` shell must not leave pip's venv files, or anything else a
  child creates without naming a mode, writable by everyone (umask(2)). egpu-setup itself takes
  the same mask at its start (cli.main), for what it creates without naming a mode.
- Limits, said plainly: a descendant that called setsid() itself has left the session and is out
  of reach; a process in uninterruptible sleep (D state, e.g. stuck in a GPU driver) ignores even
  SIGKILL, so it is reported (`Result.stuck`), not waited for; after the child exits, output a
  grandchild still writes to the inherited pipe is read for DRAIN_S seconds at most.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from egpu_setup.errors import ExecutionError
from egpu_setup.host.umask import safe_umask

MAX_OUTPUT = 16 * 1024 * 1024  # bytes kept per stream; the oldest go first
DRAIN_S = 2.0  # after the child exited: how long output still arriving is read
# `input` is written whole before the output is read: it must fit in the pipe's buffer (pipe(7):
# 16 pages since Linux 2.6.11; one page is the least POSIX promises for an atomic write)
MAX_INPUT = 4096
KILL_WAIT_S = 5.0  # after SIGKILL: how long to wait before calling the child stuck
INTERRUPT_GRACE_S = 5.0  # Ctrl-C: SIGINT to the session, then SIGKILL after this
_POLL_S = 0.25  # how often a silent child is checked on
# The only directories a bare program name is looked up in: root's own (Debian Policy 10.1, the
# FHS), never a PATH the caller set. Children get it as their PATH too.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What a child keeps of this process's environment: locale, terminal, time zone, proxies and the
# CA certificates OpenSSL trusts (the downloads need them behind a lab's TLS proxy, and uv reads
# SSL_CERT_FILE), sudo's account names and egpu-setup's own switches (a child that is egpu-setup
# reads them too). Nothing that names code to load or a place to look for it.
_PASSED_ON = re.compile(
    r"^(TERM|LANG|LANGUAGE|LC_[A-Z]+|TZ|SOURCE_DATE_EPOCH|SUDO_(?:USER|UID|GID)|EGPU_SETUP_\w+"
    r"|SSL_CERT_FILE|SSL_CERT_DIR"
    r"|(?:http|https|ftp|no|all)_proxy|(?:HTTP|HTTPS|FTP|NO|ALL)_PROXY)$"
)
# Programs that run the argv after their "--" (a Python after them is isolated too).
_WRAPPERS = frozenset({"runuser", "setpriv", "unshare", "enter.py"})
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Launchers that start a program they look up by name (env(1), nice(1), timeout(1), ...): what
# they run escapes both the absolute path and the -I above, so the gateway starts none of them.
_BY_NAME_LAUNCHERS = frozenset(
    {"env", "nice", "ionice", "nohup", "stdbuf", "timeout", "xargs", "sudo", "doas", "chrt"}
)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class Result:
    """What a finished command left behind.

    rc: the exit status, or minus the signal that ended it (-9 when it was killed); out/err: its
    output (err is empty when stderr went to out); timed_out: the deadline ended it; stuck: it
    was still there after SIGKILL (uninterruptible sleep)."""

    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    timed_out: bool = False
    stuck: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def tail(self, lines: int = 60) -> str:
        """The last `lines` lines of the output (stdout, then stderr), for an error message."""
        text = (self.out + ("\n" + self.err if self.err else "")).strip("\n")
        return "\n".join(text.splitlines()[-lines:])


class _Buffer:
    """One stream's output: kept (bounded) and cut into lines for the callback."""

    def __init__(self, on_line: Callable[[str], None] | None) -> None:
        self.data = bytearray()
        self.partial = b""
        self.on_line = on_line

    def feed(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > MAX_OUTPUT:
            del self.data[: len(self.data) - MAX_OUTPUT]
        if self.on_line is None:
            return
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for raw in lines:
            self.on_line(raw.decode("utf-8", errors="replace"))

    def close(self) -> str:
        if self.partial and self.on_line is not None:
            self.on_line(self.partial.decode("utf-8", errors="replace"))
        self.partial = b""
        return self.data.decode("utf-8", errors="replace")


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    replace_env: bool = False,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    merge_stderr: bool = False,
    run_as: tuple[int, int] | None = None,
    term_grace: float = 0.0,
    input: bytes | None = None,
) -> Result:
    """Run `argv` to its end (or its deadline) in a session of its own; never raises on a
    non-zero exit or a timeout (see Result), only when the program cannot be started.

    env: added to the child's clean environment (child_env), or the whole one with replace_env.
    cwd: `/` unless given (the child's own folder never decides what it loads).
    on_line: called with each line of stdout (and of stderr with merge_stderr) as it arrives.
    run_as: (uid, gid) to run as, with no supplementary groups (root starting a user's Python).
    term_grace: on timeout, seconds between SIGTERM and SIGKILL (0: SIGKILL at once).
    input: up to MAX_INPUT bytes on stdin, then end of file (else stdin is /dev/null)."""
    if input is not None and len(input) > MAX_INPUT:
        raise ValueError(f"input of {len(input)} bytes: at most {MAX_INPUT}")
    argv = prepare(argv)
    full_env = child_env(env, replace_env, run_as)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
            argv,
            stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env=full_env,
            cwd="/" if cwd is None else cwd,
            start_new_session=True,
            user=run_as[0] if run_as else None,
            group=run_as[1] if run_as else None,
            extra_groups=[] if run_as else None,
            umask=safe_umask(),
            preexec_fn=die_with_parent(),  # no threads start children here
        )
        started_session(proc.pid)
    except FileNotFoundError as exc:
        raise ExecutionError(
            f"command not found: {argv[0]}", "install it or check PATH", argv=argv, rc=127
        ) from exc
    except PermissionError as exc:
        raise ExecutionError(
            f"cannot run {argv[0]}: {exc.strerror or exc}",
            "check its permissions",
            argv=argv,
            rc=126,
        ) from exc
    if proc.stdin is not None:
        _give(proc.stdin, input or b"")
    out, err = _Buffer(on_line), _Buffer(on_line if merge_stderr else None)
    deadline = None if timeout is None else started + timeout
    try:
        timed_out = _pump(proc, out, err, deadline)
    except BaseException:
        _interrupt(proc)  # Ctrl-C or an error in on_line: nothing of it keeps running
        raise
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    stuck = False
    if timed_out:
        stuck = end_session(proc, term_grace)
    rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return Result(
        tuple(argv),
        rc,
        out.close(),
        err.close(),
        timed_out=timed_out,
        stuck=stuck,
        seconds=time.monotonic() - started,
    )


def search_dirs() -> list[str]:
    """Where a bare program name is looked up, in order: SYSTEM_PATH; the directory of the
    Python running egpu-setup (its own venv's bin, where uv is installed beside it: as trusted as
    the egpu-setup running); and for a user, never for root, the absolute entries of their PATH
    (their own ~/.local/bin). An empty or relative entry, the working directory, never."""
    dirs = SYSTEM_PATH.split(":")
    own = os.path.dirname(sys.executable)
    if own.startswith("/") and own not in dirs:
        dirs.append(own)
    if os.geteuid() != 0:
        path = os.environ.get("PATH", "").split(os.pathsep)
        dirs += [d for d in path if d.startswith("/") and d not in dirs]
    return dirs


def find(name: str) -> str | None:
    """The first executable `DIR/name` of search_dirs(), or None (`name` has no slash)."""
    for directory in search_dirs():
        candidate = f"{directory}/{name}"
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def program(name: str) -> str:
    """The absolute path a child's program is started from: `name` itself when absolute, else
    what find() finds; ExecutionError (127) for anything else, a relative path among them (it
    would mean the working directory)."""
    if name.startswith("/"):
        return name
    if "/" not in name and name not in ("", ".", ".."):
        found = find(name)
        if found is not None:
            return found
    raise ExecutionError(
        f"command not found: {name}" if "/" not in name else f"{name} is a relative path",
        f"egpu-setup starts programs by absolute path, or from {SYSTEM_PATH} only",
        argv=[name],
        rc=127,
    )


def prepare(argv: Sequence[str]) -> list[str]:
    """argv as a child is started with: its program absolute (`program`), and every Python in
    it, the program itself or one a wrapper (runuser, setpriv, unshare, enter.py) runs after its
    "--", isolated with -I right after the interpreter."""
    if not argv:
        raise ExecutionError("an empty command", "report this as a bug", argv=[], rc=127)
    if os.path.basename(argv[0]) in _BY_NAME_LAUNCHERS:
        raise ExecutionError(
            f"{argv[0]} starts a program by name, past the checks every child gets",
            "report this as a bug: the program itself is to be started (env: the env= argument)",
            argv=list(argv),
            rc=127,
        )
    out = list(argv)
    out[0] = program(out[0])
    at = 0
    while at < len(out):
        name = os.path.basename(out[at])
        if _PYTHON.match(name):
            if out[at + 1 : at + 2] != ["-I"] and not _script_with_user_site(out[at + 1 :]):
                out.insert(at + 1, "-I")
            script = out[at + 2 : at + 3]
            if not (script and os.path.basename(script[0]) in _WRAPPERS):
                break
        elif name not in _WRAPPERS:
            break
        try:
            at = out.index("--", at + 1) + 1
        except ValueError:
            break
    return out


def _script_with_user_site(args: Sequence[str]) -> bool:
    """`-E /abs/script.py`: verify's child in a Python the user named keeps its user site (a
    `pip install --user` torch); sys.path[0] is then the script's own folder, never the cwd."""
    return len(args) >= 2 and args[0] == "-E" and args[1].startswith("/")


def child_env(
    env: Mapping[str, str] | None, replace_env: bool, run_as: tuple[int, int] | None = None
) -> dict[str, str]:
    """A child's environment: with replace_env exactly `env`; else SYSTEM_PATH, the HOME of
    the account it runs as, what _PASSED_ON keeps of ours, and then `env`."""
    if replace_env:
        return dict(env or {})
    out = {k: v for k, v in os.environ.items() if _PASSED_ON.match(k)}
    out["PATH"] = SYSTEM_PATH
    out["HOME"] = home_of(run_as[0] if run_as else os.geteuid())
    out.update(env or {})
    return out


def passed_on(name: str) -> bool:
    """Whether a child keeps the variable `name` of this process's environment (child_env)."""
    return _PASSED_ON.match(name) is not None


def home_of(uid: int) -> str:
    """The home directory passwd gives `uid`; `/` for an account it does not know."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_dir or "/"
    except KeyError:
        return "/"


def die_with_parent() -> Callable[[], None]:
    """A preexec function that has the kernel SIGKILL the child when this process dies, by any
    signal (prctl(2), PR_SET_PDEATHSIG). It runs after the child took its uid (a change of
    credentials clears the setting); a parent already gone before it took hold is seen by the
    parent pid having changed, and the child ends itself."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


_recorders: list[Callable[[int, int], None]] = []


@contextlib.contextmanager
def recording(recorder: Callable[[int, int], None]) -> Iterator[None]:
    """While the block runs, `recorder(session id, its start time)` is called for every child
    started (the run lock writes them down: a grandchild the kernel does not end with its
    parent, a `pip wheel`'s build backend, is found by the next run through them)."""
    _recorders.append(recorder)
    try:
        yield
    finally:
        _recorders.remove(recorder)


def started_session(pid: int) -> None:
    """Tell the recorders that the child `pid` leads a new session (see `recording`)."""
    start = start_time(pid)
    if start is None:
        return
    for recorder in list(_recorders):
        recorder(pid, start)


def start_time(pid: int | str) -> int | None:
    """When `pid` started, in clock ticks after boot (proc(5): field 22 of /proc/PID/stat); with
    the pid it names one process for the whole boot, where the pid alone is reused."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


def _give(stdin: IO[bytes], data: bytes) -> None:
    """Write `data` (it fits in the pipe: MAX_INPUT) and close, so the child reads end of file;
    a child that exited without reading it is not an error here (its exit status says)."""
    with contextlib.suppress(BrokenPipeError):
        stdin.write(data)
    with contextlib.suppress(BrokenPipeError):
        stdin.close()


def _pump(
    proc: subprocess.Popen[bytes], out: _Buffer, err: _Buffer, deadline: float | None
) -> bool:
    """Read the child's output until it ends; True when the deadline came first."""
    buffers = {}
    with selectors.DefaultSelector() as sel:
        for pipe, buf in ((proc.stdout, out), (proc.stderr, err)):
            if pipe is not None:
                sel.register(pipe.fileno(), selectors.EVENT_READ)
                buffers[pipe.fileno()] = buf
        exited_at: float | None = None
        while buffers:
            now = time.monotonic()
            if deadline is not None and now >= deadline and proc.poll() is None:
                return True
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > DRAIN_S:
                break  # a grandchild holds the pipe open: what it writes later is not ours
            wait = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - now))
            for key, _ in sel.select(wait):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    buffers[key.fd].feed(chunk)
                else:
                    sel.unregister(key.fd)
                    del buffers[key.fd]
    remaining = None if deadline is None else deadline - time.monotonic()
    try:
        proc.wait(None if remaining is None else max(0.0, remaining))
    except subprocess.TimeoutExpired:
        return True
    return False


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat from field 3 (the state) on, or None when the process is gone (proc(5))."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may itself hold spaces or ")"
    return stat.rsplit(")", 1)[-1].split() if ")" in stat else None


def session_members(sid: int) -> dict[int, int]:
    """pid -> process group of every process whose session id is `sid` (proc(5): /proc/PID/stat,
    fields 5 and 6)."""
    members = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(name)
        if fields is not None and len(fields) > 3 and fields[3] == str(sid):
            members[int(name)] = int(fields[2])
    return members


def _signal_session(sid: int, sig: int) -> None:
    """`sig` to the session's own process group, and once to each member that left it (a
    process must not get the signal twice: a handler that exits may be gone by the second)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    for pid, group in session_members(sid).items():
        if group != sid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def end_session(proc: subprocess.Popen[bytes], term_grace: float = 0.0) -> bool:
    """End the child's whole session (SIGTERM, after `term_grace` SIGKILL); True when the child
    is still there after SIGKILL (stuck in the kernel), so nobody waits on it forever."""
    steps = [(signal.SIGTERM, term_grace)] if term_grace > 0 else []
    steps.append((signal.SIGKILL, KILL_WAIT_S))
    for sig, wait in steps:
        _signal_session(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        _signal_session(proc.pid, signal.SIGKILL)  # what is left of the session, in any group
        return False
    return True


def _interrupt(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        _signal_session(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=INTERRUPT_GRACE_S)
    if proc.poll() is None:
        end_session(proc)
    else:
        _signal_session(proc.pid, signal.SIGKILL)


def end_leftovers(sid: int, start: int) -> list[int]:
    """SIGKILL what is left of a session a killed run recorded (`recording`): every process of
    session `sid` that started no earlier than its leader did. While any member lives the
    kernel does not give the number `sid` to a new process; once none does, a new process may
    get it and lead a session of that id, so a process `sid` that started at another time than
    the recorded leader means the old session is gone. Returns the pids that were ended."""
    leader = start_time(sid)
    if leader is not None and leader != start:
        return []
    ended = []
    for pid in session_members(sid):
        began = start_time(pid)
        if pid == os.getpid() or began is None or began < start:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    return sorted(ended)
