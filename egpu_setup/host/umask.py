"""The umask floor: no group or world write bits on anything egpu-setup or a child creates.

A root run from a `umask 000` shell must not leave pip's venv files, or anything else created
without naming a mode, writable by everyone (umask(2)). `cli.main` takes the floor at start and
host/process.py gives it to every child. Its own module, importing only `os`, so that `--help`
loads nothing more for it.
"""

from __future__ import annotations

import os

UMASK_FLOOR = 0o022


def safe_umask() -> int:
    """This process's umask with the group and world write bits added (a stricter one, 077,
    stays as it is): the mask every child starts with."""
    current = os.umask(UMASK_FLOOR)
    os.umask(current)
    return current | UMASK_FLOOR


def take_safe_umask() -> None:
    """Make `safe_umask()` this process's own umask."""
    os.umask(safe_umask())
