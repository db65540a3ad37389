"""Run one command inside an image root with the API filesystems a package's scripts expect.

Started by `RootHost` (host/image_root.py) as

    setpriv --pdeathsig KILL -- unshare --mount --propagation private --pid --fork \\
        --kill-child -- python3 -I enter.py ROOT [--bind HOST_DIR:IMAGE_DIR]... -- ARGV...

so it runs as PID 1 of a new PID namespace inside a private mount namespace. It mounts, enters
the root, runs ARGV as its child and exits with ARGV's status. The mounts exist only in that
namespace: when its last process exits (normally, on an error, on SIGINT, or killed outright),
the kernel drops the namespace and every mount in it (mount_namespaces(7)), and the PID
namespace ends every process still in it when PID 1 exits (pid_namespaces(7)), so a daemon a
maintainer script started anyway cannot keep the root busy. The build host never sees these
mounts, so no later `rm -rf` of the image can reach the host's /dev through a stale bind mount.

What the image gets, after systemd-nspawn's container interface
(https://systemd.io/CONTAINER_INTERFACE/): /proc; /sys read-only; a tmpfs /dev holding only
null, zero, full, random, urandom, tty and a private devpts instance (a maintainer script that
probes block devices, os-prober or grub, does not see the build host's disks); /dev/shm; a
private tmpfs /run. /run must not be the host's: invoke-rc.d and deb-systemd-invoke look for
/run/systemd/system to decide whether to call systemctl, which would talk to the build host's
systemd. /dev/fd points at /proc/self/fd, what bash's process substitution opens (dkms uses
`<(...)`; in a bare chroot it fails with "/dev/fd/63: No such file or directory").

While the command runs, /usr/sbin/policy-rc.d answers 101 ("action forbidden", invoke-rc.d(8))
so no package starts a service in the image; it is written after entering the root (a planted
link resolves inside the image, never on the build host) and removed afterwards when it is
ours. A run killed outright leaves ours behind: the next entered command recognises its exact
content and removes it when it ends.

The command runs with fewer capabilities (capabilities(7)): after the mounts and the chroot,
every capability but KEEP_CAPABILITIES leaves this process's bounding set, and its ambient and
inheritable sets are cleared (host/libc.py `drop_capabilities`), so neither the command nor
anything it starts can chroot again to climb out (CAP_SYS_CHROOT), mount (CAP_SYS_ADMIN), load a
module into the build host's kernel (CAP_SYS_MODULE), trace or poke memory and ports
(CAP_SYS_PTRACE, CAP_SYS_RAWIO), reconfigure the network (CAP_NET_ADMIN), reboot (CAP_SYS_BOOT),
make a device node for a host disk (CAP_MKNOD) or open a file of the host's filesystem by handle
(CAP_DAC_READ_SEARCH, open_by_handle_at(2)). What apt, dpkg, maintainer scripts and dkms need as
root inside an image stays: file ownership and modes, set-id bits, file capabilities (setcap in
a postinst), changing user (apt's _apt sandbox), signals, and audit records (useradd).

The command's environment is this process's environment with PATH set to the image's own
directories and HOME to /root; RootHost passes only what the image may see.

Standard library only: it runs with the build host's interpreter, before entering the root.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

# (mount point inside the root, fstype, options); "dev" first: the entries after it live on it.
API_FILESYSTEMS = (
    ("proc", "proc", "nosuid,nodev,noexec"),
    ("sys", "sysfs", "nosuid,nodev,noexec,ro"),
    ("dev", "tmpfs", "nosuid,mode=0755,size=8m"),
    ("dev/pts", "devpts", "nosuid,noexec,newinstance,ptmxmode=0666,mode=0620,gid=5"),
    ("dev/shm", "tmpfs", "nosuid,nodev,mode=1777"),
    ("run", "tmpfs", "nosuid,nodev,mode=0755,size=64m"),
)
# (name, major, minor): the character devices of the kernel's Documentation/admin-guide/devices.txt
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
POLICY_RC = "/usr/sbin/policy-rc.d"
POLICY_RC_TEXT = (
    "#!/bin/sh\n"
    "# egpu-setup: no service starts while an image is built (invoke-rc.d(8): 101 = forbidden).\n"
    "# Removed when the command that wrote it ends; a killed run's copy goes with the next one.\n"
    "exit 101\n"
)
# capabilities(7) numbers, <linux/capability.h>: what a command in the image keeps
KEEP_CAPABILITIES = frozenset(
    {
        0,  # CAP_CHOWN: dpkg gives unpacked files their owners
        1,  # CAP_DAC_OVERRIDE: root reads and writes the image's files whatever their modes
        3,  # CAP_FOWNER: chmod/utime on files root does not own (dpkg, tar)
        4,  # CAP_FSETID: set-id bits survive a chown (dpkg unpacks setuid programs)
        5,  # CAP_KILL: a maintainer script stops what it started, in this PID namespace only
        6,  # CAP_SETGID
        7,  # CAP_SETUID: apt downloads as _apt, adduser's and runuser's children
        29,  # CAP_AUDIT_WRITE: useradd/groupadd write an audit record
        31,  # CAP_SETFCAP: a postinst's setcap (iputils-ping)
    }
)
EXIT_BAD_ROOT = 125  # this helper refused the image (a planted link, a missing directory)


class RefusedRoot(Exception):
    """The image cannot be entered safely; the message names the path."""


def _mount(argv: list[str]) -> None:
    subprocess.run(["mount", *argv], check=True)  # noqa: S603 - argv list, never a shell


def _real_dir(root: Path, where: str) -> Path:
    """root/where as a directory of the image itself: every component checked with lstat, so a
    link planted in the image (`dev -> /dev`) is refused instead of followed on the host."""
    path = root
    for part in where.split("/"):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            path.mkdir(mode=0o755)
            continue
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise RefusedRoot(f"{path} is not a directory of the image (a link or a file)")
    return path


def mount_api_filesystems(root: Path) -> None:
    for where, fstype, options in API_FILESYSTEMS:
        target = _real_dir(root, where)
        _mount(["-t", fstype, "-o", options, fstype, str(target)])
        if where == "dev":
            for name, major, minor in DEVICE_NODES:
                os.mknod(target / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                os.chmod(target / name, 0o666)  # mknod applies the umask
            for name, link in DEVICE_LINKS:
                os.symlink(link, target / name)


def bind(root: Path, host_dir: str, image_dir: str) -> None:
    """host_dir at image_dir, read-only; image_dir must lie under the private /run."""
    if not image_dir.startswith("/run/"):
        raise RefusedRoot(f"bind target {image_dir} is not under /run")
    target = _real_dir(root, image_dir.strip("/"))
    _mount(["--bind", host_dir, str(target)])
    _mount(["-o", "remount,bind,ro", str(target)])


def resolv_conf(root: Path) -> None:
    """A resolv.conf for an image whose /etc/resolv.conf links into /run (systemd-resolved's
    stub-resolv.conf): the build host's, in the private /run, so pip and apt resolve names."""
    link = root / "etc/resolv.conf"
    try:
        target = os.readlink(link)
    except OSError:
        return
    if not target.startswith("/"):
        target = os.path.normpath(os.path.join("/etc", target))
    if not target.startswith("/run/"):
        return
    try:
        text = Path("/etc/resolv.conf").read_bytes()
    except OSError:
        return
    dest = _real_dir(root, os.path.dirname(target).strip("/")) / os.path.basename(target)
    dest.write_bytes(text)


