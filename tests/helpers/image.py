"""Bootable Debian 12 images for the slow tests: entered properly, packages from a shared cache.

An image starts as a copy of the debootstrap root of tests/helpers/debroot.py (its cache, its mirror:
the one this machine's apt uses), gets a kernel and systemd, and then what egpu-setup installs
for a lab image: the NVIDIA driver that `egpu-setup resolve --distro debian-12` names, built by
DKMS for the image's own kernel.

Every command inside the image runs through `run_in`: API filesystems mounted in a private mount
and PID namespace for that one command (helpers/enter_root.py), a policy-rc.d so no service
starts, the .deb cache bound at /var/cache/apt/archives. Nothing is mounted in the build host's
namespace, so nothing outlives the command; `unmount_leftovers` still removes what some other
tool (an egpu-setup run killed mid-way) left mounted under a root before it is deleted.

Downloaded .debs are kept in one directory per suite, under an exclusive lock while apt uses it
(pytest-xdist workers and other sessions share it): $EGPU_SETUP_TEST_CACHE/debs/<suite> when
that is set (kept between runs), else a directory of this test run, removed by `discard_debs`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
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

from helpers import debroot as _debroot

ENTER = Path(__file__).with_name("enter_root.py")
SUITE = "bookworm"
# What a booted image needs beyond minbase: a kernel with its initramfs (initramfs-tools pulls
# in udev), systemd as PID 1, and the kernel's headers so DKMS can build for this kernel.
BOOT_PACKAGES = ("linux-image-amd64", "systemd-sysv", "udev", "linux-headers-amd64")
# The image's Python, for egpu-setup's own venv inside it (Debian keeps venv/ensurepip apart).
PYTHON_PACKAGES = ("python3-venv",)
TOOL_VENV = "/opt/egpu-setup/tool"
TOOL_LINK = "/usr/local/bin/egpu-setup"
TORCH_VENV = "/opt/egpu-setup/venv"
APT_ENV = {
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "APT_LISTCHANGES_FRONTEND": "none",
}
APT = ("apt-get", "-y", "-o", "APT::Keep-Downloaded-Packages=true")
ARCHIVES = "/var/cache/apt/archives"
POLICY_RC = "#!/bin/sh\n# no service starts while the image is built (invoke-rc.d(8))\nexit 101\n"
_BOOT_MARKER = ".egpu-setup-image-complete"


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


# --- entering the image --------------------------------------------------------------------


def enter_argv(
    root: Path, argv: Sequence[str], binds: Sequence[tuple[Path, str]] = ()
) -> list[str]:
    """The host command that runs argv inside root with its API filesystems (enter_root.py)."""
    bind_args = [a for host, image in binds for a in ("--bind", f"{host}:{image}")]
    return [
        # killed with its parent (a test run killed outright), and its namespace with it
        "setpriv",
        "--pdeathsig",
        "KILL",
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "--",
        sys.executable,
        str(ENTER),
        str(root),
        *bind_args,
        "--",
        *argv,
    ]


@dataclass(frozen=True)
class Ran:
    """A command that ran in an image: its status and its output lines, each with the second
    (since it started) it was printed at, so a phase inside one command can be measured."""

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
    """Run argv inside the image, stdout and stderr together (appended to `log` as they come).

    The whole process group is killed at the timeout, on an error and on Ctrl-C; unshare's
    --kill-child then ends the namespace and its mounts with it."""
    full = enter_argv(root, argv, binds)
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(log, "a", encoding="utf-8")) if log else None
        if sink:
            sink.write(f"### {' '.join(argv)}\n")
        proc = subprocess.Popen(
            full,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={**os.environ, **(env or {})},
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
    ran = Ran(tuple(argv), rc, tuple(lines))
    if check and rc != 0:
        late = time.monotonic() - started >= timeout
        raise InImageError(rc, list(argv), ran.out + (f"\n(killed at {timeout} s)" if late else ""))
    return ran


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below root in this (the host's) mount namespace, deepest first."""
    real = os.path.realpath(root)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # mountinfo(5): the 5th field is the mount point, with space, tab, newline, \\ escaped
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point == real or point.startswith(real + "/"):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_leftovers(root: Path) -> list[str]:
    """Unmount whatever a killed run left mounted under root (lazily when busy); returns them."""
    gone = []
    for point in mounts_under(root):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=True)
        gone.append(point)
    return gone


