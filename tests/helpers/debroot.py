"""Real Debian roots for install tests, built once with debootstrap and copied per test.

Debian 12 (bookworm) and 13 (trixie), minbase, `main` only: a freshly installed Debian has no
contrib/non-free components, which is exactly what the install plan must add as a deb822 drop-in.
The mirror is read from this machine's own apt configuration (/etc/apt/sources*);
no host name is written into the repository.

Cache: $EGPU_SETUP_TEST_CACHE/debroot/<suite> when set (kept between sessions), else a temporary
directory for this test session. Each test gets its own copy, so a test can install, write and
roll back without disturbing the next one: an overlay mount (`layered_copy`: the cached root as
its read-only lower layer, the test's writes in an upper directory beside the copy), which costs
a mount instead of copying ~280 MB (8 s of `cp -a` at load 8 on the 2-core machine, no reflinks
on its ext4), or a plain `cp -a` where overlayfs cannot be mounted. Nothing written through the
copy reaches the lower layer (overlayfs(5) writes only its upper directory: "the lower directory
... is never modified"; tests/test_debroot_layers.py checks it). The layers a worker mounted are
unmounted when its session ends (`release_all`, tests/conftest.py).

Run directly to warm the cache:  python tests/helpers/debroot.py bookworm trixie
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from helpers import tiers

SUITES = ("bookworm", "trixie")
_MARKER = ".egpu-setup-debroot-complete"
# A policy-rc.d that refuses every service start: nothing in a root must start daemons.
_POLICY_RC = "#!/bin/sh\nexit 101\n"


class DebrootUnavailable(Exception):
    """debootstrap or a mirror is missing: tests skip with this reason."""


def host_mirror(etc: Path = Path("/etc/apt")) -> str:
    """The Debian archive URI this machine's apt uses (deb822 or one-line sources)."""
    candidates: list[str] = []
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            suites = fields.get("suites", "").split()
            if any(s in SUITES or s in ("stable", "oldstable") for s in suites):
                candidates.extend(fields.get("uris", "").split())
    one_line = etc / "sources.list"
    if one_line.is_file():
        for line in one_line.read_text(errors="replace").splitlines():
            m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m and m.group(2) in (*SUITES, "stable", "oldstable"):
                candidates.append(m.group(1))
    for uri in candidates:
        if uri.startswith(("http://", "https://", "file:")) and "security" not in uri:
            return uri
    raise DebrootUnavailable("no Debian archive found in /etc/apt/sources.list*")


def cache_dir() -> Path:
    base = os.environ.get("EGPU_SETUP_TEST_CACHE")
    if base:
        d = Path(base) / "debroot"
    else:
        d = Path(tempfile.gettempdir()) / f"egpu-setup-debroot-{os.getuid()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def build(suite: str, dest: Path | None = None) -> Path:
    """A complete minbase root for `suite` in the cache (built on first use; ~30 s).

    Parallel test workers (pytest-xdist) share the cache: the first one to ask builds the root
    under an exclusive lock, the others wait for it and then use the same root."""
    tiers.require("debootstrap")  # a cached root too: it is chrooted into, and 155 s the first time
    if shutil.which("debootstrap") is None:
        raise DebrootUnavailable("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise DebrootUnavailable("debootstrap and chroot need root")
    root = dest or cache_dir() / suite
    if (root / _MARKER).is_file():
        return root
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / _MARKER).is_file():
            return root
        return _debootstrap(suite, root)


def _debootstrap(suite: str, root: Path) -> Path:
    mirror = host_mirror()
    work = root.with_name(root.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    started = time.monotonic()
    proc = subprocess.run(
        ["debootstrap", "--variant=minbase", "--components=main", suite, str(work), mirror],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise DebrootUnavailable(f"debootstrap {suite} failed: {proc.stderr[-500:]}")
    (work / "usr/sbin/policy-rc.d").write_text(_POLICY_RC)
    (work / "usr/sbin/policy-rc.d").chmod(0o755)
    shutil.copy("/etc/resolv.conf", work / "etc/resolv.conf")
    for deb in (work / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    upd = subprocess.run(
        ["chroot", str(work), "apt-get", "update"], capture_output=True, text=True, check=False
    )
    if upd.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise DebrootUnavailable(f"apt-get update in {suite} root failed: {upd.stderr[-500:]}")
    (work / _MARKER).write_text(f"{suite} built in {time.monotonic() - started:.1f} s\n")
    shutil.rmtree(root, ignore_errors=True)
    work.rename(root)
    return root


def copy_root(suite: str, dest: Path) -> Path:
    """A private copy of the cached root at `dest`, for one test (or one module's fixture)."""
    layered_copy(build(suite), dest)
    (dest / _MARKER).unlink(missing_ok=True)  # a whiteout in the upper layer: the cache keeps it
    return dest


def full_copy(src: Path, dest: Path) -> Path:
    """dest: a copy of src of its own, for what becomes a cache itself (`derived_root`, the
    image base): an overlay's mount point cannot be renamed into place or be another's lower."""
    subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dest)], check=True)
    return dest


