"""The one way egpu-setup writes under a directory: through directory descriptors, never by name.

Every write starts at an anchor (`/` on the running system, the image root under `--root`, a
folder the caller opened and checked) and walks down one component at a time with
`openat(dirfd, name, O_DIRECTORY|O_NOFOLLOW)` (openat(2)), so a link planted in any directory on
the way, or swapped in after the run began, makes the write fail (ELOOP/ENOTDIR) instead of
carrying it elsewhere. Below the last directory every call is relative to its descriptor:

- a temp file is created `O_CREAT|O_EXCL|O_NOFOLLOW` (it never opens what is already there),
- its mode and owner are set on the descriptor (fchmod(2), fchown(2)), never by name, so a name
  renamed over the temp file meanwhile changes nothing but that name,
- it is fsync'ed, renamed over the target with renameat(2) and the directory is fsync'ed, so a
  reader or a crash sees the old file or the new one, never half of either.

Every temp file carries TMP_MARK in its name, next to its target (same filesystem, so the rename
is atomic), so that a later run finds and removes what a killed one left (`clean_temp_files`).
`tests/state/test_one_writer.py` fails when shipped code writes a file any other way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from egpu_setup.errors import UsageError
from egpu_setup.host.machine import walk_dirs

TMP_MARK = ".egpu-setup-tmp-"  # temp files carry this in their name so a later run can find them
ROOT = Path("/")
_COPY_CHUNK = 4 * 1024 * 1024


class LinkInPath(UsageError):
    """A directory on the way to a write is a symbolic link, or not a directory at all."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _below(path: Path, anchor: Path) -> tuple[str, ...]:
    path, anchor = Path(os.path.abspath(path)), Path(os.path.abspath(anchor))
    try:
        parts = path.relative_to(anchor).parts
    except ValueError:
        raise UsageError(
            f"{path} is not under {anchor}: egpu-setup writes only below the tree it was given",
            "report this as a bug",
        ) from None
    if ".." in parts:  # abspath removed them; a literal one left means a name we never make
        raise UsageError(f"{path}: '..' in a path egpu-setup writes", "report this as a bug")
    return parts


def _refused(where: Path, exc: OSError) -> LinkInPath:
    why = (
        "a symbolic link: egpu-setup writes only through real directories, never through a link"
        if os.path.islink(where)
        else "not a directory: egpu-setup writes only through real directories"
    )
    return LinkInPath(
        f"{where} is {why}",
        f"replace {where} by a real directory (or remove it), then run again",
    )


def open_dir(
    path: Path,
    *,
    anchor: Path = ROOT,
    create: bool = False,
    mode: int = 0o755,
    owner: tuple[int, int] | None = None,
) -> int:
    """A descriptor of the directory `path`, reached from `anchor` by host/machine.py's
    `walk_dirs` (no link followed below the anchor, which is the caller's: `/`, an image
    root, a folder it checked). create: make the missing directories on the way (`mode`, less
    the umask; `owner`'s when we are root). LinkInPath for a link or a non-directory on the
    way; FileNotFoundError/PermissionError as the kernel says."""
    try:
        return walk_dirs(
            anchor, _below(path, anchor), create_mode=mode if create else None, owner=owner
        )
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refused(Path(exc.filename or path), exc) from None
        raise


@contextlib.contextmanager
def directory(
    path: Path,
    *,
    anchor: Path = ROOT,
    create: bool = False,
    owner: tuple[int, int] | None = None,
) -> Iterator[int]:
    """`open_dir` as a context manager: the descriptor is closed on the way out."""
    fd = open_dir(path, anchor=anchor, create=create, owner=owner)
    try:
        yield fd
    finally:
        os.close(fd)


