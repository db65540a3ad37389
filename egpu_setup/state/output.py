"""An output folder a person named (`render --out`, `report --html`, `record DIR`), written through
the one writer (state/atomic.py) and made theirs.

Opened once: the folder's parent is the anchor (its real path, taken now), the folder itself is
never followed if it is a link, and every file below is written through directory descriptors
from that anchor, so a link at the folder, or one swapped into it while the files are written,
is refused instead of followed. Before the first write the trust rule (host/trust.py,
`output_owner`) decides for whom: a folder on a way that only root can change is root's; a
folder a user owns gets files that user owns (fchown on the descriptor, never a chown by name),
so root writes nothing there that the user could not have written, and a way that a group or
everyone can write is refused with `error:`/`hint:`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from egpu_setup.errors import UsageError
from egpu_setup.host.machine import refuse_foreign_hard_link
from egpu_setup.host.trust import output_owner
from egpu_setup.state.atomic import (
    anchored,
    atomic_copy,
    atomic_symlink,
    atomic_write,
    directory,
    make_dirs,
    remove,
)

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class OutputTree:
    """The folder `path`, its anchor, and whose files it gets (None: as we are)."""

    path: Path
    anchor: Path
    owner: tuple[int, int] | None

    @classmethod
    def open(cls, path: Path, *, what: str) -> OutputTree:
        """Check `path` by the trust rule and fix its anchor; UsageError (`what` names the flag)
        when a link, a non-directory or an open directory is in the way."""
        anchor, folder = anchored(path)
        owner = output_owner(str(folder))
        tree = cls(folder, anchor, owner)
        try:
            with directory(folder, anchor=anchor):
                pass
        except FileNotFoundError:
            pass  # made by the first write
        except NotADirectoryError:
            raise UsageError(f"{what} {path}: not a directory", "pass a directory path") from None
        return tree

    def _inside(self, target: Path) -> Path:
        if target != self.path and self.path not in target.parents:
            raise UsageError(
                f"refusing to write {target} outside {self.path}", "report this as a bug"
            )
        return target

    def write(self, target: Path, data: bytes, mode: int = 0o644) -> Path:
        atomic_write(self._inside(target), data, mode, anchor=self.anchor, owner=self.owner)
        return target

    def link(self, target: Path, points_to: str) -> Path:
        # a link is left root's in a user's folder: its owner decides nothing (symlink(7)),
        # and a chown by name is what the descriptor walk is there to avoid
        atomic_symlink(self._inside(target), points_to, anchor=self.anchor)
        return target

    def mkdir(self, target: Path) -> Path:
        make_dirs(self._inside(target), anchor=self.anchor, owner=self.owner)
        return target

    def copy_in(self, target: Path, source: Path, mode: int = 0o644) -> Path:
        """`source`, a regular file in a private directory of ours, copied to `target` (a child
        such as pip writes there, never into the tree by name)."""
        atomic_copy(source, self._inside(target), mode, anchor=self.anchor, owner=self.owner)
        return target

    def remove(self, target: Path) -> bool:
        return remove(self._inside(target), anchor=self.anchor)

    def names(self, folder: Path) -> list[str]:
        """The entries of `folder` in the tree, read through its descriptor; [] when missing."""
        try:
            with directory(self._inside(folder), anchor=self.anchor) as fd:
                return sorted(os.listdir(fd))
        except FileNotFoundError:
            return []

    def _open(self, target: Path) -> int | None:
        """A descriptor of the regular file `target`, no link followed; None when there is none."""
        try:
            with directory(self._inside(target).parent, anchor=self.anchor) as dfd:
                fd = os.open(target.name, _READ_FLAGS, dir_fd=dfd)
                refuse_foreign_hard_link(fd, dfd, target.name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            # the file itself is a link (never followed), or someone else's file linked in
            if exc.errno in (errno.ELOOP, errno.EPERM):
                return None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def read(self, target: Path, limit: int) -> bytes | None:
        """The bytes of the regular file `target` (at most `limit`), or None: missing, a link,
        not a regular file, or larger than `limit`."""
        fd = self._open(target)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        return data if len(data) <= limit else None

    def digest(self, target: Path) -> tuple[str, int] | None:
        """(sha256, size) of the regular file `target`, streamed; None as for `read`."""
        fd = self._open(target)
        if fd is None:
            return None
        h, size = hashlib.sha256(), 0
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
        return h.hexdigest(), size
