"""Run one command inside an image root, with the API filesystems a package's scripts expect.

Started by `tests.helpers.image.run_in` as

    unshare --mount --propagation private --pid --fork --kill-child -- \\
        python3 enter_root.py ROOT [--bind HOST_DIR:IMAGE_DIR]... -- ARGV...

so it runs as PID 1 of a fresh PID namespace inside a private mount namespace. It mounts, enters
the root, runs ARGV as its child and exits with ARGV's status. The mounts exist only in that
namespace: when its last process exits (normally, on an error, on SIGINT, or killed outright),
the kernel drops the namespace and every mount in it (mount_namespaces(7)), and the PID
namespace ends every process still in it when PID 1 exits (pid_namespaces(7)), so a daemon a
maintainer script started anyway cannot keep the root busy. The build host never sees these
mounts: no `rm -rf` of the root can reach the host's /dev through a stale bind mount.

/dev is not the host's: a tmpfs holding only the nodes a container gets from systemd-nspawn
(null, zero, full, random, urandom, tty and a private devpts instance), so a maintainer script
that probes block devices (os-prober, grub) does not see the build host's disks. /dev/fd points at
/proc/self/fd, which is what bash's process substitution (`<(...)`, dkms line 1724) opens.
Standard library only: it runs with the test interpreter before entering the root.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

# (mount point inside the root, fstype, options); "dev" first: the entries after it live on it.
API_FILESYSTEMS = (
    ("proc", "proc", "nosuid,nodev,noexec"),
    ("sys", "sysfs", "nosuid,nodev,noexec,ro"),
    ("dev", "tmpfs", "nosuid,mode=0755,size=8m"),
    ("dev/pts", "devpts", "nosuid,noexec,newinstance,ptmxmode=0666,mode=0620,gid=5"),
    ("dev/shm", "tmpfs", "nosuid,nodev,mode=1777"),
    ("run", "tmpfs", "nosuid,nodev,mode=0755,size=64m"),
)
# (name, major, minor): the character devices of devices.txt in the kernel's documentation.
DEVICE_NODES = (
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
)
DEVICE_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _mount(argv: list[str]) -> None:
    subprocess.run(["mount", *argv], check=True)


def mount_api_filesystems(root: Path) -> None:
    for where, fstype, options in API_FILESYSTEMS:
        target = root / where
        target.mkdir(parents=True, exist_ok=True)
        _mount(["-t", fstype, "-o", options, fstype, str(target)])
        if where == "dev":
            for name, major, minor in DEVICE_NODES:
                os.mknod(target / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                os.chmod(target / name, 0o666)  # mknod applies the umask
            for name, link in DEVICE_LINKS:
                os.symlink(link, target / name)


def bind(root: Path, host_dir: str, image_dir: str) -> None:
    target = root / image_dir.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    _mount(["--bind", host_dir, str(target)])


def main(args: list[str]) -> int:
    if "--" not in args or not args or args[0].startswith("-"):
        print("usage: enter_root.py ROOT [--bind HOST:IMAGE]... -- ARGV...", file=sys.stderr)
        return 2
    split = args.index("--")
    root, options, argv = Path(args[0]), args[1:split], args[split + 1 :]
    if os.getpid() != 1:
        print("enter_root.py: run me through unshare --pid --fork", file=sys.stderr)
        return 2
    mount_api_filesystems(root)
    for i in range(0, len(options), 2):
        if options[i] != "--bind" or ":" not in options[i + 1]:
            print(f"enter_root.py: bad option {options[i]!r}", file=sys.stderr)
            return 2
        host_dir, _, image_dir = options[i + 1].partition(":")
        bind(root, host_dir, image_dir)
    os.chroot(root)
    os.chdir("/")
    env = {k: v for k, v in os.environ.items() if k.startswith(("DEBIAN_", "LC_", "LANG"))}
    env.update(PATH=IMAGE_PATH, HOME="/root")
    try:
        child = subprocess.Popen(argv, env=env)
    except FileNotFoundError:
        print(f"enter_root.py: {argv[0]}: not found in the image", file=sys.stderr)
        return 127
    # PID 1 ignores a signal it has no handler for: pass SIGINT/SIGTERM on to the command.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda num, _frame: child.send_signal(num))
    rc = child.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
