"""The libc calls Python's os module lacks that egpu-setup needs: syncfs(2), and prctl(2)/capset(2)
for the capabilities a command in an image keeps (`drop_capabilities`, used by host/enter.py)."""

from __future__ import annotations

import ctypes
import errno
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


# <linux/prctl.h>, <linux/capability.h>
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _check(rc: int) -> None:
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def drop_capabilities(keep: frozenset[int]) -> list[int]:
    """Take every capability but `keep` out of this process's bounding set (prctl(2),
    PR_CAPBSET_DROP), and clear its ambient and inheritable sets, so no program it executes from
    now on, nor their children, can hold one again (capabilities(7): after execve, permitted =
    inheritable & file-inheritable | file-permitted & bounding | ambient). The capabilities this
    process holds itself stay until it executes a program. Returns the numbers dropped; OSError
    when the kernel refuses (no CAP_SETPCAP)."""
    libc = ctypes.CDLL(None, use_errno=True)
    dropped = []
    for cap in range(64):
        if cap in keep:
            continue
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:  # past the kernel's last capability
                break
            _check(-1)
        dropped.append(cap)
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0))
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data))
    for half in data:
        half.inheritable = 0
    _check(libc.capset(ctypes.byref(header), data))
    return dropped
