"""The one gateway to the machine: every file read and every command goes through a Host.

Three kinds, one interface (DESIGN.md, "host access"):
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
import io
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from egpu_setup.errors import ExecutionError, UnsupportedHardware, UsageError
from egpu_setup.host import process
from egpu_setup.host.process import Result

log = logging.getLogger("egpu_setup")

# sysfs attribute files are tiny; bundle files (dmesg) can be megabytes. Cap what one read takes
# so a hostile or corrupt bundle cannot exhaust memory.
MAX_READ = 64 * 1024 * 1024
_MAX_LINKS = 40  # the kernel's own limit on symlinks followed in one lookup
_C_LOCALE = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}


class Host:
    """A filesystem view rooted at `root`, plus the ability (or not) to run commands."""

    kind = "abstract"

    def __init__(self, root: Path):
        self.root = Path(root)
        self._is_slash = self.root == Path("/")

    # -- paths ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> str | None:
        """The canonical host path of `path` (symlinks followed inside the root), or None."""
        if self._is_slash:
            return os.path.realpath(path)
        parts = [p for p in path.split("/") if p not in ("", ".")]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            real = self.root.joinpath(*done, part)
            if real.is_symlink():
                hops += 1
                if hops > _MAX_LINKS:
                    return None
                target = os.readlink(real)
                if target.startswith("/"):
                    done = []
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            done.append(part)
        return "/" + "/".join(done)

    def real_path(self, path: str) -> Path:
        """Where `path` lies on this machine's disk (for the executor's writes)."""
        resolved = self.resolve(path) or path
        return self.root / resolved.lstrip("/") if not self._is_slash else Path(resolved)

    # -- reads (soft: a missing or unreadable source is None, with a debug line) ---------------

    def read_bytes(self, path: str, limit: int = MAX_READ) -> bytes | None:
        try:
            with open(self.real_path(path), "rb") as f:
                return f.read(limit)
        except OSError as exc:
            log.debug("cannot read %s: %s", path, exc.strerror or exc)
            return None

    def read(self, path: str, limit: int = MAX_READ) -> str | None:
        """Text of a file; None when it is missing, unreadable or binary."""
        data = self.read_bytes(path, limit)
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
            return sorted(os.listdir(self.real_path(path)))
        except OSError:
            return []

    def exists(self, path: str) -> bool:
        return self.real_path(path).exists()

    def is_dir(self, path: str) -> bool:
        return self.real_path(path).is_dir()

    def readlink(self, path: str) -> str | None:
        """The target of the link at `path` itself; links above it resolve inside the root."""
        parent, _, name = path.rstrip("/").rpartition("/")
        parent_real = self.resolve(parent or "/") or parent
        real = self.root / parent_real.lstrip("/") / name if not self._is_slash else Path(path)
        try:
            return os.readlink(real)
        except OSError:
            return None

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

    def write_attr(self, path: str, value: str) -> None:
        """Write an existing sysfs attribute (never creates a file); ExecutionError on failure."""
        try:
            fd = os.open(self.real_path(path), os.O_WRONLY)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise ExecutionError(
                f"cannot write {value.strip()!r} to {path}: {exc.strerror or exc}",
                "run as root; see dmesg for what the kernel refused",
            ) from exc

    def free_bytes(self, path: str) -> int | None:
        """Bytes a normal process may still write on the filesystem that would hold `path`
        (its nearest existing ancestor); None when that cannot be told."""
        real = self.real_path(path)
        while not real.exists() and real != real.parent:
            real = real.parent
        try:
            st = os.statvfs(real)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def uname(self) -> tuple[str | None, str | None]:
        """(kernel release, machine) of the running kernel."""
        u = os.uname()
        return u.release, u.machine

    # -- commands: every process egpu-setup starts goes through one of these -------------------

    def command(self, name: str, argv: Sequence[str], timeout: float = 10.0) -> str | None:
        """The text a diagnostic command prints (stdout, else stderr), or None if unavailable.

        `name` is the bundle's file name (commands/<name>.txt); `argv` is what a live host runs.
        """
        if self.which(argv[0]) is None:
            log.debug("%s: not installed", argv[0])
            return None
        try:
            res = self.run(argv, timeout=timeout)
        except ExecutionError as exc:
            log.debug("%s", exc.message)
            return None
        return res.out if res.out.strip() else (res.err or None)

    def command_lines(
        self, name: str, argv: Sequence[str], timeout: float = 10.0, limit: int | None = None
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
    ) -> Result:
        """Run argv (a list, never a shell string) to its end, its output captured, in the C
        locale (parsers read it). ExecutionError when it cannot start or misses the deadline."""
        full, spawn_env, replace = self.spawn_args(argv, {**_C_LOCALE, **(env or {})}, False)
        log.debug("run: %s", full)
        res = process.spawn(full, env=spawn_env, replace_env=replace, timeout=timeout)
        if res.timed_out:
            raise ExecutionError(
                f"`{' '.join(argv)}` did not finish within {timeout:g} s",
                "see the log above; re-run when the machine is idle",
                argv=argv,
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
            real = self.real_path(candidate)
            if real.is_file() and os.access(real, os.X_OK):
                return candidate
        return None


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
        return shutil.which(name)

    def argv_for(self, argv: Sequence[str]) -> list[str]:
        return list(argv)


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
        if not any((bundle / part).exists() for part in ("root", "commands", "meta.json")):
            raise UsageError(
                f"{bundle} is not a recorded host: it has no root/, commands/ or meta.json",
                "pass a directory written by `egpu-setup record DIR`, or lay out a pasted "
                "report as DIR/commands/lspci.txt, nvidia-smi.txt, dmesg.txt",
            )
        super().__init__(bundle / "root")
        self.bundle = bundle
        self.meta = _read_meta(bundle / "meta.json")
        env = self.meta.get("env")
        self._env = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    def getenv(self, name: str) -> str | None:
        return self._env.get(name)

    def uname(self) -> tuple[str | None, str | None]:
        u = self.meta.get("uname")
        u = u if isinstance(u, dict) else {}
        release = u.get("release") or self.read_attr("/proc/sys/kernel/osrelease")
        return release, u.get("machine")

    def command(self, name: str, argv: Sequence[str], timeout: float = 10.0) -> str | None:
        path = self.bundle / "commands" / f"{name}.txt"
        try:
            data = path.read_bytes()[:MAX_READ]
        except OSError:
            return None
        if b"\0" in data:
            log.debug("ignoring %s: binary content", path)
            return None
        return data.decode("utf-8", errors="replace")

    def command_lines(
        self, name: str, argv: Sequence[str], timeout: float = 10.0, limit: int | None = None
    ) -> TextLines | None:
        """The lines of commands/<name>.txt, read as they are iterated (a 100 MB kernel log costs
        no more memory than a 1 MB one). Over `limit` bytes (default MAX_READ) only the newest
        part is read, from the first line that starts in the last `limit` bytes: a log's news is
        at its end, and `skipped` says how much was left out. None when missing, unreadable or
        binary, and when a link takes it out of the bundle."""
        path = self.bundle / "commands" / f"{name}.txt"
        if not path.resolve().is_relative_to(self.bundle.resolve()):
            log.debug("ignoring %s: it leads out of the bundle", path)
            return None
        return _file_lines(path, MAX_READ if limit is None else limit)

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


def _file_lines(path: Path, limit: int) -> TextLines | None:
    """A file's lines as TextLines, the newest `limit` bytes of it at most; soft like every read
    (None, with a debug line, when it is missing, unreadable or binary)."""
    try:
        with open(path, "rb") as f:
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
            with open(path, "rb") as f:
                f.seek(start)
                # split at b"\n" only (str.splitlines would also split at \r and others)
                while raw := f.readline(_PIECE):
                    yield raw.decode("utf-8", errors="replace")
        except OSError as exc:  # gone or unreadable since: what was read is what there is
            log.debug("cannot read %s: %s", path, exc.strerror or exc)

    return TextLines(lines(), size, start)


def _read_meta(path: Path) -> dict:
    """meta.json of a bundle as a dict; {} when missing or malformed (soft, like every source)."""
    import json

    try:
        meta = json.loads(path.read_bytes()[:MAX_READ].decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        log.debug("no usable %s", path)
        return {}
    return meta if isinstance(meta, dict) else {}


class RootHost(Host):
    """A directory holding a whole system (a debootstrap root, a lab image): `--root DIR`.

    Every command is entered with its API filesystems in namespaces of its own
    (host/image_root.py). Nothing in an image is running, so the diagnostic commands that
    describe a running machine (lspci, nvidia-smi, boltctl, dmesg, mokutil) are not run there:
    they would describe the build host. The kernel is the image's newest, not the build host's."""

    kind = "root"

    def __init__(self, root: str | os.PathLike[str]):
        root = Path(root).resolve()
        if not root.is_dir():
            raise UsageError(f"--root {root}: no such directory", "create the image root first")
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

    def command(self, name: str, argv: Sequence[str], timeout: float = 10.0) -> str | None:
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
