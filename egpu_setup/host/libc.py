"""The libc call Python's os module lacks that egpu-setup needs: syncfs(2)."""

from __future__ import annotations

import ctypes
import os


def syncfs(fd: int) -> None:
    """Write back the whole filesystem `fd` lies on (syncfs(2)); since Linux 5.8 a write-back
    error comes back as EIO/ENOSPC, raised here as OSError. Where libc has no syncfs, sync(2),
    which does the same for every filesystem."""
    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        os.sync()
        return
    if call(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
