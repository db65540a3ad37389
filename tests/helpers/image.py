"""Bootable Debian 12 images for the slow tests: a base made here, the rest by egpu-setup itself.

An image starts as a copy of the debootstrap root of tests/helpers/debroot.py (its cache, its mirror:
the one this machine's apt uses) and gets what any bootable Debian has: a kernel with its
headers, systemd and udev (`build_base`). Everything a lab image adds on top is done by the
product, `egpu-setup install --root IMAGE --yes` (`egpu_setup_install`): the driver built by DKMS
for the image's kernel, egpu-setup itself, torch, the units, the first-boot marker, the seal.

Commands the tests run inside an image go through the product's own way in
(egpu_setup/host/image_root.py: a private mount and PID namespace with the API filesystems and a
policy-rc.d for the command), so the tests use what they test. Nothing is mounted in the build
host's namespace; `remove_image` still refuses to delete a root while anything is mounted below
it (a bound /dev would take the host's device nodes with it).

Downloaded .debs are kept in one directory per suite, under an exclusive lock while apt uses it
(pytest-xdist workers and other sessions share it): $EGPU_SETUP_TEST_CACHE/debs/<suite> when
that is set (kept between runs), else a directory of this test run, removed by `discard_debs`.
apt (the base build's and the product's) finds them as the image's own /var/cache/apt/archives
(`seed_debs` before, `harvest_debs` after, which leaves the image without .debs).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from egpu_setup.host.image_root import clean_leftovers, enter_argv, image_env
from helpers import debroot as _debroot
from helpers import pypi_index

SUITE = "bookworm"
# What a booted image needs beyond minbase: a kernel with its initramfs (initramfs-tools pulls
# in udev), systemd as PID 1, and the kernel's headers so DKMS can build for this kernel.
# And what a laptop with Secure Boot on boots through (the test's choice of a laptop's base
# system, not the product's): Microsoft-signed shim (shim-signed, which brings MokManager and
# mokutil), the GRUB that shim trusts (grub-efi-amd64-signed, signed by Debian's key) and
# bookworm's linux-image-amd64, itself signed by Debian (https://wiki.debian.org/SecureBoot).
BOOT_PACKAGES = (
    "linux-image-amd64",
    "systemd-sysv",
    "udev",
    "linux-headers-amd64",
    "shim-signed",
    "grub-efi-amd64-signed",
)
# The root file system's label: fstab and the kernel's root= find it by that (tests/helpers/vm.py)
ROOT_LABEL = "egpuroot"
APT_ENV = {
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "APT_LISTCHANGES_FRONTEND": "none",
}
ARCHIVES = "/var/cache/apt/archives"
_BOOT_MARKER = ".egpu-setup-image-complete"
# A lab's own profile, as a lab writes one: the shipped card's, with the torch the local index
# serves (the CPU wheel: no GPU here). Not shipped, so install copies it into the image for the
# first-boot unit, which names it.
LAB_PROFILE = "lab-rtx3080"
LAB_PROFILE_YAML = f"""schema: egpu-setup/profile/1
name: {LAB_PROFILE}
extends: rtx3080
description: RTX 3080 lab machines, CPU torch pinned for the image test
torch:
  spec: "=={pypi_index.TORCH_SPEC.split("==")[1]}"
  cuda: cpu
  extras: []
"""


class ImageUnavailable(Exception):
    """The tools or the mirror an image needs are missing here: tests skip with this reason."""


@dataclass
class Phases:
    """Wall time per build phase, in the order they ran (printed by the tests, never asserted)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = seconds

    def summary(self) -> str:
        return ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items())


@dataclass(frozen=True)
class Image:
    """A built image directory and the kernel it boots."""

    root: Path
    kver: str

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.kver}"

    @property
    def initrd(self) -> Path:
        return self.root / "boot" / f"initrd.img-{self.kver}"


# --- entering the image (the product's way) ---------------------------------------------------


@dataclass(frozen=True)
class Ran:
    """A command that ran: its status and its output lines, each with the second (since it
    started) it was printed at, so a phase inside one command can be measured."""

    argv: tuple[str, ...]
    rc: int
    lines: tuple[tuple[float, str], ...]

    @property
    def out(self) -> str:
        return "".join(text for _, text in self.lines)

    def span(self, start: str, end: str) -> float | None:
        """Seconds from the first line matching `start` to the last matching `end` after it."""
        first = last = None
        for stamp, text in self.lines:
            if first is None and re.search(start, text):
                first = stamp
            if first is not None and re.search(end, text):
                last = stamp
        return None if first is None or last is None else last - first


