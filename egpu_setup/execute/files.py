"""Managed file and link writes: each one recorded so rollback can reverse it exactly.

Order of a write, chosen so a crash anywhere leaves either the old or the new file and a manifest
that knows which (docs/sources.md, "Atomic writes"):
  1. first touch: the previous content goes to backups/<sha256>, the entry records it;
  2. the entry records `pending` = hash of the new content (manifest saved atomically);
  3. temp file in the target directory, fsync, rename, fsync the directory;
  4. the entry records `sha256` = the new hash, `pending` cleared.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.host.machine import Host
from egpu_setup.state.atomic import atomic_symlink, atomic_write, fsync_dir, sha256
from egpu_setup.state.manifest import Manifest

log = logging.getLogger("egpu_setup.execute")


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


def _entry(ctx: Context, path: str, real: Path, kind: str) -> dict[str, Any]:
    """The manifest entry of `path`, created on first touch with what was there before us."""
    entry = ctx.manifest.files.get(path)
    if entry is not None:
        return entry
    prior: bytes | None = None
    prior_mode = None
    prior_owner = None
    prior_link = None
    if real.is_symlink():
        prior_link = os.readlink(real)
    elif real.exists():
        prior = real.read_bytes()
        st = real.stat()
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
    before_rename: Callable[[Path], None] | None = None,
) -> None:
    real = location(ctx.host, path)
    entry = _entry(ctx, path, real, "file")
    current = real.read_bytes() if real.is_file() else None
    if current is not None and not ctx.manifest.is_ours(path, current) and entry["sha256"]:
        # --force over a user's edit: keep their version too, and say where
        name = ctx.manifest.backup(current)
        entry.setdefault("replaced_edits", []).append(name)
        log.warning("%s: your edited version is kept as backup %s", path, name)
    entry["pending"] = sha256(data)
    ctx.manifest.save()
    atomic_write(real, data, mode, before_rename=before_rename)
    entry.update(sha256=sha256(data), pending=None, mode=mode)
    ctx.manifest.save()
    ctx.written.append(path)


def link_managed(ctx: Context, path: str, target: str) -> None:
    """A symlink `path` -> `target` (as `systemctl enable` makes), replaced atomically."""
    real = location(ctx.host, path)
    entry = _entry(ctx, path, real, "link")
    entry["target"] = target
    ctx.manifest.save()
    real.parent.mkdir(parents=True, exist_ok=True)
    atomic_symlink(real, target)
    fsync_dir(real.parent)
    entry["sha256"] = "link:" + target
    ctx.manifest.save()  # the link is made: record it, as write_managed records its hash


def location(host: Host, path: str) -> Path:
    """Where `path` is on disk, its last component not followed: we replace links, not targets."""
    parent = host.real_path(path.rsplit("/", 1)[0] or "/")
    return parent / path.rsplit("/", 1)[1]
