"""A Debian 13 root with `udev` installed, for `udevadm verify` (systemd >= 254).

Debian 12's udevadm (systemd 252) has no `verify` verb (it came with systemd 254), so
the rules are checked with trixie's udevadm inside a chroot. The root comes from the shared
debootstrap cache (tests/helpers/debroot.py), is copied once to <cache>/udev-trixie and gets udev
installed there (about 3 s); later sessions reuse it while the cache is kept.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from helpers.debroot import DebrootUnavailable, build, cache_dir, full_copy

_MARKER = ".egpu-setup-udev-complete"


def udev_root() -> Path:
    """The trixie root with udevadm >= 254 (built on first use); DebrootUnavailable if not."""
    if shutil.which("chroot") is None:
        raise DebrootUnavailable("chroot is not available")
    root = cache_dir() / "udev-trixie"
    if (root / _MARKER).is_file():
        return root
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel workers: one installs, the others wait
        if (root / _MARKER).is_file():
            return root
        return _install_udev(root)


def _install_udev(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    full_copy(build("trixie"), root)  # a cache of its own, renamed never: not a layer
    proc = subprocess.run(
        ["chroot", str(root), "apt-get", "install", "-y", "--no-install-recommends", "udev"],
        capture_output=True,
        text=True,
        check=False,
        env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    if proc.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise DebrootUnavailable(f"installing udev in the trixie root failed: {proc.stderr[-400:]}")
    (root / _MARKER).write_text("udev installed\n")
    return root


def udevadm_verify(root: Path, rules: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run trixie's `udevadm verify` on rule files (name -> text) copied into the root."""
    work = Path(tempfile.mkdtemp(prefix="egpu-setup-rules-", dir=root / "tmp"))
    inside = "/tmp/" + work.name
    for name, text in rules.items():
        (work / name).write_text(text)
    try:
        return subprocess.run(
            [
                "chroot",
                str(root),
                "udevadm",
                "verify",
                "--resolve-names=never",
                *(f"{inside}/{n}" for n in rules),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    print(udev_root(), file=sys.stderr)
