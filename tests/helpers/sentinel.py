"""A sentinel tree outside the target, for the hostile tests: hashed before and after an attack.

Each hostile test builds its input in a temp dir: a link (absolute, the way a tarball or a
careless image build leaves them), a FIFO, a loop, a name with a newline, pointing at the
sentinel's files (a stand-in /etc/sudoers, an /etc/shadow with a secret in it, a home with a
venv...). The real command runs as root against real files; the sentinel is what it must not
reach: `unchanged()` compares every entry (bytes, mode, owner, link target) with the state
before, `leaked(text)` tells whether its secret reached an output or a file, and `clean_error`
checks that a refusal is an `error:` and a `hint:`, no traceback.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import FIXTURES

TB4 = FIXTURES / "tb4-rtx4090-ubuntu2404"  # the recorded laptop the attacks install for
STATE = "var/lib/egpu-setup"  # the state directory, relative to an image root
UDEV = "etc/udev/rules.d/71-egpu-setup.rules"  # a file install manages
NOBODY = 65534  # the user who attacks, as a real process
SYSTEM_PYTHON = Path("/usr/bin/python3")  # stdlib only: nobody cannot reach the venv under /work
AS_NOBODY = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a process as another user needs root"),
    pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no /usr/bin/python3 for nobody"),
]


def drop_to_nobody() -> None:
    """A preexec function: the child runs as nobody, with no supplementary groups."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def tree_digest(base: Path) -> dict[str, tuple[str, ...]]:
    """Every entry under `base`, without following links: kind, mode, owner and content hash
    (files), target (links)."""
    out: dict[str, tuple[str, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(base))
            owner = f"{st.st_uid}:{st.st_gid}"
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = (
                    "file",
                    oct(st.st_mode),
                    owner,
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                )
            else:
                out[rel] = ("other", oct(st.st_mode), owner)
    return out


@dataclass
class Sentinel:
    """Files outside the target: what a planted link points at, what a hostile input names."""

    base: Path
    secret: str = field(default_factory=lambda: f"SENTINEL-{secrets.token_hex(8)}")
    before: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        etc = self.base / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "sudoers").write_text("root ALL=(ALL:ALL) ALL\n")
        (etc / "sudoers").chmod(0o440)
        # the first line is what a careless error message would quote
        (etc / "shadow").write_text(f"root:$6${self.secret}$hash:19000:0:99999:7:::\n")
        (etc / "shadow").chmod(0o640)
        (etc / "os-release").write_text(f'ID=sentinel\nVERSION_ID="{self.secret}"\n')
        (self.base / "dir").mkdir(exist_ok=True)
        (self.base / "dir" / "keep.txt").write_text(f"{self.secret}\n")
        self.before = tree_digest(self.base)

    @property
    def sudoers(self) -> Path:
        return self.base / "etc" / "sudoers"

    @property
    def shadow(self) -> Path:
        return self.base / "etc" / "shadow"

    @property
    def directory(self) -> Path:
        return self.base / "dir"

    def unchanged(self) -> bool:
        return tree_digest(self.base) == self.before

    def changes(self) -> dict[str, tuple[tuple[str, ...] | None, tuple[str, ...] | None]]:
        """path -> (before, after) for every entry that differs (for assertion messages)."""
        after = tree_digest(self.base)
        return {
            k: (self.before.get(k), after.get(k))
            for k in sorted(set(self.before) | set(after))
            if self.before.get(k) != after.get(k)
        }

    def leaked(self, *texts: str) -> bool:
        return any(self.secret in t for t in texts)

    def leaked_into(self, tree: Path) -> list[str]:
        """Files under `tree` (links not followed) whose bytes hold the secret."""
        found = []
        needle = self.secret.encode()
        for dirpath, _, filenames in os.walk(tree, followlinks=False):
            for name in filenames:
                p = Path(dirpath) / name
                if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
                    found.append(str(p))
        return found


def install(
    cli: Callable[..., subprocess.CompletedProcess[str]],
    img: Path,
    *extra: str,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`install --only config` of the recorded TB4 laptop into the image `img`."""
    return cli(
        "install", "--profile", "rtx4090", "--only", "config", "--root", str(img), "--from",
        str(TB4), "--yes", *extra, timeout=timeout,
    )  # fmt: skip


def clean_error(res: subprocess.CompletedProcess[str]) -> None:
    """The refusal is an `error:` and a `hint:`, no traceback and no "internal error"."""
    assert res.stderr.startswith("error: ") or "\nerror: " in res.stderr, res.stderr
    assert "\nhint: " in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
