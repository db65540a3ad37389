"""Atomic writes: a reader or a crash sees the old file or the new one, never half of either.

Every temp file carries TMP_MARK in its name, next to its target (same filesystem, so the rename
is atomic), so that a later run finds and removes what a killed one left (`clean_temp_files`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_MARK = ".egpu-setup-tmp-"  # temp files carry this in their name so a later run can find them


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (fsync(2); Ansible's atomic_move does
    not)."""
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
    before_rename: Callable[[Path], None] | None = None,
) -> None:
    """Replace `path` with `data` so a reader or a crash sees the old or the new file, never half.

    Temp file in the target directory (same filesystem, so the rename is atomic), fsync, mode kept
    from the existing file unless `mode` is given (0644 for a new one; owner kept too), rename,
    fsync the directory. `before_rename` sees the temp file, written and fsync'ed (a test hook).
    """
    _replace(path, lambda f: f.write(data), mode, before_rename)


def atomic_copy(source: Path, path: Path, mode: int | None = None) -> None:
    """`atomic_write` of a file's content, streamed (a .deb of a few hundred MB)."""
    with open(source, "rb") as src:
        _replace(path, lambda f: shutil.copyfileobj(src, f, 4 * 1024 * 1024), mode, None)


def atomic_symlink(path: Path, target: str) -> None:
    """Make `path` the symlink -> `target` in one rename (a reader never sees it missing)."""
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _replace(
    path: Path,
    write: Callable[[BinaryIO], object],
    mode: int | None,
    before_rename: Callable[[Path], None] | None,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    old = None
    with contextlib.suppress(FileNotFoundError):
        old = (
            path.lstat()
        )  # a link in the way is replaced: its target's mode and owner are not ours
    if old is not None and not stat.S_ISREG(old.st_mode):
        old = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
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
