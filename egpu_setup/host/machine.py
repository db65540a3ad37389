"""The one gateway to the machine: every file read and every command goes through a Host.

Three kinds, one interface (docs/design.md, "The pipeline"):
- LiveHost: this machine, `/`.
- RecordedHost (`--from DIR`): a bundle written by `egpu-setup record`; files come from DIR/root,
  command output from DIR/commands/<name>.txt, and nothing is ever executed.
- RootHost (`--root DIR`): every path lives under DIR and commands run entered into DIR, with
  its API filesystems, in namespaces of their own (host/image_root.py).

Paths are always written as they are on the host ("/sys/bus/pci/devices"). Symbolic links are
resolved inside the root, the way the kernel would resolve them after a chroot, so a recorded
sysfs tree behaves like the real one and a link in a bundle can never reach this machine's files.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from egpu_setup.errors import ExecutionError, TimedOut, UnsupportedHardware, UsageError
from egpu_setup.host import process
from egpu_setup.host.process import Result
from egpu_setup.host.trust import check_image
from egpu_setup.log import get_logger

log = get_logger("egpu_setup")

# sysfs attribute files are tiny; bundle files (dmesg) can be megabytes. Cap what one read takes
# so a hostile or corrupt bundle cannot exhaust memory.
MAX_READ = 64 * 1024 * 1024
# A diagnostic tool (lspci, boltctl, mokutil, ...) that has not answered in this long hangs: it
# is ended and named (detect, doctor: tool-timed-out). nvidia-smi and the ROCm tools take longer.
TOOL_TIMEOUT_S = 10.0
_MAX_LINKS = 40  # the kernel's own limit on symlinks followed in one lookup
_C_LOCALE = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
_BENEATH_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_BENEATH_FILE = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC


class Host:
    """A filesystem view rooted at `root`, plus the ability (or not) to run commands."""

    kind = "abstract"

    def __init__(self, root: Path):
        self.root = Path(root)
        self._is_slash = self.root == Path("/")
        self.timed_out: list[tuple[str, float]] = []  # (tool, seconds) that missed a deadline

    # -- paths ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> str | None:
        """The canonical host path of `path` (symlinks followed inside the root), or None when
        they loop; looked up by descriptors (`resolve_beneath`)."""
        try:
            found = resolve_beneath(self.root, path)
        except OSError:  # the root itself is missing: nothing under it to follow
            return os.path.normpath("/" + path.lstrip("/"))
        if found is None:
            return None
        os.close(found[1])
        return found[0]

    def real_path(self, path: str) -> Path:
        """Where `path` lies on this machine's disk (for the executor's writes), every link on
        the way resolved inside the root; UsageError when they loop (ELOOP): the raw path would
        let the kernel follow them, out of the root."""
        resolved = self.resolve(path)
        if resolved is None:
            raise UsageError(
                f"{path} under {self.root}: more than {_MAX_LINKS} symbolic links on the way",
                f"remove the link loop under {self.root}",
            )
        return self.root / resolved.lstrip("/") if not self._is_slash else Path(resolved)

    def location(self, path: str) -> Path:
        """Where `path` itself lies on disk: its directories resolved inside the root, its last
        component not followed (writes replace a link, never what it points to)."""
        parent, _, name = path.rstrip("/").rpartition("/")
        if name in ("", ".", "..") or "\0" in path:
            raise UsageError(f"{path!r} is not a path egpu-setup writes", "report this as a bug")
        return self.real_path(parent or "/") / name

    def _real(self, path: str) -> Path | None:
        """real_path, or None (with a debug line) for the soft readers."""
        try:
            return self.real_path(path)
        except UsageError as exc:
            log.debug("%s", exc.message)
            return None

    def _open(self, path: str, flags: int = _BENEATH_FILE, *, directory: bool = False) -> int:
        """The use of a resolved path, in one step: a descriptor of what `path` resolves to,
        opened by `open_beneath` from the root (from `/` on the running system, where the
        resolved path holds no link either), so a link swapped in anywhere since `resolve`
        looked fails the open (ELOOP/ENOTDIR) instead of being followed. OSError (ENOENT when
        it does not resolve) or ValueError."""
        real = self._real(path)
        if real is None:
            raise FileNotFoundError(errno.ENOENT, "does not resolve inside the root", path)
        anchor = Path("/") if self._is_slash else self.root
        rel = real.relative_to(anchor)
        return open_beneath(anchor, rel, flags=flags, directory=directory or not rel.parts)

    def _stat(self, path: str) -> os.stat_result | None:
        """fstat of what `path` resolves to (`_open`, O_PATH); None when it is missing, or a
        link stands where the resolved path had none."""
        try:
            fd = self._open(path, os.O_PATH)
        except (OSError, ValueError):
            return None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return None if stat.S_ISLNK(st.st_mode) else st

    # -- reads (soft: a missing or unreadable source is None, with a debug line) ---------------

    def read_bytes(self, path: str, limit: int = MAX_READ, *, newest: bool = False) -> bytes | None:
        """At most `limit` bytes of a regular file (sysfs and procfs attributes are regular
        files too); None for anything else: a FIFO or a device planted in a bundle or an image
        must neither block a read nor feed it forever. newest: the end of a longer file."""
        try:
            fd = self._open(path)
        except (OSError, ValueError) as exc:
            log.debug("cannot read %s: %s", path, getattr(exc, "strerror", None) or exc)
            return None
        return _read_fd(fd, limit, path, newest)

    def read(self, path: str, limit: int = MAX_READ, *, newest: bool = False) -> str | None:
        """Text of a file; None when it is missing, unreadable or binary."""
        data = self.read_bytes(path, limit, newest=newest)
        if data is None:
            return None
        if b"\0" in data:
            log.debug("ignoring %s: binary content", path)
            return None
        return data.decode("utf-8", errors="replace")

    def read_attr(self, path: str) -> str | None:
        """A sysfs attribute, stripped; None when missing or empty."""
        text = self.read(path, 4096)
        if text is None:
            return None
        return text.strip() or None

    def listdir(self, path: str) -> list[str]:
        try:
            fd = self._open(path, directory=True)
        except (OSError, ValueError):
            return []
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return self._stat(path) is not None

    def is_dir(self, path: str) -> bool:
        st = self._stat(path)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def file_sizes(self, directory: str, rels: Iterable[str]) -> dict[str, int]:
        """rel -> size of each regular file `rel` below `directory`, by lstat relative to its
        folder's descriptor (the folders a tree of the rels, each opened once from its parent's
        by `walk_dirs`, depth first, no link followed: a venv's RECORD is thousands of files in
        hundreds of folders). A rel that is missing, a link, not a regular file or climbs out
        (`..`) is left out."""
        real = self._real(directory)
        anchor = Path("/") if self._is_slash else self.root
        files: dict[str, list[tuple[str, str]]] = {}  # folder -> (rel, name) of its files
        for rel in rels:
            folder, _, name = rel.rpartition("/")
            files.setdefault(folder, []).append((rel, name))
        # folder name -> its subtree; the key "" of each node: the files in it
        tree: dict[str, Any] = {}
        for folder, named in files.items():
            parts = folder.split("/")
            if ".." in parts:
                continue
            node = tree
            for part in parts:
                if part not in ("", "."):
                    node = node.setdefault(part, {})
            node.setdefault("", []).extend(named)
        sizes: dict[str, int] = {}
        try:
            top = open_beneath(anchor, (real or anchor).relative_to(anchor), directory=True)
        except (OSError, ValueError):
            return sizes
        _sizes_below(top, tree, sizes)
        return sizes

    def readlink(self, path: str) -> str | None:
        """The target of the link at `path` itself; links above it resolve inside the root."""
        parent, _, name = path.rstrip("/").rpartition("/")
        if name in ("", ".", ".."):
            return None
        try:
            fd = self._open(parent or "/", directory=True)
        except (OSError, ValueError):
            return None
        try:
            return os.readlink(name, dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def glob(self, directory: str, pattern: str) -> list[str]:
        """Host paths of the entries of `directory` matching a glob pattern (one level)."""
        import fnmatch

        return [
            f"{directory.rstrip('/')}/{name}"
            for name in self.listdir(directory)
            if fnmatch.fnmatch(name, pattern)
        ]

    def getenv(self, name: str) -> str | None:
        return None

    def bundle_file(self, rel: str, limit: int = MAX_READ) -> str | None:
        """A file of a recorded bundle beside its root/ (commands/torch.json); None elsewhere."""
        return None

    def write_attr(self, path: str, value: str) -> None:
        """Write an existing sysfs attribute (never creates a file); ExecutionError on failure."""
        try:
            fd = self._open(path, os.O_WRONLY)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            raise ExecutionError(
                f"cannot write {value.strip()!r} to {path}: "
                f"{getattr(exc, 'strerror', None) or exc}",
                "run as root; see dmesg for what the kernel refused",
            ) from exc

    def free_bytes(self, path: str) -> int | None:
        """Bytes a normal process may still write on the filesystem that would hold `path`
        (its nearest existing ancestor); None when that cannot be told."""
        st = self._filesystem(path)
        return None if st is None else st[1].f_bavail * st[1].f_frsize

    def filesystem_of(self, path: str) -> int | None:
        """The device number (st_dev) of the filesystem that would hold `path` (as
        free_bytes), so two paths can be told to share one; None when that cannot be told."""
        st = self._filesystem(path)
        return None if st is None else st[0]

    def statvfs(self, path: str) -> os.statvfs_result | None:
        """statvfs(2) of the filesystem that would hold `path` (as free_bytes): its flags
        (read-only) and block counts; None when that cannot be told."""
        st = self._filesystem(path)
        return None if st is None else st[1]

    def _filesystem(self, path: str) -> tuple[int, os.statvfs_result] | None:
        """(st_dev, statvfs) of the nearest existing directory on the way to `path` (the path
        itself when it is one), taken on the descriptor the lookup ended on (fstat, fstatvfs):
        a link swapped in after the lookup cannot send the answer to another filesystem; None
        when that cannot be told."""
        try:
            found = resolve_beneath(self.root, path)
        except OSError:
            return None
        if found is None:
            return None
        fd = found[1]
        try:
            return os.fstat(fd).st_dev, os.fstatvfs(fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def uname(self) -> tuple[str | None, str | None]:
        """(kernel release, machine) of the running kernel."""
        u = os.uname()
        return u.release, u.machine

    # -- commands: every process egpu-setup starts goes through one of these -------------------

    def command(self, name: str, argv: Sequence[str], timeout: float | None = None) -> str | None:
        """The text a diagnostic command prints (stdout, else stderr), or None if unavailable.

        `name` is the bundle's file name (commands/<name>.txt); `argv` is what a live host runs.
        """
        if self.which(argv[0]) is None:
            log.debug("%s: not installed", argv[0])
            return None
        try:
            res = self.run(argv, timeout=TOOL_TIMEOUT_S if timeout is None else timeout)
        except TimedOut as exc:
            # a diagnostic tool that hangs is evidence itself (a GPU that stopped answering
            # hangs nvidia-smi): said now, and kept for doctor (HostFacts.timed_out)
            self.timed_out.append((argv[0], exc.timeout))
            log.warning("%s did not answer within %g s and was ended", argv[0], exc.timeout)
            return None
        except ExecutionError as exc:
            log.debug("%s", exc.message)
            return None
        return res.out if res.out.strip() else (res.err or None)

    def command_lines(
        self,
        name: str,
        argv: Sequence[str],
        timeout: float | None = None,
        limit: int | None = None,
    ) -> TextLines | None:
        """`command`'s text as TextLines, for a consumer that scans a log as it goes; None when
        `command` would give None. A recording streams its file (RecordedHost); a command's
        output is already held, and bounded, by host/process.py. Over `limit` bytes (default
        MAX_READ) only the lines that start in the newest `limit` bytes are given."""
        text = self.command(name, argv, timeout=timeout)
        if text is None:
            return None
        data = text.encode("utf-8")
        limit = MAX_READ if limit is None else limit
        start = 0
        if len(data) > limit:
            newline = data.find(b"\n", len(data) - limit - 1)
            start = len(data) if newline < 0 else newline + 1
            text = data[start:].decode("utf-8")
        return TextLines(iter(io.StringIO(text, newline="\n")), len(data), start)

    def argv_for(self, argv: Sequence[str]) -> list[str]:
        """How `argv` runs on this host (through chroot under --root); a recording runs nothing."""
        raise ExecutionError(
            f"a recorded host cannot run commands: {' '.join(argv)}",
            "use --from only with read-only commands or --dry-run",
            argv=argv,
        )

    def spawn_args(
        self, argv: Sequence[str], env: Mapping[str, str] | None, replace_env: bool
    ) -> tuple[list[str], Mapping[str, str] | None, bool]:
        """(argv, env, replace_env) as process.spawn gets them on this host: an image enters its
        root and sees only part of our environment (host/image_root.py)."""
        return self.argv_for(argv), env, replace_env

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        run_as: tuple[int, int] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        input: bytes | None = None,
    ) -> Result:
        """Run argv (a list, never a shell string) to its end, its output captured, in the C
        locale (parsers read it). ExecutionError when it cannot start or misses the deadline.
        run_as: (uid, gid) to run as, no supplementary groups (host/trust.py decides it).
        input: a few bytes on stdin, a secret an argv would show (host/process.py spawn)."""
        full, spawn_env, replace = self.spawn_args(argv, {**_C_LOCALE, **(env or {})}, False)
        log.debug("run: %s", full)
        res = process.spawn(
            full,
            env=spawn_env,
            replace_env=replace,
            timeout=timeout,
            run_as=run_as,
            cwd=cwd,
            input=input,
        )
        if res.timed_out and timeout is not None:
            raise TimedOut(
                f"`{' '.join(argv)}` did not finish within {timeout:g} s",
                "see the log above; re-run when the machine is idle",
                argv=argv,
                timeout=timeout,
            )
        return res

    def stream(
        self,
        argv: Sequence[str],
        *,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        replace_env: bool = False,
        cwd: str | os.PathLike[str] | None = None,
        run_as: tuple[int, int] | None = None,
        term_grace: float = 0.0,
    ) -> Result:
        """Run argv with each line of its output (stderr merged in) passed to `on_line` as it
        comes; stdin closed; on timeout its whole session is ended (host/process.py).

        Never raises for an exit status or a timeout (Result.rc, Result.timed_out), only when the
        program cannot be started. env is added to this process's environment, or is the whole
        environment with replace_env; cwd is a directory of this machine."""
        full, spawn_env, replace = self.spawn_args(argv, env, replace_env)
        log.info("run: %s", " ".join(full))
        return process.spawn(
            full,
            env=spawn_env,
            replace_env=replace,
            cwd=cwd,
            timeout=timeout,
            on_line=on_line,
            merge_stderr=True,
            run_as=run_as,
            term_grace=term_grace,
        )

    def run_checked(
        self,
        argv: Sequence[str],
        *,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        replace_env: bool = False,
    ) -> Result:
        """`stream`, and ExecutionError (quoting the output's last lines) unless it exits 0."""
        res = self.stream(argv, on_line=on_line, timeout=timeout, env=env, replace_env=replace_env)
        if res.timed_out:
            raise ExecutionError(
                f"`{' '.join(res.argv)}` did not finish within {timeout:g} s and was killed",
                "the output above (if any) shows where it stopped; fix the cause and run again",
                argv=res.argv,
                rc=None,
                stderr_tail=res.tail(),
            )
        if res.rc != 0:
            raise ExecutionError(
                f"`{' '.join(argv)}` exited with {res.rc}",
                "the output above says why; fix it and run the same command again",
                argv=argv,
                rc=res.rc,
                stderr_tail=res.tail(),
            )
        return res

    def which(self, name: str) -> str | None:
        for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
            candidate = f"{d}/{name}"
            st = self._stat(candidate)
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
                return candidate
        return None


def walk_dirs(
    anchor: Path | int,
    parts: Sequence[str],
    *,
    create_mode: int | None = None,
    owner: tuple[int, int] | None = None,
) -> int:
    """The one directory walk: a descriptor of anchor/parts, each component opened with
    openat(2) `O_DIRECTORY|O_NOFOLLOW` relative to the one above, so a link anywhere below
    `anchor` (planted, or swapped in after a check) fails the walk instead of leading out.
    `anchor` itself is the caller's (`/`, an image root, a folder it checked, or the descriptor
    of a directory already walked to, which stays open). create_mode: a
    missing directory is made (mkdirat(2), that mode less the umask; `owner`'s, set on its
    descriptor, when we are root). OSError as the kernel says, its filename the path walked
    up to the component that failed (ELOOP/ENOTDIR: a link or a non-directory there)."""
    if isinstance(anchor, int):
        if not parts:
            return os.dup(anchor)
        fd = anchor  # the caller's: the first component is opened from it, it is not closed
    else:
        fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                try:
                    nxt = os.open(part, _BENEATH_DIR, dir_fd=fd)
                except FileNotFoundError:
                    if create_mode is None:
                        raise
                    made = True
                    try:
                        os.mkdir(part, create_mode, dir_fd=fd)
                    except FileExistsError:
                        made = False  # another run made it meanwhile: opened as it is
                    nxt = os.open(part, _BENEATH_DIR, dir_fd=fd)
                    if made and owner is not None and os.geteuid() == 0:
                        os.fchown(nxt, *owner)
            except OSError as exc:
                top = f"/proc/self/fd/{anchor}" if isinstance(anchor, int) else anchor
                raise OSError(exc.errno, exc.strerror, str(Path(top, *parts[: i + 1]))) from None
            if fd != anchor:
                os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        if fd != anchor:
            os.close(fd)
        raise


def _sizes_below(fd: int, node: dict[str, Any], sizes: dict[str, int]) -> None:
    """Host.file_sizes' walk: the files of `node` stat'ed relative to `fd` (lstat: a link is
    not a regular file), then each subfolder opened by `walk_dirs` from `fd` and walked the
    same way; closes `fd`. One openat(2) per folder, no more descriptors held than the tree is
    deep."""
    try:
        for rel, name in node.get("", ()):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(st.st_mode):
                sizes[rel] = st.st_size
        for part, below in node.items():
            if part:
                try:
                    sub = walk_dirs(fd, [part])
                except OSError:
                    continue
                _sizes_below(sub, below, sizes)
    finally:
        os.close(fd)


def resolve_beneath(root: Path, path: str) -> tuple[str, int] | None:
    """`path` resolved the way the kernel would after a chroot into `root` (links followed, an
    absolute target from `root` again, `..` never above it), by descriptors: each existing
    directory is opened from the one above by `walk_dirs` and each link read with readlinkat,
    so nothing is looked up by name a second time. Returns (the canonical path, a descriptor
    of its deepest existing directory: the caller closes it), or None after _MAX_LINKS links.
    Below a missing or unreadable component the rest is kept as written (realpath(3) does
    the same)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    fds = [walk_dirs(root, [])]  # fds[i]: the directory done[:i]; done may go deeper
    hops = 0
    try:
        while parts:
            part = parts.pop(0)
            if part == "..":
                if len(fds) > 1 and len(fds) == len(done) + 1:
                    os.close(fds.pop())
                if done:
                    done.pop()
                continue
            if len(fds) != len(done) + 1:  # below a missing component: nothing to look at
                done.append(part)
                continue
            try:
                st = os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            except OSError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_LINKS:
                    return None
                try:
                    target = os.readlink(part, dir_fd=fds[-1])
                except OSError:  # no longer a link since the lstat: looked at again
                    parts.insert(0, part)
                    continue
                if target.startswith("/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                    done = []
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            if st is not None and stat.S_ISDIR(st.st_mode):
                try:
                    fds.append(walk_dirs(fds[-1], [part]))
                except OSError as exc:
                    if exc.errno == errno.ELOOP:  # a link swapped in since the lstat: again
                        parts.insert(0, part)
                        hops += 1
                        if hops > _MAX_LINKS:
                            return None
                        continue
            done.append(part)
        return "/" + "/".join(done), fds.pop()
    finally:
        for fd in fds:
            os.close(fd)


def below_parts(rel: str | os.PathLike[str]) -> list[str]:
    """The components of a relative path, `.` and empty ones left out; ValueError for a `..`
    (a walk below an anchor never climbs out of it)."""
    parts = [p for p in str(rel).split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{rel!r} climbs out of the directory it is read in")
    return parts


def open_beneath(
    base: Path,
    rel: str | os.PathLike[str],
    *,
    directory: bool = False,
    flags: int = _BENEATH_FILE,
) -> int:
    """The one way egpu-setup opens a file of an untrusted tree (`--root`, `--from`, a bundle,
    a state or report folder): `walk_dirs` to its directory, then the file itself opened
    relative to that descriptor with O_NOFOLLOW, so no link below `base` is followed. flags:
    how the file is opened (read-only by default; O_NOFOLLOW is always added). OSError as the
    kernel says; ValueError for a `..` or an empty path."""
    parts = below_parts(rel)
    if not parts and not directory:
        raise ValueError(f"{rel!r} is not a path below {base}")
    if directory:
        return walk_dirs(base, parts)
    dfd = walk_dirs(base, parts[:-1])
    try:
        fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        refuse_foreign_hard_link(fd, dfd, parts[-1])
        return fd
    finally:
        os.close(dfd)


def refuse_foreign_hard_link(fd: int, dfd: int, name: str) -> None:
    """Close `fd` and raise OSError (EPERM) when it is a regular file with more than one name
    and another owner than the folder `dfd` it was found in: someone else's file a user linked
    into their folder (link(2) needs no right on the file where fs.protected_hardlinks is 0, as
    in many containers and image builds, so egpu-setup does not count on that setting:
    https://docs.kernel.org/admin-guide/sysctl/fs.html#protected-hardlinks). A hard link is
    not a symbolic one: O_NOFOLLOW cannot see it, only the link count and the owner can."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and st.st_uid != os.fstat(dfd).st_uid:
        os.close(fd)
        raise OSError(
            errno.EPERM,
            f"a hard link to a file of uid {st.st_uid}, in a folder of another owner",
            name,
        )


def read_beneath(
    base: Path, rel: str | os.PathLike[str], limit: int = MAX_READ, *, newest: bool = False
) -> bytes | None:
    """read_regular of base/rel through `open_beneath`: None, with a debug line, when a link
    below `base`, a missing or a non-regular file is in the way."""
    try:
        fd = open_beneath(base, rel)
    except (OSError, ValueError) as exc:
        log.debug("cannot read %s in %s: %s", rel, base, getattr(exc, "strerror", None) or exc)
        return None
    return _read_fd(fd, limit, str(rel), newest)


def listdir_beneath(base: Path, rel: str | os.PathLike[str]) -> list[str]:
    """The entries of the directory base/rel (`open_beneath`); [] when it cannot be opened."""
    try:
        fd = open_beneath(base, rel, directory=True)
    except (OSError, ValueError):
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def read_regular(
    real: Path, limit: int = MAX_READ, *, label: str | None = None, newest: bool = False
) -> bytes | None:
    """At most `limit` bytes of the regular file at `real` (its last component not followed);
    None, with a debug line, when it is missing, unreadable, a link or not a regular file.

    newest: of a longer file keep the last `limit` bytes (a log, whose recent end matters), and
    say so in a warning."""
    try:
        fd = os.open(real, _BENEATH_FILE)
    except OSError as exc:
        log.debug("cannot read %s: %s", label or real, exc.strerror or exc)
        return None
    return _read_fd(fd, limit, str(label or real), newest)


def _read_fd(fd: int, limit: int, label: str, newest: bool) -> bytes | None:
    """At most `limit` bytes of the regular file open at `fd` (closed here); see read_regular."""
    real = label
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            log.debug("ignoring %s: not a regular file", label or real)
            return None
        if newest and st.st_size > limit:
            log.warning(
                "%s is %d MiB: reading its last %d MiB only",
                label or real,
                st.st_size >> 20,
                limit >> 20,
            )
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(limit - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        log.debug("cannot read %s: %s", label or real, exc.strerror or exc)
        return None
    finally:
        os.close(fd)


def refuse_links_below(base: Path, target: Path, *, leaf: bool = False) -> Path:
    """`target`, after checking that no directory between `base` and it is a symbolic link
    (and with `leaf`, not `target` itself either); UsageError naming the first that is. For a
    directory the user named (`render --out`, `install --bundle`): a link planted inside it
    (DIR/etc -> /etc) must not carry a write, or a read, onto this machine's own files."""
    parts = target.relative_to(base).parts
    current = base
    for part in parts if leaf else parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise UsageError(
                f"{current} is a symbolic link (-> {os.readlink(current)}): egpu-setup does "
                f"not follow links inside {base}",
                f"replace the link by what it points to, or use a fresh directory for {base}",
            )
    return target


def check_platform(platform: str) -> None:
    """macOS and native Windows cannot run an NVIDIA eGPU with CUDA: say so, clearly."""
    if platform == "darwin":
        raise UnsupportedHardware(
            "macOS is not supported: Apple dropped NVIDIA drivers after macOS 10.13, and Apple "
            "Silicon Macs support no eGPU at all, so CUDA on an eGPU cannot work there",
            "run egpu-setup on a Linux laptop (Ubuntu, Debian, Fedora) or in WSL2 on Windows",
        )
    if platform in ("win32", "cygwin"):
        raise UnsupportedHardware(
            "native Windows is not supported: there the NVIDIA driver and CUDA come from NVIDIA's "
            "Windows installer, which egpu-setup does not manage",
            "run egpu-setup inside WSL2 (Ubuntu): the Windows driver serves the GPU, egpu-setup "
            "installs and verifies torch",
        )


class LiveHost(Host):
    """This machine."""

    kind = "live"

    def __init__(self, platform: str | None = None) -> None:
        check_platform(platform or sys.platform)
        super().__init__(Path("/"))

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def which(self, name: str) -> str | None:
        """Where the program `name` would be started from (host/process.search_dirs: root never
        looks in the caller's PATH); a name with a slash is taken as it is."""
        if "/" in name:
            return name if _is_executable(name) else None
        return process.find(name)

    def argv_for(self, argv: Sequence[str]) -> list[str]:
        """argv with its program by absolute path (`which`); one not found is left to
        host/process.py, which looks in its SYSTEM_PATH only and otherwise says not found."""
        found = self.which(argv[0]) if argv and "/" not in argv[0] else None
        return [found or argv[0], *argv[1:]]


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


class RecordedHost(Host):
    """A bundle recorded by `egpu-setup record` (or assembled from a bug report): read-only."""

    kind = "recorded"

    def __init__(self, bundle: str | os.PathLike[str]):
        bundle = Path(bundle)
        if not bundle.is_dir():
            raise UsageError(
                f"recorded host not found: {bundle}",
                "pass a directory written by `egpu-setup record DIR`",
            )
        if not any(os.path.lexists(bundle / part) for part in ("root", "commands", "meta.json")):
            raise UsageError(
                f"{bundle} is not a recorded host: it has no root/, commands/ or meta.json",
                "pass a directory written by `egpu-setup record DIR`, or lay out a pasted "
                "report as DIR/commands/lspci.txt, nvidia-smi.txt, dmesg.txt",
            )
        for part in ("root", "commands"):
            if (bundle / part).is_symlink():  # its own links resolve inside; this one cannot
                raise UsageError(
                    f"{bundle / part} is a symbolic link (-> {os.readlink(bundle / part)}): a "
                    "recorded host is read only from inside its directory",
                    "replace the link by a copy of what it points to, or record again",
                )
        super().__init__(bundle / "root")
        self.bundle = bundle
        # files beside root/ (commands/, meta.json) resolve inside the bundle the same way
        self._files = Host(bundle)
        self.meta = _read_meta(self._files)
        env = self.meta.get("env")
        self._env = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    def getenv(self, name: str) -> str | None:
        return self._env.get(name)

    def uname(self) -> tuple[str | None, str | None]:
        u = self.meta.get("uname")
        u = u if isinstance(u, dict) else {}
        release = u.get("release") or self.read_attr("/proc/sys/kernel/osrelease")
        return release, u.get("machine")

    def command(self, name: str, argv: Sequence[str], timeout: float | None = None) -> str | None:
        # a kernel log longer than the cap: its newest part, where the eGPU's errors are
        return self._files.read(f"/commands/{name}.txt", MAX_READ, newest=name == "dmesg")

    def bundle_file(self, rel: str, limit: int = MAX_READ) -> str | None:
        """Text of a file of the bundle beside root/ (commands/torch.json), read inside it."""
        return self._files.read("/" + rel, limit)

    def command_lines(
        self,
        name: str,
        argv: Sequence[str],
        timeout: float | None = None,
        limit: int | None = None,
    ) -> TextLines | None:
        """The lines of commands/<name>.txt, read as they are iterated (a 100 MB kernel log costs
        no more memory than a 1 MB one). Over `limit` bytes (default MAX_READ) only the newest
        part is read, from the first line that starts in the last `limit` bytes: a log's news is
        at its end, and `skipped` says how much was left out. None when missing, unreadable or
        binary, and when a link takes it out of the bundle."""
        return _file_lines(
            self.bundle, f"commands/{name}.txt", MAX_READ if limit is None else limit
        )

    def which(self, name: str) -> str | None:
        return None

    def write_attr(self, path: str, value: str) -> None:
        raise UsageError("a recorded host cannot be changed", "run this on the machine itself")


class TextLines:
    """Lines of text (each with its "\n"), read as they are iterated (once), never held whole.

    size: the source's length in bytes; skipped: bytes at its start that were not read because
    the source is over the reader's limit (0 when it was read whole)."""

    def __init__(self, lines: Iterator[str], size: int, skipped: int = 0) -> None:
        self._lines = lines
        self.size = size
        self.skipped = skipped

    def __iter__(self) -> Iterator[str]:
        return self._lines


_SNIFF = 65536  # bytes looked at for a NUL to call a file binary (what grep(1) does: its buffer)
# A longer line comes in pieces (only the last ends in "\n"; a character cut in two there reads
# as U+FFFD), so memory stays flat even for a file that is one line.
_PIECE = 1024 * 1024


def _file_lines(base: Path, rel: str, limit: int) -> TextLines | None:
    """base/rel's lines as TextLines (opened by `open_beneath`: no link followed), the newest
    `limit` bytes of it at most; soft like every read (None, with a debug line, when it is
    missing, unreadable, binary or not a regular file)."""
    path = base / rel
    try:
        with os.fdopen(open_beneath(base, rel), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                log.debug("ignoring %s: not a regular file", path)
                return None
            size = os.fstat(f.fileno()).st_size
            start = 0
            if size > limit:
                f.seek(size - limit - 1)  # the byte before the cut: is the cut at a line start?
                while (rest := f.readline(_PIECE)) and not rest.endswith(b"\n"):
                    pass  # no: the rest of the line the cut falls into is not read
                start = f.tell()
            head = f.read(_SNIFF)
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc.strerror or exc)
        return None
    if b"\0" in head:
        log.debug("ignoring %s: binary content", path)
        return None

    def lines() -> Iterator[str]:
        try:
            with os.fdopen(open_beneath(base, rel), "rb") as f:
                f.seek(start)
                # split at b"\n" only (str.splitlines would also split at \r and others)
                while raw := f.readline(_PIECE):
                    yield raw.decode("utf-8", errors="replace")
        except OSError as exc:  # gone or unreadable since: what was read is what there is
            log.debug("cannot read %s: %s", path, exc.strerror or exc)

    return TextLines(lines(), size, start)


def _read_meta(files: Host) -> dict[str, Any]:
    """meta.json of a bundle as a dict; {} when missing or malformed (soft, like every source)."""
    import json

    text = files.read("/meta.json", 1024 * 1024)
    try:
        meta = json.loads(text) if text else None
    except (ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict):
        log.debug("no usable meta.json in %s", files.root)
        return {}
    return meta


class RootHost(Host):
    """A directory holding a whole system (a debootstrap root, a lab image): `--root DIR`.

    Every command is entered with its API filesystems in namespaces of its own
    (host/image_root.py). Nothing in an image is running, so the diagnostic commands that
    describe a running machine (lspci, nvidia-smi, boltctl, dmesg, mokutil) are not run there:
    they would describe the build host. The kernel is the image's newest, not the build host's."""

    kind = "root"

    def __init__(self, root: str | os.PathLike[str]):
        given = root
        root = Path(root).resolve()
        if not root.is_dir():
            raise UsageError(f"--root {root}: no such directory", "create the image root first")
        if root == Path("/"):
            raise UsageError(
                f"--root {given} is / itself, the running system, not an image",
                "drop --root to work on this machine, or pass the image's directory",
            )
        check_image(root)
        super().__init__(root)
        self._binds: list[tuple[str, str]] = []

    def argv_for(self, argv: Sequence[str]) -> list[str]:
        from egpu_setup.host.image_root import enter_argv

        return enter_argv(self.root, argv, self._binds)

    def spawn_args(
        self, argv: Sequence[str], env: Mapping[str, str] | None, replace_env: bool
    ) -> tuple[list[str], Mapping[str, str] | None, bool]:
        from egpu_setup.host.image_root import image_env

        return self.argv_for(argv), image_env(env, replace_env), True

    @contextlib.contextmanager
    def bound(self, host_dir: str | os.PathLike[str], image_dir: str) -> Iterator[str]:
        """`host_dir` (of the build host) visible read-only at `image_dir` (under /run) to the
        commands run inside this block; yields image_dir."""
        self._binds.append((os.fspath(host_dir), image_dir))
        try:
            yield image_dir
        finally:
            self._binds.remove((os.fspath(host_dir), image_dir))

    def clean_leftovers(self) -> list[str]:
        from egpu_setup.host.image_root import clean_leftovers

        return clean_leftovers(self.root)

    def command(self, name: str, argv: Sequence[str], timeout: float | None = None) -> str | None:
        log.debug("%s: not run in an image (it would describe the build host)", argv[0])
        return None

    def uname(self) -> tuple[str | None, str | None]:
        from egpu_setup.host.image_root import boot_kernels

        kernels = boot_kernels(self)
        return (kernels[-1] if kernels else None), os.uname().machine


def open_host(from_dir: str | os.PathLike[str] | None = None, root: str | None = None) -> Host:
    """The host a command works on: a recording, a root prefix, or this machine."""
    if from_dir is not None:
        return RecordedHost(Path(from_dir))
    if root is not None:
        return RootHost(Path(root))
    return LiveHost()