class InImageError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.output[-3000:]}"


def run_logged(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    timeout: float = 1800,
    log: Path | None = None,
    check: bool = True,
    what: Sequence[str] | None = None,
) -> Ran:
    """Run argv with stdout and stderr together, each line time-stamped (and appended to `log`
    as it comes); the whole process group is killed at the timeout, on an error and on Ctrl-C."""
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(log, "a", encoding="utf-8")) if log else None
        if sink:
            sink.write(f"### {' '.join(what or argv)}\n")
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
            start_new_session=True,  # its own group: killed as one, below
        )
        timer = threading.Timer(timeout, _kill_group, (proc,))
        timer.start()
        try:
            assert proc.stdout is not None
            for text in proc.stdout:
                lines.append((time.monotonic() - started, text))
                if sink:
                    sink.write(f"{lines[-1][0]:9.2f} {text}")
            rc = proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            timer.cancel()
    ran = Ran(tuple(what or argv), rc, tuple(lines))
    if check and rc != 0:
        late = time.monotonic() - started >= timeout
        raise InImageError(rc, list(argv), ran.out + (f"\n(killed at {timeout} s)" if late else ""))
    return ran


def run_in(
    root: Path,
    argv: Sequence[str],
    *,
    binds: Sequence[tuple[Path, str]] = (),
    env: dict[str, str] | None = None,
    timeout: float = 1800,
    log: Path | None = None,
    check: bool = True,
) -> Ran:
    """argv inside the image, entered as egpu-setup enters it (host/image_root.py)."""
    full = enter_argv(root, argv, [(str(h), i) for h, i in binds])
    return run_logged(
        full, env=image_env(env, False), timeout=timeout, log=log, check=check, what=argv
    )


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def mounts_under(root: Path) -> list[str]:
    """Every mount point at or below root in this (the host's) mount namespace, deepest first;
    the root itself counts unless it is the harness's own overlay (debroot.layered_copy)."""
    real = os.path.realpath(root)
    layer = _debroot.is_layer(root)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # mountinfo(5): the 5th field is the mount point, with space, tab, newline, \\ escaped
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if (point == real and not layer) or point.startswith(real + "/"):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def remove_image(root: Path) -> None:
    """Delete an image directory; never while anything is mounted below it (a bound /dev)."""
    if root.exists():
        clean_leftovers(root)
    if mounts_under(root):
        raise RuntimeError(f"{root}: still mounted below: {mounts_under(root)}")
    if _debroot.is_layer(root):
        _debroot.release(root)  # the overlay unmounted, its upper layer deleted
    shutil.rmtree(root, ignore_errors=True)


# --- the .deb cache ------------------------------------------------------------------------


def deb_cache_dir(suite: str = SUITE) -> Path:
    base = os.environ.get("EGPU_SETUP_TEST_CACHE")
    if base:
        return Path(base) / "debs" / suite
    # one directory per test run: pytest-xdist gives every worker of a run the same uid
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"egpu-setup-debs-{os.getuid()}-{run}" / suite


