"""Managed file and link writes: each one recorded so rollback can reverse it exactly.

Order of a write, chosen so a crash anywhere leaves either the old or the new file and a manifest
that knows which (docs/sources.md, "Atomic writes"):
  1. first touch: the previous content goes to backups/<sha256>, the entry records it;
  2. the entry records `pending` = hash of the new content (manifest saved atomically);
  3. temp file in the target directory, fsync, rename, fsync the directory;
  4. the entry records `sha256` = the new hash, `pending` cleared.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.errors import EgpuSetupError
from egpu_setup.host.machine import Host, open_beneath
from egpu_setup.log import get_logger
from egpu_setup.state.atomic import atomic_symlink, atomic_write, sha256, sync_filesystem
from egpu_setup.state.manifest import Manifest

log = get_logger("egpu_setup.execute")


@dataclass
class Context:
    host: Host
    manifest: Manifest
    run_id: str
    force: bool = False
    written: list[str] = field(default_factory=list)


def _missing_dirs(real: Path, root: Path) -> list[str]:
    """Ancestors of `real` that do not exist yet (outermost first), as paths below the root."""
    out: list[Path] = []
    d = real.parent
    while not d.exists() and d != d.parent:
        out.append(d)
        d = d.parent
    return [
        ("/" + str(p.relative_to(root))) if root != Path("/") else str(p) for p in reversed(out)
    ]


def missing_parents(host: Host, path: str) -> list[str]:
    """The directories above `path` that do not exist yet (outermost first), as host paths:
    by name, so a link on the way (a /opt that points elsewhere) is not resolved into them."""
    out: list[str] = []
    parent = path.rstrip("/").rpartition("/")[0]
    while parent and not host.exists(parent):
        out.insert(0, parent)
        parent = parent.rpartition("/")[0]
    return out


def _entry(ctx: Context, path: str, real: Path, kind: str) -> dict[str, Any]:
    """The manifest entry of `path`, created on first touch with what was there before us."""
    entry = ctx.manifest.files.get(path)
    if entry is not None:
        return entry
    prior: bytes | None = None
    prior_mode = None
    prior_owner = None
    prior_link = None
    st = _lstat(real)
    if st is not None and stat.S_ISLNK(st.st_mode):
        prior_link = os.readlink(real)
    elif st is not None:
        prior = read_managed(real, path)
        prior_mode = st.st_mode & 0o7777
        prior_owner = [st.st_uid, st.st_gid]
    entry = {
        "kind": kind,
        "created": prior is None and prior_link is None,
        "prior_sha256": sha256(prior) if prior is not None else None,
        "prior_mode": prior_mode,
        "prior_owner": prior_owner,
        "prior_link": prior_link,
        "backup": ctx.manifest.backup(prior) if prior is not None else None,
        "created_dirs": _missing_dirs(real, ctx.host.root),
        "sha256": None,
        "pending": None,
        "run": ctx.run_id,
    }
    ctx.manifest.files[path] = entry
    return entry


def write_managed(
    ctx: Context,
    path: str,
    data: bytes,
    mode: int,
) -> None:
    real = location(ctx.host, path)
    entry = _entry(ctx, path, real, "file")
    st = _lstat(real)
    if st is not None and stat.S_ISLNK(st.st_mode) and entry["sha256"]:
        # --force over a link someone put where our file was: the link goes (the rename
        # replaces it), what it points to is never read, let alone copied into backups/
        target = os.readlink(real)
        entry.setdefault("replaced_links", []).append(target)
        log.warning("%s: replacing the link -> %s that took its place", path, target)
    current = read_managed(real, path) if st is not None and stat.S_ISREG(st.st_mode) else None
    if current is not None and not ctx.manifest.is_ours(path, current) and entry["sha256"]:
        # --force over a user's edit: keep their version too, and say where
        name = ctx.manifest.backup(current)
        entry.setdefault("replaced_edits", []).append(name)
        log.warning("%s: your edited version is kept as backup %s", path, name)
    entry["pending"] = sha256(data)
    ctx.manifest.save()
    atomic_write(real, data, mode, anchor=ctx.host.root)
    entry.update(sha256=sha256(data), pending=None, mode=mode)
    ctx.manifest.save()
    ctx.written.append(path)


def copy_managed(ctx: Context, path: str, source: str, digest: str, mode: int) -> None:
    """`write_managed` of a file of this machine (a lab's signing key: its bytes are in no plan),
    only when it still has the sha256 it was planned with."""
    from egpu_setup.host.machine import LiveHost

    data = LiveHost().read_bytes(source, 1 << 20)
    if data is None or sha256(data) != digest:
        raise EgpuSetupError(
            f"{source} changed (or went) since the plan was made; {path} was not written",
            "check who else writes there, then run the same command again",
        )
    write_managed(ctx, path, data, mode)


def link_managed(ctx: Context, path: str, target: str) -> None:
    """A symlink `path` -> `target` (as `systemctl enable` makes), replaced atomically."""
    real = location(ctx.host, path)
    entry = _entry(ctx, path, real, "link")
    entry["target"] = target
    ctx.manifest.save()
    atomic_symlink(real, target, anchor=ctx.host.root)
    entry["sha256"] = "link:" + target
    ctx.manifest.save()  # the link is made: record it, as write_managed records its hash


def _lstat(real: Path) -> os.stat_result | None:
    try:
        return os.lstat(real)
    except FileNotFoundError:
        return None


def read_managed(real: Path, path: str) -> bytes:
    """The bytes of the regular file at `real` (a managed path, every link on the way already
    resolved inside its root: Host.real_path), never through a link: opened by `open_beneath`
    from `/`, so a directory swapped for a link since it was resolved fails the read instead of
    leading it elsewhere. An error naming it for anything else there (a FIFO would block, a
    device never end)."""
    try:
        fd = open_beneath(Path("/"), real)
    except OSError as exc:
        raise EgpuSetupError(
            f"cannot read {path}: {exc.strerror or exc}", f"look at {real} and move it away"
        ) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EgpuSetupError(
                f"{path} is not a regular file (found at {real})",
                "egpu-setup writes only regular files and links there: move it away",
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def location(host: Host, path: str) -> Path:
    """Where `path` is on disk, its last component not followed: we replace links, not targets."""
    return Path(host.location(path))


def make_durable(host: Host, paths: Sequence[str]) -> None:
    """Everything written under `paths` on disk before the journal says the step is done:
    syncfs(2) once on each filesystem that holds one of them (state/atomic.py), so a power cut
    after the step leaves what the step did, not a journal that says so. An existing path is
    synced; EgpuSetupError naming the path when the disk cannot take it."""
    synced: set[int] = set()
    for path in paths:
        device = host.filesystem_of(path)
        if device is None or device in synced or not host.is_dir(path):
            continue
        synced.add(device)
        try:
            sync_filesystem(host.real_path(path), anchor=host.root)
        except OSError as exc:
            raise EgpuSetupError(
                f"{path}: what was installed could not be written to disk ({exc.strerror})",
                f"check the disk that holds {path} (`dmesg`, `df -h {path}`), then run again: "
                "the step is not counted as done",
            ) from exc