def remove_image(root: Path) -> None:
    """Delete an image directory; never while anything is mounted below it (a bound /dev)."""
    unmount_leftovers(root)
    if mounts_under(root):
        raise RuntimeError(f"{root}: still mounted below: {mounts_under(root)}")
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
    """The suite's .deb directory, held exclusively for one apt run (install included: apt may
    still fetch into it), as apt's own lock in that directory fails instead of waiting."""
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


def apt(root: Path, args: Sequence[str], *, log: Path | None = None, timeout: float = 3600) -> Ran:
    """apt-get in the image with the shared .deb cache as its archives directory."""
    with locked_debs() as cache:
        return run_in(
            root, [*APT, *args], binds=[(cache, ARCHIVES)], env=APT_ENV, log=log, timeout=timeout
        )


# --- building ------------------------------------------------------------------------------


def egpu_setup_resolution(distro: str = "debian-12", gpu: str = "2206") -> dict:
    """What egpu-setup itself would install for a GPU on a distro (`resolve --json`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "resolve", "--distro", distro, "--gpu", gpu, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(proc.stdout)


def write_sources(root: Path, components: Sequence[str], suite: str = SUITE) -> None:
    """The image's one apt source: this machine's Debian mirror with the given components."""
    mirror = _debroot.host_mirror()
    (root / "etc/apt/sources.list").write_text(f"deb {mirror} {suite} {' '.join(components)}\n")


def configure_boot(root: Path) -> None:
    """Root on the virtio disk, and the image's own hostname (debootstrap copies the host's)."""
    (root / "etc/fstab").write_text("/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
    (root / "etc/hostname").write_text("egpu-image\n")


def reset_machine_identity(root: Path) -> None:
    """The last build step: every machine made from the image gets its own machine-id.

    "uninitialized" makes the first boot a first boot (machine-id(5), ConditionFirstBoot=);
    dbus-daemon's postinst (`dbus-uuidgen --ensure`) leaves a random id in
    /var/lib/dbus/machine-id, which systemd would copy to every machine, so it becomes a link
    to /etc/machine-id, as on an installed Debian."""
    (root / "etc/machine-id").write_text("uninitialized\n")
    dbus = root / "var/lib/dbus/machine-id"
    if dbus.parent.is_dir():
        dbus.unlink(missing_ok=True)
        dbus.symlink_to("/etc/machine-id")


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


def build_base(dest: Path, phases: Phases, *, log: Path) -> Image:
    """A bootable image without the driver at dest, from the cached debootstrap root.

    Cached like the debootstrap roots (one build under a lock, a private copy per caller)
    under $EGPU_SETUP_TEST_CACHE/image/<suite>-base when that is set."""
    cached = _base_cache()
    if cached is not None:
        with open(cached.with_name(cached.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (cached / _BOOT_MARKER).is_file():
                remove_image(cached)
                _build_base(cached, phases, log)
                (cached / _BOOT_MARKER).write_text(phases.summary() + "\n")
        with phases.time("copy base"):
            subprocess.run(["cp", "-a", "--reflink=auto", str(cached), str(dest)], check=True)
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
    return d / f"{SUITE}-base"


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
        subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dest)], check=True)
    (dest / ".egpu-setup-debroot-complete").unlink(missing_ok=True)
    (dest / "usr/sbin/policy-rc.d").write_text(POLICY_RC)
    (dest / "usr/sbin/policy-rc.d").chmod(0o755)
    write_sources(dest, ["main"])
    with phases.time("apt update"):
        apt(dest, ["update"], log=log)
    with phases.time("base download"):
        apt(
            dest, ["install", "--download-only", "--no-install-recommends", *BOOT_PACKAGES], log=log
        )
    with phases.time("base install"):
        apt(dest, ["install", "--no-install-recommends", *BOOT_PACKAGES], log=log)
    (dest / "usr/sbin/policy-rc.d").unlink()  # the booted machine starts its services
    configure_boot(dest)


def install_driver(image: Image, phases: Phases, *, log: Path, gpu: str = "2206") -> list[str]:
    """What `egpu-setup install --only driver --root` is to do: the components its resolution
    names, then its packages (with Recommends, as the product installs them); DKMS builds in
    nvidia-kernel-dkms' postinst. Returns the packages."""
    driver = egpu_setup_resolution(gpu=gpu)["driver"]
    packages = list(driver["packages"])
    (image.root / "usr/sbin/policy-rc.d").write_text(POLICY_RC)
    (image.root / "usr/sbin/policy-rc.d").chmod(0o755)
    try:
        write_sources(image.root, ["main", *driver["apt_components"]])
        with phases.time("driver apt update"):
            apt(image.root, ["update"], log=log)
        with phases.time("driver download"):
            apt(image.root, ["install", "--download-only", *packages], log=log)
        with phases.time("driver install"):
            ran = apt(image.root, ["install", *packages], log=log)
        dkms = ran.span(r"^Building initial module for", r"^depmod")
        if dkms is not None:
            phases.add("  of which DKMS build", dkms)
    finally:
        (image.root / "usr/sbin/policy-rc.d").unlink(missing_ok=True)
    return packages