def policy_rc_on() -> bool:
    """Write policy-rc.d (inside the root); True when this run is to remove it again."""
    try:
        current = Path(POLICY_RC).read_text()
    except FileNotFoundError:
        current = None
    except OSError:
        return False
    if current == POLICY_RC_TEXT:
        return True  # a killed run's: ours, removed when this command ends
    if current is not None:
        return False  # the image's own: left as it is
    Path(POLICY_RC).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(POLICY_RC, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
    with os.fdopen(fd, "w") as f:
        f.write(POLICY_RC_TEXT)
    return True


def policy_rc_off() -> None:
    try:
        if Path(POLICY_RC).read_text() == POLICY_RC_TEXT:
            os.unlink(POLICY_RC)
    except OSError:
        pass


def _libc() -> ModuleType:
    """host/libc.py, the one place egpu-setup loads libc, by its path: this script runs with -I
    and the build host's interpreter, so the egpu_setup package is not importable here."""
    spec = importlib.util.spec_from_file_location(
        "_egpu_setup_libc", Path(__file__).with_name("libc.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(args: list[str]) -> int:
    if "--" not in args or not args or args[0].startswith("-"):
        print("usage: enter.py ROOT [--bind HOST:IMAGE]... -- ARGV...", file=sys.stderr)
        return 2
    split = args.index("--")
    root, options, argv = Path(args[0]), args[1:split], args[split + 1 :]
    if os.getpid() != 1:
        print("enter.py: run me through unshare --pid --fork", file=sys.stderr)
        return 2
    if len(options) % 2 or any(o != "--bind" for o in options[::2]):
        print(f"enter.py: bad options {options!r}", file=sys.stderr)
        return 2
    try:
        mount_api_filesystems(root)
        for value in options[1::2]:
            host_dir, _, image_dir = value.partition(":")
            bind(root, host_dir, image_dir)
        resolv_conf(root)
    except (RefusedRoot, OSError, subprocess.CalledProcessError) as exc:
        print(f"enter.py: cannot enter {root}: {exc}", file=sys.stderr)
        return EXIT_BAD_ROOT
    libc = _libc()  # loaded from the build host's file, before the image's tree is /
    os.chroot(root)
    os.chdir("/")
    try:
        libc.drop_capabilities(KEEP_CAPABILITIES)
    except OSError as exc:
        print(f"enter.py: cannot drop capabilities before entering {root}: {exc}", file=sys.stderr)
        return EXIT_BAD_ROOT
    env = dict(os.environ, PATH=IMAGE_PATH, HOME="/root")
    ours = policy_rc_on()
    try:
        try:
            child = subprocess.Popen(argv, env=env)  # noqa: S603 - argv list, never a shell
        except FileNotFoundError:
            print(f"enter.py: {argv[0]}: not found in the image", file=sys.stderr)
            return 127
        # PID 1 ignores a signal it has no handler for: pass SIGINT/SIGTERM on to the command.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda num, _frame: child.send_signal(num))
        rc = child.wait()
    finally:
        if ours:
            policy_rc_off()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
