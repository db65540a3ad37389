"""Where the state lives, and who may touch it.

    /var/lib/egpu-setup/manifest.json     every file/link we created or replaced, with hashes
    /var/lib/egpu-setup/backups/<sha256>  the previous content of every file we replaced
    /var/lib/egpu-setup/journal.jsonl     one line per run/step event, fsync'ed as it happens
    /run/lock/egpu-setup.lock             flock held for the whole run; holds the holder's pid

All of it under DIR with `--root DIR`. `EGPU_SETUP_STATE_DIR` moves the state (and the lock, so
parallel tests never meet) elsewhere.

Not root, on the running system: the state (and its lock) live in $XDG_STATE_HOME/egpu-setup
(default ~/.local/state/egpu-setup, XDG Base Directory spec). Only a plan that needs no root runs
then (torch into the user's own venv: preflight refuses the rest), and its record (the venv it
created) belongs to that user, who rolls it back without sudo. Root-owned state a normal user
cannot read or write is reported as `error:`/`hint: sudo ...`, never as a PermissionError
traceback (StateAccessError).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from egpu_setup.errors import EgpuSetupError, UsageError

STATE_DIR = "/var/lib/egpu-setup"


# The root-owned venv egpu-setup runs from (scripts/install.sh, install/tool.py); what root's
# units and apt hook start, by absolute path.
TOOL_VENV = "/opt/egpu-setup/tool"


TOOL_BIN = f"{TOOL_VENV}/bin/egpu-setup"
# The torch venv install makes and verify checks by default (docs/design.md, "Files on a
# provisioned machine").
TORCH_VENV = "/opt/egpu-setup/venv"
# written into each venv egpu-setup creates (execute/undo.py mark_venv): the venv is root's own
MARK_VENV = ".egpu-setup-venv"


LOCK_PATH = "/run/lock/egpu-setup.lock"


USER_STATE_NAME = "egpu-setup"  # under $XDG_STATE_HOME (default ~/.local/state)


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


def refuse_link(path: Path) -> Path:
    """`path`, unless it is a symbolic link: egpu-setup's own state (manifest, journal, backups,
    reports, the lock) is never reached through one, so a link planted there cannot point root's
    writes, or the reads rollback restores from, at another file. UsageError naming it."""
    if os.path.islink(path):
        raise UsageError(
            f"{path} is a symbolic link (-> {os.readlink(path)}): egpu-setup never follows a "
            "link in its state",
            f"remove the link (`rm {shlex.quote(str(path))}`), then run again",
        )
    return path


def read_state(
    path: Path, limit: int = 256 * 1024 * 1024, *, anchor: Path = Path("/")
) -> bytes | None:
    """A state file's bytes (None when missing), never through a link: opened relative to its
    directory's descriptor, walked from `anchor` as the writers walk (state/atomic.py), so a
    directory swapped for a link after the check is refused too. StateAccessError when this
    user may not read it, UsageError for a link or anything but a regular file."""
    import stat

    from egpu_setup.state.atomic import open_file

    try:
        fd = open_file(
            refuse_link(path), os.O_RDONLY | os.O_NONBLOCK, anchor=anchor, create_dirs=False
        )
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise denied(path, "read") from exc
    except OSError as exc:
        raise EgpuSetupError(
            f"cannot read {path}: {exc.strerror or exc}", "check the disk and run again"
        ) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(
                f"{path} is not a regular file", "move it away; egpu-setup writes a new one"
            )
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            if sum(map(len, chunks)) > limit:
                raise UsageError(f"{path} is larger than {limit >> 20} MiB", "move it away")
        return b"".join(chunks)
    finally:
        os.close(fd)


def can(path: Path | str, mode: int) -> bool:
    """os.access by the *effective* ids, which the kernel checks on open (not the real ones)."""
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


@dataclass(frozen=True)
class StatePaths:
    """Real on-disk paths of the state for one target (the live machine or a --root image)."""

    state_dir: Path
    lock: Path
    # where every write of the state walks down from, one directory descriptor at a time
    # (state/atomic.py): `/`, or the image root, so a link swapped into it is refused
    anchor: Path = Path("/")

    @classmethod
    def for_root(cls, root: Path) -> StatePaths:
        """The state of `root`; a normal user's own state on the running system (module doc)."""
        from egpu_setup.state.atomic import anchored

        override = os.environ.get("EGPU_SETUP_STATE_DIR")
        if override:
            anchor, d = anchored(Path(override))
            return cls(d, d / "egpu-setup.lock", anchor)
        if Path(root) == Path("/") and os.geteuid() != 0:
            return cls.for_user()
        return cls.system(root)

    @classmethod
    def system(cls, root: Path) -> StatePaths:
        """The root-owned state of the system at `root` (what `sudo egpu-setup` uses).

        Under an image root every directory on the way is resolved inside it, as the kernel
        would after a chroot (a planted `var/lib -> /etc` stays in the image); the state
        directory and the files in it must not be links at all (`refuse_link`)."""
        from egpu_setup.host.machine import Host

        root = Path(root)
        if root == Path("/"):
            return cls(Path(STATE_DIR), Path(LOCK_PATH))
        image = Host(root)
        return cls(image.location(STATE_DIR), image.location(LOCK_PATH), root)

    @classmethod
    def for_user(cls) -> StatePaths:
        """$XDG_STATE_HOME/egpu-setup; a relative XDG_STATE_HOME is invalid and ignored (spec)."""
        xdg = os.environ.get("XDG_STATE_HOME", "")
        base = Path(xdg) if xdg.startswith("/") else Path.home() / ".local" / "state"
        from egpu_setup.state.atomic import anchored

        anchor, d = anchored(base / USER_STATE_NAME)
        return cls(d, d / "egpu-setup.lock", anchor)

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

    @property
    def wheel_cache(self) -> Path:
        """The installers' cache of root's own venvs (execute/pip.py), 0700."""
        return self.state_dir / "cache"
