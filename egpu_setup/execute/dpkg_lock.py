"""The dpkg lock: wait for it, name its holder; never delete it or kill whoever holds it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from egpu_setup.errors import BusyError
from egpu_setup.host.dpkg_lock import DPKG_LOCKS, lock_holder
from egpu_setup.host.machine import Host, open_beneath
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.execute")


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
                # no link followed (a planted lock -> /etc/shadow is not opened for writing)
                fd = open_beneath(Path("/"), real, flags=os.O_RDWR | os.O_NONBLOCK)
            except (OSError, ValueError):
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