def anchored(path: Path) -> tuple[Path, Path]:
    """(anchor, path) for a path a person named: the anchor is the real path of the deepest
    directory above `path` that exists now (the links a person put above their own folder are
    theirs to keep), and `path` is re-spelled below it, its last component never followed.
    Every later write walks from the anchor's descriptor, so a link swapped in below it after
    the start is refused."""
    path = Path(os.path.abspath(path))
    if path == ROOT:
        return ROOT, ROOT
    base, rest = path.parent, [path.name]
    while not os.path.isdir(base) and base != base.parent:
        base, rest = base.parent, [base.name, *rest]
    anchor = Path(os.path.realpath(base))
    return anchor, anchor.joinpath(*rest)


def remove_dir(path: Path, *, anchor: Path = ROOT) -> None:
    """rmdir `path` (an empty directory) through its parent's descriptor."""
    with directory(path.parent, anchor=anchor) as dfd:
        os.rmdir(path.name, dir_fd=dfd)


def empty_dir(path: Path, *, keep: frozenset[str] = frozenset(), anchor: Path = ROOT) -> None:
    """Remove everything in the directory `path` but the names in `keep`, walking each subtree
    by descriptor: a link anywhere in it is removed, never followed."""
    with directory(path, anchor=anchor) as dfd:
        for name in os.listdir(dfd):
            if name not in keep:
                _remove_at(dfd, name)


def _remove_at(dfd: int, name: str) -> None:
    st = _lstat_at(name, dfd)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dfd)
        return
    fd = walk_dirs(dfd, [name])
    try:
        for child in os.listdir(fd):
            _remove_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def make_dirs(
    path: Path, *, anchor: Path = ROOT, mode: int = 0o755, owner: tuple[int, int] | None = None
) -> None:
    """`mkdir -p path` below `anchor`, no link followed; new directories get `owner`."""
    os.close(open_dir(path, anchor=anchor, create=True, mode=mode, owner=owner))


def fsync_dir(path: Path, *, anchor: Path = ROOT) -> None:
    """Make a rename durable: fsync the directory entry (fsync(2); Ansible's atomic_move does
    not)."""
    with directory(path, anchor=anchor) as fd:
        os.fsync(fd)


def sync_filesystem(path: Path, *, anchor: Path = ROOT) -> None:
    """Make everything written under `path` durable: syncfs(2) on a descriptor of it
    (host/libc.py). What pip or uv write (thousands of files, none fsync'ed: pip's wheel
    installer only renames) is then on disk before the journal says the step is done."""
    from egpu_setup.host.libc import syncfs

    with directory(path, anchor=anchor) as fd:
        try:
            syncfs(fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(path)) from None