# The overlays this process mounted: mount point -> the directory holding its upper and work.
_layers: dict[Path, Path] = {}


def layered_copy(src: Path, dest: Path) -> Path:
    """dest: src as an overlay mount (lower src, upper and work in a directory beside dest),
    or a full copy where overlayfs cannot be mounted here. src must not change while mounted:
    the caches never do once complete (each is built aside and renamed into place)."""
    state = dest.with_name(f".{dest.name}.layer")
    (state / "upper").mkdir(parents=True)
    (state / "work").mkdir()
    dest.mkdir()
    # redirect_dir: a directory of the lower layer can be renamed (without it rename(2) is
    # EXDEV, which a real root's filesystem never answers)
    options = f"lowerdir={src},upperdir={state / 'upper'},workdir={state / 'work'},redirect_dir=on"
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        shutil.rmtree(state)
        dest.rmdir()
        return full_copy(src, dest)
    _layers[Path(os.path.realpath(dest))] = state
    return dest


def is_layer(path: Path) -> bool:
    """Whether path is the mount point of a copy `layered_copy` mounted in this process."""
    return Path(os.path.realpath(path)) in _layers


def release(dest: Path) -> None:
    """Unmount a layered copy (lazily when still busy) and delete what it wrote; a full copy is
    deleted. Never follows a mount below dest (rm --one-file-system)."""
    state = _layers.pop(Path(os.path.realpath(dest)), None)
    if state is not None:
        if subprocess.run(["umount", str(dest)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "--lazy", str(dest)], capture_output=True, check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(state)], check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(dest)], check=False)


def release_all() -> None:
    """Unmount every layered copy this process still has (a test session's end)."""
    for dest in list(_layers):
        release(dest)


def derived_root(suite: str, name: str, prepare: Callable[[Path], None]) -> Path:
    """<cache>/<name>: a copy of `suite`'s root that `prepare` changed once (packages, users a
    test needs), built under a lock on first use and reused while the cache is kept; `prepare`
    raises DebrootUnavailable to give up."""
    root = cache_dir() / name
    done = root / _MARKER
    if done.is_file():
        return root
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return root
        work = root.with_name(root.name + ".building")
        shutil.rmtree(work, ignore_errors=True)
        full_copy(build(suite), work)
        (work / _MARKER).unlink()
        try:
            prepare(work)
        except DebrootUnavailable:
            shutil.rmtree(work, ignore_errors=True)
            raise
        (work / _MARKER).write_text(f"{suite} prepared for {name}\n")
        shutil.rmtree(root, ignore_errors=True)
        work.rename(root)
    return root


def copy_or_skip(suite: str, dest: Path) -> Path:
    """copy_root, or the test skips (pytest.skip) when no root can be built here."""
    import pytest

    try:
        return copy_root(suite, dest)
    except DebrootUnavailable as exc:
        pytest.skip(str(exc))


def chroot(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` run in the root with plain chroot, as a person checking it would (C locale)."""
    return subprocess.run(
        ["chroot", str(root), *argv],
        capture_output=True,
        text=True,
        check=False,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def snapshot(root: Path, sub: str = "etc") -> dict[str, tuple[str, bytes | str]]:
    """Every entry under root/sub: regular files by bytes and mode, links by target, dirs."""
    out: dict[str, tuple[str, bytes | str]] = {}
    base = root / sub
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", oct(p.stat().st_mode))
            else:
                out[rel] = (oct(p.stat().st_mode), p.read_bytes())
    return out


if __name__ == "__main__":
    for s in sys.argv[1:] or SUITES:
        t = time.monotonic()
        print(s, build(s), f"{time.monotonic() - t:.1f} s")
