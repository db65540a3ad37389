"""A small ext4 filesystem on a loop device, and a real power cut of it.

EXT4_IOC_SHUTDOWN with EXT4_GOING_FLAGS_NOLOGFLUSH (linux fs/ext4/ioctl.c, ext4_shutdown; the
ioctl number is _IOR('X', 125, __u32), include/uapi/linux/ext4.h) stops the filesystem at once:
what is not yet committed to its journal is lost, as it would be if the power went, and every
later write fails with EIO. Unmounted and mounted again, the filesystem replays its journal and
holds exactly what was durable at the cut. Needs root and a free /dev/loop*.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


class LoopExt4:
    """`mount`: where the filesystem is mounted (while it is), from loop device `device`."""

    def __init__(self, image: Path, mount: Path) -> None:
        self.image = image
        self.mount = mount
        self.device = _attach(image)

    def power_cut(self) -> None:
        """Shut the filesystem down losing its uncommitted journal, unmount, and mount it again
        (`shut_down`, then `remount`)."""
        self.shut_down()
        self.remount()

    def shut_down(self) -> None:
        """The cut itself: from here every write to the filesystem fails with EIO, and what its
        journal had not committed is gone. The processes that held it open must end before
        `remount` can unmount it (a machine that loses power stops them too)."""
        fd = os.open(self.mount, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)

    def remount(self, *, fsck: bool = False) -> None:
        """Unmount, and mount again from a new loop device: a process elsewhere that copied the
        mount into its own namespace (unshare --mount) keeps the shut-down superblock alive,
        and mounting the same device again would hand it back. fsck: e2fsck -fy first (it
        replays the journal and must find nothing it cannot repair, exit 0 or 1), as a boot
        after a power cut runs it."""
        for _ in range(100):  # the processes just killed may still be letting go of it
            if subprocess.run(["umount", str(self.mount)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            _run("umount", str(self.mount))
        _run("losetup", "-d", self.device)
        self.device = _attach(self.image)
        if fsck:
            res = subprocess.run(
                ["e2fsck", "-fy", self.device], capture_output=True, text=True, timeout=300
            )
            assert res.returncode in (0, 1), f"e2fsck exit {res.returncode}: {res.stdout}"
        _run("mount", self.device, str(self.mount))


def _attach(image: Path) -> str:
    return subprocess.run(
        ["losetup", "--find", "--show", str(image)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()


@contextlib.contextmanager
def loop_ext4(directory: Path, size_mib: int = 96) -> Iterator[LoopExt4]:
    """An ext4 of `size_mib` MiB on a loop device of its own, mounted at directory/mnt;
    unmounted and the device detached on the way out however the test ends."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 (.ci/run installs e2fsprogs)")
    image = directory / "ext4.img"
    mount = directory / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    _run("mkfs.ext4", "-q", "-F", str(image))
    fs = LoopExt4(image, mount)
    try:
        _run("mount", fs.device, str(mount))
        os.chmod(mount, 0o755)
        yield fs
    finally:
        try:
            if os.path.ismount(mount):
                try:
                    _run("umount", str(mount))
                except subprocess.CalledProcessError:
                    _run("umount", "-l", str(mount))
        finally:
            _run("losetup", "-d", fs.device)
