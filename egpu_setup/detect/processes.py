"""Which processes hold which files: /proc/PID/fd links and /proc/PID/maps, through a Host.

The one reading of /proc's open files for everything that asks who uses the GPU: eject (a
process on any of the card's nodes blocks it), the sleep guard and resume-check (a process on
/dev/nvidia-uvm is a CUDA job). It is what `fuser -v /dev/nvidia*` prints, read the way fuser
reads it (psmisc's fuser.c walks the same two places: an `F` is an open file, an `m` a
mapping): tests/install/test_sleep_guard.py replays a user's fuser listing through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from egpu_setup.host.machine import Host


@dataclass(frozen=True)
class ProcEntry:
    """What /proc shows of one process: what it has open (fd links) or mapped (maps)."""

    pid: int
    comm: str
    uid: int | None
    paths: tuple[str, ...]


def probe_procs(host: Host) -> Iterator[ProcEntry]:
    """Every process /proc shows that has a file open or mapped, with those paths."""
    for name in host.listdir("/proc"):
        if not name.isdigit():
            continue
        paths = set()
        for fd in host.listdir(f"/proc/{name}/fd"):
            target = host.readlink(f"/proc/{name}/fd/{fd}")
            if target:
                paths.add(target)
        for line in (host.read(f"/proc/{name}/maps") or "").splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6:
                paths.add(fields[5].strip())
        if paths:
            comm = host.read_attr(f"/proc/{name}/comm") or "?"
            yield ProcEntry(int(name), comm, _uid(host, name), tuple(sorted(paths)))


def _uid(host: Host, pid: str) -> int | None:
    """The real uid in /proc/PID/status (proc(5): `Uid:` real, effective, saved, fs)."""
    for line in (host.read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None
