"""The initramfs built once per driver install, for real, in the bootable Debian 12 image base.

The image is a copy of the cached image base (tests/helpers/image.py: linux-image-amd64,
initramfs-tools, udev), its only apt source a local repository of small packages named as the
driver plan names them, which activate initramfs-tools' `update-initramfs` trigger the way the
real ones do: the DKMS package by `dpkg-trigger --no-await` from its postinst (kmod and udev
declare `activate-noawait update-initramfs`), and a stand-in for glx-alternative-mesa, which is
interested in a directory the driver package fills (a file trigger, deb-triggers(5)) and
activates `update-initramfs` again each time its own trigger runs, as glx-alternative-nvidia's
postinst does. That last one is what built the lab image's initramfs three times inside one
apt-get (docs/testing.md, "Why the lab image's initramfs is built more than once").

An initramfs-tools hook (initramfs-tools(7), /etc/initramfs-tools/hooks) writes one line per
build into the image: whether the nouveau blacklist egpu-setup writes was there. So "once"
is counted by mkinitramfs itself, and the build is the one with the blacklist in it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import image, kill_points
from helpers.local_apt import build_deb, local_repository

pytestmark = [
    pytest.mark.debootstrap,
    pytest.mark.skipif(kill_points.STRACE is None, reason="strace missing (.ci/run installs it)"),
]

NAMED = ("nvidia-kernel-dkms", "nvidia-driver", "firmware-nvidia-gsp")
GLX = "glx-alternative-mesa"
BLACKLIST = "/etc/modprobe.d/egpu-setup-nouveau.conf"
BUILDS = "var/log/lab-initramfs-builds"
# a hook runs in every mkinitramfs, with the image's root as its root
HOOK = f"""#!/bin/sh
case "$1" in prereqs) echo ""; exit 0;; esac
if [ -e {BLACKLIST} ]; then echo with-blacklist; else echo without; fi >> /{BUILDS}
"""
ACTIVATE = "dpkg-trigger --no-await update-initramfs"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[image.Image]:
    tmp = tmp_path_factory.mktemp("initramfs-once")
    try:
        img = image.build_base(tmp / "image", image.Phases(), log=tmp / "base.log")
    except image.ImageUnavailable as exc:
        pytest.skip(str(exc))
    root = img.root
    (root / "etc/apt/sources.list").unlink()  # the local repository is apt's only source
    for extra in (root / "etc/apt/sources.list.d").glob("*"):
        extra.unlink()
    hook = root / "etc/initramfs-tools/hooks/lab-count"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    debs = [
        build_deb(root, "nvidia-kernel-dkms", postinst=ACTIVATE),
        build_deb(root, "firmware-nvidia-gsp", files=("usr/lib/firmware/nvidia/gsp.bin",)),
        build_deb(
            root,
            GLX,
            triggers="interest-noawait /usr/lib/lab-glx\n",
            postinst=f'case "$1" in configure|triggered) {ACTIVATE};; esac',
        ),
        build_deb(
            root,
            "nvidia-driver",
            depends=f"nvidia-kernel-dkms, firmware-nvidia-gsp, {GLX}",
            files=("usr/lib/lab-glx/libGLX_nvidia.so.0",),
        ),
    ]
    local_repository(root, debs)
    subprocess.run(["chroot", str(root), "apt-get", "update"], check=True, capture_output=True)
    (root / BUILDS).unlink(missing_ok=True)
    yield img
    image.remove_image(root)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # the same calls each run (kill points)
    env.pop("EGPU_SETUP_STATE_DIR", None)
    return env


def _install(root: Path) -> list[str]:
    return [sys.executable, "-m", "egpu_setup", "install", "--profile", "rtx3080", "--only",
            "driver", "--root", str(root), "--yes"]  # fmt: skip


def _copy(base: image.Image, dest: Path) -> Path:
    subprocess.run(["cp", "-a", "--reflink=auto", str(base.root), str(dest)], check=True)
    return dest


def _builds(root: Path) -> list[str]:
    path = root / BUILDS
    return path.read_text().split() if path.exists() else []


def _statuses(root: Path) -> dict[str, str]:
    out = image.run_in(root, ["dpkg-query", "-W", "-f", "${Package} ${Status}\n"]).out
    return {ln.split()[0]: " ".join(ln.split()[1:]) for ln in out.splitlines() if ln.strip()}


def _listing(root: Path, kver: str) -> list[str]:
    out = image.run_in(root, ["lsinitramfs", f"/boot/initrd.img-{kver}"]).out
    return sorted(out.split())


def _converged(root: Path, kver: str) -> list[str]:
    """The image as a finished install leaves it: every package `install ok installed`, dpkg's
    audit empty, the blacklist in the initramfs, and that initramfs the one a rebuild by hand
    of the same image makes (lsinitramfs, file by file). The builds the hook counted."""
    states = _statuses(root)
    assert {n: states.get(n) for n in (*NAMED, GLX, "initramfs-tools")} == dict.fromkeys(
        (*NAMED, GLX, "initramfs-tools"), "install ok installed"
    )
    assert not [n for n, s in states.items() if "trigger" in s], states
    assert image.dpkg_audit(root) == ""
    built = _builds(root)
    listing = _listing(root, kver)
    assert BLACKLIST.lstrip("/") in listing
    image.run_in(root, ["update-initramfs", "-u", "-k", kver])
    assert _listing(root, kver) == listing
    return built


def test_the_driver_install_builds_the_initramfs_once_with_the_blacklist(
    base: image.Image, tmp_path: Path
) -> None:
    root = _copy(base, tmp_path / "image")
    dry = subprocess.run([*_install(root), "--dry-run"], env=_env(), capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert dry.returncode in (0, 3), dry.stderr[-3000:]
    assert "--no-triggers" not in dry.stdout  # an option of the step, shown by its trigger run
    assert "run dpkg --configure --pending" in dry.stdout
    assert "run dpkg-trigger --no-await update-initramfs" in dry.stdout
    done = subprocess.run(_install(root), env=_env(), capture_output=True, text=True, check=False)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    assert _converged(root, base.kver) == ["with-blacklist"]
    again = subprocess.run(_install(root), env=_env(), capture_output=True, text=True)
    assert again.returncode in (0, 3), again.stderr[-3000:]
    assert _builds(root) == ["with-blacklist", "with-blacklist"]  # _converged's own rebuild


def test_killed_before_the_trigger_run_the_next_run_runs_the_triggers(
    base: image.Image, tmp_path: Path
) -> None:
    """Killed as it starts its first process after the files (the activation, the trigger run
    not yet started): the driver's packages are left triggers-pending, and the same install
    again finishes them (`dpkg --configure -a` first) and ends converged."""
    ref = _copy(base, tmp_path / "ref")
    done, found = kill_points.points(_install(ref), env=_env())
    assert done.returncode in (0, 3), done.stderr[-3000:]
    # written through its directory's descriptor: renameat(fd</.../etc/modprobe.d>, NAME, ...)
    last_file = max(i for i, p in enumerate(found) if Path(BLACKLIST).name in p.args)
    point = next(p for p in found[last_file:] if p.syscall in kill_points.STARTS)
    root = _copy(base, tmp_path / "image")
    res = kill_points.kill_at(point, _install(root), env=_env())
    assert kill_points.killed(res), f"{point}: {res.returncode} {res.stderr[-2000:]}"
    assert (root / BLACKLIST.lstrip("/")).exists()
    left = _statuses(root)
    assert "install ok triggers-pending" in left.values(), left
    assert _builds(root) == []
    again = subprocess.run(_install(root), env=_env(), capture_output=True, text=True)
    assert again.returncode in (0, 3), again.stderr[-3000:]
    assert "run dpkg --configure -a" in again.stderr
    assert _converged(root, base.kver)[0] == "with-blacklist"
