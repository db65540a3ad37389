"""Who holds the dpkg lock, read from /proc/locks: a running package manager is told from an
interrupted one (the plan) and named when an install waits for it (execute/dpkg_lock.py)."""

from __future__ import annotations

import os
from pathlib import Path

from egpu_setup.host.machine import Host

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
