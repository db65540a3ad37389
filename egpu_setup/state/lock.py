"""The run lock: one egpu-setup run at a time per target.

Kept by hand rather than the filelock package: contention names the holder (its pid and
command line, exit 5), the lock file is never opened through a link, and a file a stranger
planted in the world-writable /run/lock is replaced; filelock does none of these. It costs less
too: 0.04 ms to take and release here, 0.12 ms with filelock 4.3, whose import takes 31 ms.

The file also holds, one line each, the session of every child started while the lock is held
(host/process.recording). The kernel ends the children of a run killed with -9 (their
parent-death signal) but not what they started (a `pip wheel`'s build backend): the next run,
finding the lines a release would have removed, ends what is left of those sessions and says
which run it took the lock over from. A flock dies with its holder, so a live run's lock is
never taken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import threading
from pathlib import Path

from egpu_setup.errors import BusyError, EgpuSetupError
from egpu_setup.host.process import end_leftovers, recording
from egpu_setup.log import get_logger
from egpu_setup.state.atomic import ROOT, make_dirs, open_file, remove
from egpu_setup.state.paths import denied

log = get_logger("egpu_setup.state")

_SESSION = "session "  # "session SID START": a child's session id and its start (clock ticks)


def _sessions(text: str) -> list[tuple[int, int]]:
    """The (session id, start time) pairs a lock file's text records; other lines are ignored."""
    found = []
    for line in text.splitlines():
        fields = line.removeprefix(_SESSION).split()
        if line.startswith(_SESSION) and len(fields) == 2 and all(f.isdigit() for f in fields):
            found.append((int(fields[0]), int(fields[1])))
    return found


class RunLock:
    """One run at a time per target: a non-blocking flock; contention names the holder (exit 5)."""

    def __init__(self, path: Path, anchor: Path = ROOT):
        self.path = path
        self.anchor = anchor  # the lock's directory is walked from it, no link followed
        self._fd: int | None = None
        self._end = 0  # where the next session line goes
        self._writing = threading.Lock()  # children may start from several threads
        self._recording = contextlib.ExitStack()

    def holder(self) -> str | None:
        """Who holds the lock ("pid 123: egpu-setup install …"), or None when it is free."""
        try:
            fd = open_file(
                self.path, os.O_RDONLY | os.O_NONBLOCK, anchor=self.anchor, create_dirs=False
            )
        except (OSError, EgpuSetupError):  # missing, or a link on the way: nobody we know
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return _first_line(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def acquire(self) -> None:
        try:
            make_dirs(self.path.parent, anchor=self.anchor)
            if os.geteuid() == 0:
                self._evict_stranger()
            # 0600 and no symlinks: in the world-writable /run/lock nobody else may open (and
            # so flock) root's lock, or point it elsewhere.
            fd = open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, anchor=self.anchor)
        except PermissionError as exc:  # a root-owned lock (or its directory), not root
            raise denied(self.path, "lock") from exc
        except OSError as exc:  # a directory, a link (ELOOP), a read-only or full disk
            raise self._unusable(exc) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device where the lock goes
            os.close(fd)
            raise self._unusable(OSError(errno.EINVAL, "not a regular file"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            text = _first_line(fd)
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise BusyError(
                    f"another egpu-setup run holds {self.path} ({text})",
                    "wait for it to finish; never delete the lock file",
                ) from exc
            raise
        self._take_over(os.pread(fd, 65536, 0).decode(errors="replace"))
        line = f"pid {os.getpid()}: {' '.join(sys.argv)[:300]}\n".encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, line, 0)
        except OSError as exc:  # a full disk: the flock holds all the same, only the name is lost
            log.debug("cannot write who holds %s: %s", self.path, exc.strerror or exc)
        self._fd, self._end = fd, len(line)
        self._recording.enter_context(recording(self._note_session))

    def _take_over(self, left: str) -> None:
        """A run that released its lock left the file empty: text here is a killed run's."""
        if not left.strip():
            return
        ended = [pid for sid, start in _sessions(left) for pid in end_leftovers(sid, start)]
        log.warning(
            "taking over %s from a run that ended without releasing it (%s)%s",
            self.path,
            left.splitlines()[0][:200],
            f"; ended {len(ended)} process(es) it left: pid {', '.join(map(str, ended))}"
            if ended
            else "",
        )

    def _note_session(self, sid: int, start: int) -> None:
        line = f"{_SESSION}{sid} {start}\n".encode()
        with self._writing:
            if self._fd is None:
                return
            try:
                os.pwrite(self._fd, line, self._end)
                self._end += len(line)
            except OSError as exc:  # a full disk: that child is not ended by a later run
                log.debug("cannot record session %d in %s: %s", sid, self.path, exc)

    def _unusable(self, exc: OSError) -> EgpuSetupError:
        what = {
            errno.EISDIR: "is a directory, not a lock file",
            errno.ELOOP: "is a symbolic link, which egpu-setup never follows",
        }.get(exc.errno or 0, f"cannot be opened: {exc.strerror or exc}")
        if exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT):
            # the folder, not the file, is what must change: a read-only or full filesystem
            return EgpuSetupError(
                f"the run lock {self.path} {what}",
                f"make {self.path.parent} writable (remount it read-write, or free space on "
                "it) or point EGPU_SETUP_STATE_DIR elsewhere, then run again",
            )
        return EgpuSetupError(
            f"the run lock {self.path} {what}",
            f"remove {self.path} (egpu-setup creates the file itself) and run again",
        )

    def _evict_stranger(self) -> None:
        """A lock file root did not make (another user's, a link) is not our lock: any user
        can create one in /run/lock and flock it to block every run. Replace it."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            return  # never removed: acquire says what it is
        # a second name is another file: a user's hard link to one of root's (fs.protected_
        # hardlinks off) would have the lock's truncate and pid line written into it
        if st.st_uid != 0 or not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            log.warning(
                "replacing %s: it is not a regular file root made (uid %d, %d names)",
                self.path,
                st.st_uid,
                st.st_nlink,
            )
            remove(self.path, anchor=self.anchor)

    def release(self) -> None:
        self._recording.close()
        with self._writing:
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


def _first_line(fd: int) -> str:
    """Who holds the lock, as its file's first line says ("unknown pid" when it says nothing)."""
    lines = os.pread(fd, 4096, 0).decode(errors="replace").strip().splitlines()
    return lines[0] if lines else "unknown pid"
