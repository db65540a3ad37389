"""A Debian 13 root with `udev` installed, for `udevadm verify` (systemd >= 254).

Debian 12's udevadm (systemd 252) has no `verify` verb (reference/fleet-and-testing.md §3), so
the rules are checked with trixie's udevadm inside a chroot. The root comes from the shared
debootstrap cache (tests/_debroot.py), is copied once to <cache>/udev-trixie and gets udev
installed there (about 3 s); later sessions reuse it while the cache is kept.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from _debroot import DebrootUnavailable, cache_dir, copy_root

_MARKER = ".egpu-setup-udev-complete"


def udev_root() -> Path:
    """The trixie root with udevadm >= 254 (built on first use); DebrootUnavailable if not."""
    if shutil.which("chroot") is None:
        raise DebrootUnavailable("chroot is not available")
    root = cache_dir() / "udev-trixie"
    if (root / _MARKER).is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    copy_root("trixie", root)
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


def udevadm_verify(root: Path, rules: dict[str, str]) -> subprocess.CompletedProcess:
    """Run trixie's `udevadm verify` on rule files (name -> text) copied into the root."""
    work = root / "tmp" / "egpu-setup-rules"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
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
                *(f"/tmp/egpu-setup-rules/{n}" for n in rules),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    print(udev_root(), file=sys.stderr)