def venv_from_wheels(
    image: Image, venv: str, wheels: Path, requirements: Sequence[str], *, log: Path
) -> Path:
    """A venv at `venv` in the image, made by the image's own python3 and filled offline
    (`--no-index`) from the wheels in `wheels` (bound at /run/wheels for the command only)."""
    run_in(image.root, ["python3", "-m", "venv", venv], log=log)
    run_in(
        image.root,
        [
            f"{venv}/bin/python",
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--find-links",
            "/run/wheels",
            *requirements,
        ],
        binds=[(wheels, "/run/wheels")],
        env={"PIP_CONFIG_FILE": "/dev/null"},  # nothing of the build host's pip configuration
        log=log,
    )
    return image.root / venv.lstrip("/")


def install_python(image: Image, phases: Phases, *, log: Path) -> str:
    """The image's python3 with venv and ensurepip (Debian ships them apart); its version."""
    with phases.time("python download"):
        apt(image.root, ["install", "--download-only", "--no-install-recommends", *PYTHON_PACKAGES])
    with phases.time("python install"):
        apt(image.root, ["install", "--no-install-recommends", *PYTHON_PACKAGES], log=log)
    return image_python(image)


def install_tool_venv(image: Image, wheels: Path, phases: Phases, *, log: Path) -> Path:
    """egpu-setup's own root-owned venv in the image, laid out as scripts/install.sh lays it
    out on a live machine: /opt/egpu-setup/tool, linked from /usr/local/bin/egpu-setup (the
    path the rendered units and helpers call). Needs `install_python` first."""
    with phases.time("tool venv"):
        venv = venv_from_wheels(image, TOOL_VENV, wheels, ["egpu-setup"], log=log)
        run_in(image.root, ["ln", "-sfn", f"{TOOL_VENV}/bin/egpu-setup", TOOL_LINK], log=log)
    return venv


def image_python(image: Image) -> str:
    """The image's python3 version, "3.11" (wheels must be for this one, not the build host's)."""
    return run_in(
        image.root, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
    ).out.strip()


def tool_wheels(repo: Path, dest: Path, python_version: str) -> Path:
    """egpu-setup's wheel built from `repo`, with the wheels of its dependencies for the image's
    Python, through this machine's own pip configuration (its index or mirror)."""
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), str(repo)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = dest.glob("egpu_setup-*.whl")
    subprocess.run(
        [*pip, "download", "--only-binary=:all:", "--python-version", python_version]
        + ["-d", str(dest), str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return dest
