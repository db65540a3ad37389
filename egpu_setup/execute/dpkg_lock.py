"""The dpkg lock: wait for it, name its holder; never delete it or kill whoever holds it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from egpu_setup.errors import BusyError
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.execute")

DPKG_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")


def lock_holder(host: Host) -> str | None:
    """ "pid 123 (unattended-upgr)" for whoever holds the dpkg frontend lock, from /proc/locks."""
    for lock in DPKG_LOCKS:
        try:
            st = host.real_path(lock).stat()
        except OSError:
            continue
        try:
            locks = Path("/proc/locks").read_text()
        except OSError:
            return None
        for line in locks.splitlines():
            fields = line.split()
            # "1: POSIX  ADVISORY  WRITE 4711 08:01:1234 0 EOF"; blocked waiters have "->"
            if len(fields) < 6 or "->" in fields:
                continue
            try:
                major, minor, ino = fields[5].split(":")
                pid = int(fields[4])
            except ValueError:
                continue
            if int(ino) == st.st_ino and os.makedev(int(major, 16), int(minor, 16)) == st.st_dev:
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    comm = "?"
                return f"pid {pid} ({comm}) holds {lock}"
    return None


def wait_for_dpkg_lock(host: Host, timeout: float) -> None:
    """Wait until nobody holds the dpkg locks; BusyError naming the holder after `timeout`."""
    import fcntl

    deadline = time.monotonic() + timeout
    announced = False
    while True:
        busy = None
        for lock in DPKG_LOCKS:
            real = host.real_path(lock)
            try:
                fd = os.open(real, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.lockf(fd, fcntl.LOCK_UN)
            except OSError:
                busy = lock
            finally:
                os.close(fd)
            if busy:
                break
        if busy is None:
            return
        holder = lock_holder(host) or f"another process holds {busy}"
        if time.monotonic() >= deadline:
            raise BusyError(
                f"the package manager is busy: {holder} (waited {timeout:g} s)",
                "let it finish (unattended-upgrades often runs after boot), then run again; "
                "never delete the lock",
            )
        if not announced:
            log.warning("waiting up to %g s for the package manager: %s", timeout, holder)
            announced = True
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