@contextlib.contextmanager
def locked_debs(suite: str = SUITE) -> Iterator[Path]:
    """The suite's .deb directory, held exclusively while apt uses it (apt's own lock in that
    directory fails instead of waiting)."""
    cache = deb_cache_dir(suite)
    (cache / "partial").mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(cache.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield cache


def discard_debs(suite: str = SUITE) -> None:
    """Remove this run's .deb directory (a kept $EGPU_SETUP_TEST_CACHE one stays)."""
    if not os.environ.get("EGPU_SETUP_TEST_CACHE"):
        shutil.rmtree(deb_cache_dir(suite).parent, ignore_errors=True)


def cache_size(suite: str = SUITE) -> tuple[int, int]:
    """(number of .debs, bytes) in the suite's cache."""
    debs = list(deb_cache_dir(suite).glob("*.deb"))
    return len(debs), sum(p.stat().st_size for p in debs)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def seed_debs(root: Path, cache: Path) -> int:
    """The cached .debs into the image's own archives directory, where apt looks first."""
    archives = root / ARCHIVES.lstrip("/")
    archives.mkdir(parents=True, exist_ok=True)
    n = 0
    for deb in cache.glob("*.deb"):
        if not (archives / deb.name).exists():
            _link_or_copy(deb, archives / deb.name)
            n += 1
    return n


def harvest_debs(root: Path, cache: Path) -> int:
    """What apt downloaded into the image goes to the cache; the image keeps no .debs."""
    n = 0
    for deb in (root / ARCHIVES.lstrip("/")).glob("*.deb"):
        if not (cache / deb.name).exists():
            shutil.copy2(deb, cache / deb.name)
            n += 1
        deb.unlink()
    return n


def apt(
    root: Path,
    args: Sequence[str],
    *,
    log: Path | None = None,
    timeout: float = 3600,
    debs: str = SUITE,
    env: dict[str, str] | None = None,
) -> Ran:
    """apt-get in the image, its archives directory seeded from the shared .deb cache (`debs`:
    another directory of it, with its own lock) and emptied into it afterwards; `env` for
    dpkg's maintainer scripts beside APT_ENV."""
    with locked_debs(debs) as cache:
        seed_debs(root, cache)
        try:
            argv = ["apt-get", "-y", "-o", "APT::Keep-Downloaded-Packages=true", *args]
            return run_in(root, argv, env={**APT_ENV, **(env or {})}, log=log, timeout=timeout)
        finally:
            harvest_debs(root, cache)


# --- building ------------------------------------------------------------------------------


def write_sources(root: Path, components: Sequence[str], suite: str = SUITE) -> None:
    """The image's one apt source: this machine's Debian mirror with the given components."""
    mirror = _debroot.host_mirror()
    (root / "etc/apt/sources.list").write_text(f"deb {mirror} {suite} {' '.join(components)}\n")


def configure_boot(root: Path) -> None:
    """Root by its label (a partition of the virtio disk), and the image's own hostname (debootstrap copies the host's)."""
    (root / "etc/fstab").write_text(f"LABEL={ROOT_LABEL} / ext4 rw,errors=remount-ro 0 1\n")
    (root / "etc/hostname").write_text("egpu-image\n")


def kernels(root: Path) -> list[str]:
    """Kernel versions the image can boot: a vmlinuz and its modules directory."""
    return sorted(
        p.name[len("vmlinuz-") :]
        for p in (root / "boot").glob("vmlinuz-*")
        if (root / "lib/modules" / p.name[len("vmlinuz-") :]).is_dir()
    )


def dkms_modules(root: Path, kver: str) -> list[Path]:
    """NVIDIA modules DKMS installed for kver (Debian names them nvidia-current*.ko)."""
    return sorted((root / "lib/modules" / kver / "updates/dkms").glob("nvidia*.ko*"))


def dpkg_audit(root: Path) -> str:
    """`dpkg --audit` output: empty when every package is fully installed (its exit status is 0
    either way, dpkg 1.21), so callers test the text."""
    return run_in(root, ["dpkg", "--audit"]).out.strip()


# What is not the image's content: API filesystems and scratch space, mounted or emptied at boot.
_NOT_CONTENT = ("proc", "sys", "dev", "run", "tmp")


def tree_state(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path of the image (API filesystems and /tmp aside) -> its type, mode, owner and
    content: a file's sha256, a link's target. What "byte-identical" compares."""
    import stat as st

    out: dict[str, tuple[object, ...]] = {}
    for top in sorted(p for p in root.iterdir() if p.name not in _NOT_CONTENT):
        stack = [top]
        while stack:
            path = stack.pop()
            info = path.lstat()
            rel = str(path.relative_to(root))
            meta = (st.S_IFMT(info.st_mode), st.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
            if st.S_ISDIR(info.st_mode):
                out[rel] = meta
                stack.extend(path.iterdir())
            elif st.S_ISLNK(info.st_mode):
                out[rel] = (*meta, os.readlink(path))
            elif st.S_ISREG(info.st_mode):
                digest = hashlib.sha256()
                with path.open("rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
                out[rel] = (*meta, digest.hexdigest())
            else:
                out[rel] = (*meta, info.st_rdev)
    return out


def installed_packages(root: Path) -> set[str]:
    """The packages dpkg has fully installed in the image (var/lib/dpkg/status)."""
    text = (root / "var/lib/dpkg/status").read_text()
    names = set()
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Status") == "install ok installed":
            names.add(fields["Package"])
    return names


def package_files(root: Path, names: set[str]) -> set[str]:
    """The paths (relative to the root) dpkg lists for these packages, and every directory
    above them."""
    info = root / "var/lib/dpkg/info"
    # merged /usr (Debian 12): dpkg lists /lib/x where the file lives at /usr/lib/x
    merged = {d for d in ("bin", "sbin", "lib", "lib32", "lib64") if (root / d).is_symlink()}
    out: set[str] = set()
    for name in names:
        for listing in (info / f"{name}.list", *info.glob(f"{name}:*.list")):
            if listing.is_file():
                for line in listing.read_text().splitlines():
                    rel = line.strip().lstrip("/")
                    if rel.split("/", 1)[0] in merged:
                        rel = f"usr/{rel}"
                    if rel and rel != ".":
                        out.add(rel)
    return out


def build_base(dest: Path, phases: Phases, *, log: Path) -> Image:
    """A bootable image without the driver at dest, from the cached debootstrap root.

    Cached like the debootstrap roots (one build under a lock, a private copy per caller)
    under $EGPU_SETUP_TEST_CACHE/image/<suite>-base-<hash of BOOT_PACKAGES> when that is set."""
    cached = _base_cache()
    if cached is not None:
        with open(cached.with_name(cached.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (cached / _BOOT_MARKER).is_file():
                remove_image(cached)
                _build_base(cached, phases, log)
                (cached / _BOOT_MARKER).write_text(phases.summary() + "\n")
        with phases.time("copy base"):  # a mount, not 1.1 GB copied (debroot.layered_copy)
            _debroot.layered_copy(cached, dest)
        (dest / _BOOT_MARKER).unlink()
    else:
        _build_base(dest, phases, log)
    (kver,) = kernels(dest)
    return Image(dest, kver)


def _base_cache() -> Path | None:
    base = os.environ.get("EGPU_SETUP_TEST_CACHE")
    if not base:
        return None
    d = Path(base) / "image"
    d.mkdir(parents=True, exist_ok=True)
    # named by its packages: a base made with other packages (another branch's) is another cache
    digest = hashlib.sha256(" ".join(BOOT_PACKAGES).encode()).hexdigest()[:8]
    return d / f"{SUITE}-base-{digest}"


def _build_base(dest: Path, phases: Phases, log: Path) -> None:
    try:
        with phases.time("debootstrap"):
            src = _debroot.build(SUITE)
    except _debroot.DebrootUnavailable as exc:
        raise ImageUnavailable(str(exc)) from exc
    for tool in ("unshare", "mkfs.ext4", "debugfs"):
        if shutil.which(tool) is None:
            raise ImageUnavailable(f"{tool} is not installed")
    with phases.time("copy root"):
        _debroot.full_copy(src, dest)
    (dest / ".egpu-setup-debroot-complete").unlink(missing_ok=True)
    # _debroot's own policy-rc.d: the product writes one per command; the booted machine has none
    (dest / "usr/sbin/policy-rc.d").unlink(missing_ok=True)
    write_sources(dest, ["main"])
    with phases.time("apt update"):
        apt(dest, ["update"], log=log)
    with phases.time("base download"):
        apt(
            dest, ["install", "--download-only", "--no-install-recommends", *BOOT_PACKAGES], log=log
        )
    with phases.time("base install"):
        apt(dest, ["install", "--no-install-recommends", *BOOT_PACKAGES], log=log)
    configure_boot(dest)


def egpu_setup_rollback(image: Image, args: Sequence[str], *, log: Path) -> Ran:
    """`egpu-setup rollback --root IMAGE --yes ARGS`, its state the image's own."""
    env = {k: v for k, v in os.environ.items() if k != "EGPU_SETUP_STATE_DIR"}
    argv = [sys.executable, "-m", "egpu_setup", "rollback", "--root", str(image.root), "--yes"]
    return run_logged([*argv, *args], env=env, timeout=1800, log=log, check=False)


def egpu_setup_install(
    image: Image,
    args: Sequence[str],
    *,
    log: Path,
    timeout: float = 3600,
    check: bool = True,
    debs: str = SUITE,
) -> Ran:
    """`egpu-setup install --root IMAGE ARGS` as a person runs it (its own state in the image,
    not the test session's EGPU_SETUP_STATE_DIR), with the .deb cache seeded into the image."""
    env = {k: v for k, v in os.environ.items() if k != "EGPU_SETUP_STATE_DIR"}
    argv = [sys.executable, "-m", "egpu_setup", "install", "--root", str(image.root), *args]
    with locked_debs(debs) as cache:
        seed_debs(image.root, cache)
        try:
            return run_logged(argv, env=env, timeout=timeout, log=log, check=check)
        finally:
            harvest_debs(image.root, cache)
