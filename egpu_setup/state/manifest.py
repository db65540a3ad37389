"""What egpu-setup remembers between runs: the manifest, the step journal, backups, the run lock.

Layout (DESIGN.md, "Files on a provisioned machine"; all of it under DIR with `--root DIR`):

    /var/lib/egpu-setup/manifest.json     every file/link we created or replaced, with hashes
    /var/lib/egpu-setup/backups/<sha256>  the previous content of every file we replaced
    /var/lib/egpu-setup/journal.jsonl     one line per run/step event, fsync'ed as it happens
    /run/lock/egpu-setup.lock             flock held for the whole run; holds the holder's pid

`EGPU_SETUP_STATE_DIR` moves the state (and the lock, so parallel tests never meet) elsewhere.

Not root, on the running system: the state (and its lock) live in $XDG_STATE_HOME/egpu-setup
(default ~/.local/state/egpu-setup, XDG Base Directory spec). Only a plan that needs no root runs
then (torch into the user's own venv: preflight refuses the rest), and its record (the venv it
created) belongs to that user, who rolls it back without sudo. Root-owned state a normal user
cannot read or write is reported as `error:`/`hint: sudo …`, never as a PermissionError
traceback (StateAccessError).

Why content-addressed backups: a file replaced twice keeps its *original* content (the one from
before egpu-setup ever touched it), which is what rollback must restore byte for byte
(reference/hotplug-security.md §6.2, §6.5).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shlex
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.errors import BusyError, EgpuSetupError

log = logging.getLogger("egpu_setup.state")

STATE_DIR = "/var/lib/egpu-setup"
LOCK_PATH = "/run/lock/egpu-setup.lock"
USER_STATE_NAME = "egpu-setup"  # under $XDG_STATE_HOME (default ~/.local/state)
# Host path (under the target root), the ConditionPathExists= of egpu-setup-verify.service
# (templates/systemd/egpu-setup-verify.service.j2): fixed, the unit cannot follow an override.
VERIFY_MARKER = "/var/lib/egpu-setup/verify-after-reboot"
MANIFEST_SCHEMA = "egpu-setup/manifest/1"
TMP_MARK = ".egpu-setup-tmp-"  # temp files carry this in their name so a later run can find them


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class StateAccessError(EgpuSetupError, PermissionError):
    """State this user may not read or write (root-owned /var/lib/egpu-setup, the run lock).

    Also a PermissionError, so a caller that goes on without the state (a dry run as a normal
    user) can still catch it as one; the CLI prints it as `error:`/`hint:` with exit 1.
    """


def sudo_hint() -> str:
    """`sudo egpu-setup <the same arguments>`: the one next step for a normal user."""
    args = shlex.join(sys.argv[1:])
    return f"sudo egpu-setup {args}".rstrip()


def denied(path: Path, verb: str) -> StateAccessError:
    return StateAccessError(f"{path} needs root to {verb}", sudo_hint())


def can(path: Path | str, mode: int) -> bool:
    """os.access by the *effective* ids, which the kernel checks on open (not the real ones)."""
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


# -- atomic writes -------------------------------------------------------------------------------


def fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (reference §6.1, not done by Ansible)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: Path,
    data: bytes,
    mode: int | None = None,
    *,
    before_rename: Any = None,
) -> None:
    """Replace `path` with `data` so a reader or a crash sees the old or the new file, never half.

    Temp file in the target directory (same filesystem, so the rename is atomic), fsync, mode kept
    from the existing file unless `mode` is given (owner kept too), rename, fsync the directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    old = None
    with contextlib.suppress(FileNotFoundError):
        old = path.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        final_mode = mode if mode is not None else (old.st_mode & 0o7777 if old else 0o644)
        os.chmod(tmp, final_mode)
        if old is not None and os.geteuid() == 0:
            os.chown(tmp, old.st_uid, old.st_gid)
        if before_rename is not None:
            before_rename(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def clean_temp_files(directories: set[Path]) -> list[Path]:
    """Remove temp files a killed run left next to its targets; return what was removed."""
    removed: list[Path] = []
    for d in sorted(directories):
        with contextlib.suppress(OSError):
            for entry in d.iterdir():
                # a temp symlink (link_managed, rollback) is removed too, never followed
                if TMP_MARK in entry.name and (entry.is_symlink() or entry.is_file()):
                    entry.unlink()
                    removed.append(entry)
    return removed


# -- where state lives ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StatePaths:
    """Real on-disk paths of the state for one target (the live machine or a --root image)."""

    state_dir: Path
    lock: Path

    @classmethod
    def for_root(cls, root: Path) -> StatePaths:
        """The state of `root`; a normal user's own state on the running system (module doc)."""
        override = os.environ.get("EGPU_SETUP_STATE_DIR")
        if override:
            d = Path(override)
            return cls(d, d / "egpu-setup.lock")
        if Path(root) == Path("/") and os.geteuid() != 0:
            return cls.for_user()
        return cls.system(root)

    @classmethod
    def system(cls, root: Path) -> StatePaths:
        """The root-owned state of the system at `root` (what `sudo egpu-setup` uses)."""
        root = Path(root)
        return cls(root / STATE_DIR.lstrip("/"), root / LOCK_PATH.lstrip("/"))

    @classmethod
    def for_user(cls) -> StatePaths:
        """$XDG_STATE_HOME/egpu-setup; a relative XDG_STATE_HOME is invalid and ignored (spec)."""
        xdg = os.environ.get("XDG_STATE_HOME", "")
        base = Path(xdg) if xdg.startswith("/") else Path.home() / ".local" / "state"
        d = base / USER_STATE_NAME
        return cls(d, d / "egpu-setup.lock")

    def check_writable(self) -> None:
        """Raise StateAccessError unless this process can create/write the state (changes nothing).

        Checked before a run writes its first journal line, so a normal user running a plan
        against root-owned state gets `error: … needs root` and nothing on disk changes.
        """
        # os.path.exists, not Path.exists: it is False (not an exception) behind a 0700 directory
        for target in (self.state_dir, self.lock.parent):
            probe = target
            while not os.path.exists(probe) and probe != probe.parent:
                probe = probe.parent
            if not can(probe, os.W_OK | os.X_OK):
                raise denied(target, "write")
        for existing in (self.manifest, self.journal, self.lock):
            if os.path.exists(existing) and not can(existing, os.R_OK | os.W_OK):
                raise denied(existing, "write")

    @property
    def manifest(self) -> Path:
        return self.state_dir / "manifest.json"

    @property
    def journal(self) -> Path:
        return self.state_dir / "journal.jsonl"

    @property
    def backups(self) -> Path:
        return self.state_dir / "backups"


# -- the run lock --------------------------------------------------------------------------------


class RunLock:
    """One run at a time per target: a non-blocking flock; contention names the holder (exit 5)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def holder(self) -> str | None:
        """Who holds the lock ("pid 123: egpu-setup install …"), or None when it is free."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown pid"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                self._evict_stranger()
            # 0600 and no symlinks: in the world-writable /run/lock nobody else may open (and
            # so flock) root's lock, or point it elsewhere.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except PermissionError as exc:  # a root-owned lock (or its directory), not root
            raise denied(self.path, "lock") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            text = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown pid"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise BusyError(
                    f"another egpu-setup run holds {self.path} ({text})",
                    "wait for it to finish; never delete the lock file",
                ) from exc
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {' '.join(sys.argv)[:300]}\n".encode(), 0)
        self._fd = fd

    def _evict_stranger(self) -> None:
        """A lock file root did not make (another user's, a link) is not our lock: any user
        can create one in /run/lock and flock it to block every run. Replace it."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
            log.warning("replacing %s: it belongs to uid %d, not root", self.path, st.st_uid)
            os.unlink(self.path)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the manifest ---------------------------------------------------------------------------------


@dataclass
class Manifest:
    """Files, links, packages and venvs egpu-setup is responsible for, keyed by host path.

    A file entry: created (did not exist before us), prior_sha256/prior_mode/backup (the content
    from before egpu-setup first touched it), sha256 (what we last wrote, confirmed on disk),
    pending (what we are about to write: set before the rename, cleared after, so a crash between
    the two is recognised as ours, not as a user's edit).
    """

    paths: StatePaths
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    packages: list[dict[str, Any]] = field(default_factory=list)
    venvs: list[dict[str, Any]] = field(default_factory=list)
    # commands whose effect outlives the files, with the argv that undoes each, e.g.
    # {"argv": ["boltctl", "enroll", …, UUID], "undo": ["boltctl", "forget", UUID], "run": …}
    commands: list[dict[str, Any]] = field(default_factory=list)
    # follow-up commands (initramfs rebuild, reloads) owed for files a run set out to write:
    # recorded before any file is written, cleared when the command ran, so a run that failed or
    # was killed in between plans them again: [{"argv": [...], "run": run_id}]
    pending: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, paths: StatePaths) -> Manifest:
        try:
            data = json.loads(paths.manifest.read_text())
        except FileNotFoundError:
            return cls(paths)
        except PermissionError as exc:
            # not root: a dry run goes on without it (catches PermissionError); the rest says so
            raise denied(paths.manifest, "read") from exc
        except (OSError, ValueError) as exc:
            raise EgpuSetupError(
                f"cannot read the manifest {paths.manifest}: {exc}",
                "restore it from a backup or move it away to start over (rollback needs it)",
            ) from exc
        if data.get("schema") != MANIFEST_SCHEMA:
            raise EgpuSetupError(
                f"{paths.manifest}: unknown schema {data.get('schema')!r}",
                "this manifest was written by another egpu-setup version",
            )
        return cls(
            paths,
            data.get("files", {}),
            data.get("packages", []),
            data.get("venvs", []),
            data.get("commands", []),
            data.get("pending_commands", []),
        )

    def save(self) -> None:
        data = {
            "schema": MANIFEST_SCHEMA,
            "files": self.files,
            "packages": self.packages,
            "venvs": self.venvs,
            "commands": self.commands,
            "pending_commands": self.pending,
        }
        try:
            self.paths.state_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.paths.manifest, (json.dumps(data, indent=2) + "\n").encode(), 0o600)
        except PermissionError as exc:
            raise denied(self.paths.manifest, "write") from exc

    @property
    def empty(self) -> bool:
        return not (self.files or self.packages or self.venvs or self.commands)

    def pending_commands(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(p["argv"]) for p in self.pending)

    def add_pending_command(self, argv: tuple[str, ...], run_id: str) -> None:
        if tuple(argv) not in self.pending_commands():
            self.pending.append({"argv": list(argv), "run": run_id})

    def clear_pending_command(self, argv: tuple[str, ...]) -> None:
        self.pending = [p for p in self.pending if tuple(p["argv"]) != tuple(argv)]

    def backup(self, data: bytes) -> str:
        """Store `data` content-addressed; return the backup's name."""
        digest = sha256(data)
        target = self.paths.backups / digest
        if not target.exists():
            atomic_write(target, data, 0o600)
        return digest

    def read_backup(self, name: str) -> bytes:
        data = (self.paths.backups / name).read_bytes()
        if sha256(data) != name:
            raise EgpuSetupError(
                f"backup {self.paths.backups / name} is corrupt (hash mismatch)",
                "the file cannot be restored byte for byte; restore it by hand",
            )
        return data

    def is_ours(self, path: str, current: bytes | None) -> bool:
        """True when the file on disk is what we wrote (or about to write): safe to change."""
        entry = self.files.get(path)
        if entry is None:
            return False
        if current is None:
            return True
        digest = sha256(current)
        if digest in (entry.get("sha256"), entry.get("pending")):
            return True
        # a crash after recording the intent but before the rename: the old content is still there
        return entry.get("sha256") is None and digest == entry.get("prior_sha256")

    def add_package(self, name: str, run_id: str) -> None:
        if not any(p["name"] == name for p in self.packages):
            self.packages.append({"name": name, "run": run_id})

    def add_venv(self, path: str, run_id: str) -> None:
        if not any(v["path"] == path for v in self.venvs):
            self.venvs.append({"path": path, "run": run_id})

    def add_command(self, argv: list[str], undo: list[str], run_id: str) -> None:
        if not any(c["undo"] == undo for c in self.commands):
            self.commands.append({"argv": argv, "undo": undo, "run": run_id})


# -- the journal ----------------------------------------------------------------------------------


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


def write_verify_marker(host: Any, run_id: str, reason: str) -> None:
    """Arm egpu-setup-verify.service for the next boot (atomically, under the target root)."""
    data = {"run": run_id, "reason": reason, "time": round(time.time(), 3)}
    atomic_write(host.real_path(VERIFY_MARKER), (json.dumps(data) + "\n").encode(), 0o644)


def remove_verify_marker(host: Any) -> bool:
    """Disarm it (rollback took the unit away); True when there was one."""
    try:
        host.real_path(VERIFY_MARKER).unlink()
    except FileNotFoundError:
        return False
    return True


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