def _lstat_at(name: str, dfd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def atomic_write(
    path: Path,
    data: bytes,
    mode: int | None = None,
    *,
    anchor: Path = ROOT,
    owner: tuple[int, int] | None = None,
) -> None:
    """Replace `path` with `data` so a reader or a crash sees the old or the new file, never half.

    Mode kept from the existing regular file unless `mode` is given (0644 for a new one); owner
    `owner`, else kept from the existing file when we are root."""
    _replace(path, lambda fd: _write_all(fd, data), mode, anchor, owner)


def atomic_copy(
    source: Path,
    path: Path,
    mode: int | None = None,
    *,
    anchor: Path = ROOT,
    owner: tuple[int, int] | None = None,
) -> None:
    """`atomic_write` of a regular file's content, streamed (a .deb of a few hundred MB); the
    source is opened without following a final link and must be a regular file."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise UsageError(f"{source} is not a regular file", f"replace {source} by a file")

        def copy(fd: int) -> None:
            while chunk := os.read(src, _COPY_CHUNK):
                _write_all(fd, chunk)

        _replace(path, copy, mode, anchor, owner)
    finally:
        os.close(src)


def atomic_symlink(path: Path, target: str, *, anchor: Path = ROOT) -> None:
    """Make `path` the symlink -> `target` in one rename (a reader never sees it missing)."""
    with directory(path.parent, anchor=anchor, create=True) as dfd:
        tmp = _temp_name(path.name)
        os.symlink(target, tmp, dir_fd=dfd)
        try:
            os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)


def open_file(
    path: Path, flags: int, mode: int = 0o600, *, anchor: Path = ROOT, create_dirs: bool = True
) -> int:
    """A descriptor of `path` opened with `flags` (plus O_NOFOLLOW|O_CLOEXEC) relative to its
    directory's descriptor (journal appends, the lock file, verify's progress log). Opened for
    writing, a regular file with a second name is refused (OSError EMLINK) before a byte
    changes: what is written in place (an append, a truncate) would change the other file
    too, and a hard link is what O_NOFOLLOW does not see."""
    with directory(path.parent, anchor=anchor, create=create_dirs) as dfd:
        fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    if flags & (os.O_WRONLY | os.O_RDWR):
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            os.close(fd)
            raise OSError(errno.EMLINK, f"{st.st_nlink} names (a hard link)", str(path))
    return fd


def remove(path: Path, *, anchor: Path = ROOT, missing_ok: bool = True) -> bool:
    """Unlink `path` (a file or a link, never followed) through its directory's descriptor;
    whether something was removed."""
    try:
        with directory(path.parent, anchor=anchor) as dfd:
            os.unlink(path.name, dir_fd=dfd)
            os.fsync(dfd)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    return True


def rename(path: Path, new_name: str, *, anchor: Path = ROOT) -> None:
    """Rename `path` to `new_name` in the same directory, through its descriptor."""
    with directory(path.parent, anchor=anchor) as dfd:
        os.rename(path.name, new_name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _temp_name(name: str) -> str:
    return f".{name}{TMP_MARK}{secrets.token_hex(6)}"


def _replace(
    path: Path,
    write: Callable[[int], None],
    mode: int | None,
    anchor: Path,
    owner: tuple[int, int] | None,
) -> None:
    name = path.name
    with directory(path.parent, anchor=anchor, create=True, owner=owner) as dfd:
        old = _lstat_at(name, dfd)
        if old is not None and not stat.S_ISREG(old.st_mode):
            old = None  # a link in the way is replaced: its target's mode and owner are not ours
        tmp = _temp_name(name)
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dfd,
        )
        try:
            try:
                write(fd)
                if owner is None and old is not None and os.geteuid() == 0:
                    owner = (old.st_uid, old.st_gid)
                if owner is not None and os.geteuid() == 0:
                    os.fchown(fd, *owner)  # before fchmod: chown(2) clears set-id bits
                os.fchmod(
                    fd, mode if mode is not None else (old.st_mode & 0o7777 if old else 0o644)
                )
                os.fsync(fd)
                mine = os.fstat(fd)
            finally:
                os.close(fd)
            now = _lstat_at(tmp, dfd)
            if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                raise UsageError(
                    f"{path.parent / tmp} was replaced while egpu-setup wrote it",
                    f"someone else writes in {path.parent}: make it root's and closed to "
                    "others, then run again",
                )
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)


def clean_temp_files(directories: set[Path], *, anchor: Path = ROOT) -> list[Path]:
    """Remove temp files a killed run left next to its targets; return what was removed."""
    removed: list[Path] = []
    for d in sorted(directories):
        # the state may live outside an image root (EGPU_SETUP_STATE_DIR): walked from / then
        base = anchor if Path(os.path.abspath(d)).is_relative_to(os.path.abspath(anchor)) else ROOT
        with contextlib.suppress(OSError, UsageError), directory(d, anchor=base) as dfd:
            for entry in os.scandir(dfd):
                # a temp symlink (link_managed, rollback) is removed too, never followed
                if TMP_MARK in entry.name and (
                    entry.is_symlink() or entry.is_file(follow_symlinks=False)
                ):
                    os.unlink(entry.name, dir_fd=dfd)
                    removed.append(d / entry.name)
    return removed
