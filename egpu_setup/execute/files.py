"""Managed file and link writes, and their exact reversal (rollback).

Order of a write, chosen so a crash anywhere leaves either the old or the new file and a manifest
that knows which (reference/hotplug-security.md §6.1, §6.2, §6.8):
  1. first touch: the previous content goes to backups/<sha256>, the entry records it;
  2. the entry records `pending` = hash of the new content (manifest saved atomically);
  3. temp file in the target directory, fsync, rename, fsync the directory;
  4. the entry records `sha256` = the new hash, `pending` cleared.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.state.atomic import atomic_write, fsync_dir, sha256
from egpu_setup.state.manifest import Manifest

log = logging.getLogger("egpu_setup.execute")


@dataclass
class Context:
    host: Any
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
    real = _location(ctx.host, path)
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
    real = _location(ctx.host, path)
    entry = _entry(ctx, path, real, "link")
    entry["target"] = target
    ctx.manifest.save()
    real.parent.mkdir(parents=True, exist_ok=True)
    _replace_with_link(real, target)
    fsync_dir(real.parent)
    entry["sha256"] = "link:" + target
    ctx.manifest.save()  # the link is made: record it, as write_managed records its hash


# -- rollback -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Undo:
    path: str
    action: str  # restored / removed / kept-edited / already-gone / unlinked
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "action": self.action, "detail": self.detail}


def plan_undo(host: Any, manifest: Manifest) -> list[Undo]:
    """What rollback would do to each managed path (read-only)."""
    out: list[Undo] = []
    for path in reversed(list(manifest.files)):
        entry = manifest.files[path]
        real = _location(host, path)
        if entry["kind"] == "link":
            out.append(_plan_link(path, entry, real))
        else:
            out.append(_plan_file(path, entry, real, manifest))
    return out


def _prior(entry: dict[str, Any]) -> str:
    """What rollback puts back, in words."""
    if entry.get("prior_link") is not None:
        return f"to the link -> {entry['prior_link']} from before egpu-setup"
    return f"to the content from before egpu-setup ({(entry.get('prior_sha256') or '?')[:12]})"


def _plan_link(path: str, entry: dict[str, Any], real: Path) -> Undo:
    current = os.readlink(real) if real.is_symlink() else None
    if current is not None and current == entry.get("target"):
        if entry["created"]:
            return Undo(path, "unlinked")
        return Undo(path, "restored", _prior(entry))
    if current is not None:
        if current == entry.get("prior_link"):
            return Undo(path, "already-gone", f"already points to {current} again")
        return Undo(path, "kept-edited", f"now points to {current}")
    if real.exists():  # a regular file where our link was
        if entry.get("prior_sha256") and sha256(real.read_bytes()) == entry["prior_sha256"]:
            return Undo(path, "already-gone", "the file from before egpu-setup is back")
        return Undo(path, "kept-edited", "replaced by a file since egpu-setup linked it")
    if entry["created"]:
        return Undo(path, "already-gone")
    return Undo(path, "restored", _prior(entry))  # our link was removed: put theirs back


def _plan_file(path: str, entry: dict[str, Any], real: Path, manifest: Manifest) -> Undo:
    # we only ever write regular files: a link here now is someone else's (or the old one back)
    if real.is_symlink():
        current = os.readlink(real)
        if current == entry.get("prior_link"):
            return Undo(path, "already-gone", f"already the link -> {current} again")
        return Undo(path, "kept-edited", f"now a link to {current}")
    data = real.read_bytes() if real.is_file() else None
    if data is not None and not manifest.is_ours(path, data):
        return Undo(path, "kept-edited", "changed since egpu-setup wrote it")
    if entry["created"]:
        return Undo(path, "removed" if data is not None else "already-gone")
    return Undo(path, "restored", _prior(entry))


def _location(host: Any, path: str) -> Path:
    """Where `path` is on disk, its last component not followed: we replace links, not targets."""
    parent = host.real_path(path.rsplit("/", 1)[0] or "/")
    return parent / path.rsplit("/", 1)[1]


def apply_undo(host: Any, manifest: Manifest, undo: list[Undo], force: bool = False) -> list[Undo]:
    """Carry out `undo`; entries that were handled leave the manifest (saved after each)."""
    done: list[Undo] = []
    for u in undo:
        entry = manifest.files[u.path]
        real = _location(host, u.path)
        if u.action == "kept-edited" and not force:
            log.warning("%s was edited after egpu-setup wrote it: kept as it is", u.path)
            done.append(u)
            continue
        if u.action == "already-gone" and not entry["created"]:
            pass  # what was there before us is back already (by hand): nothing to put back
        elif entry.get("prior_link") is not None:
            # a link before us (file or unit link entry alike): the same link text, exactly
            _replace_with_link(real, entry["prior_link"])
        elif entry.get("prior_sha256"):
            # a regular file before us, whatever we put there (a file or a unit link): its
            # bytes, mode and owner from the backup (a link we made over it goes with the rename)
            data = manifest.read_backup(entry["backup"])
            atomic_write(real, data, entry["prior_mode"])  # the rename replaces our link too
            owner = entry.get("prior_owner")
            if owner and os.geteuid() == 0:
                os.chown(real, owner[0], owner[1])
        else:  # created by us
            with contextlib.suppress(FileNotFoundError):
                real.unlink()
        for d in reversed(entry.get("created_dirs") or []):
            with contextlib.suppress(OSError):  # not empty: something else lives there now
                _location(host, d).rmdir()
        with contextlib.suppress(OSError):
            fsync_dir(real.parent)
        del manifest.files[u.path]
        manifest.save()
        done.append(u)
    return done


def _replace_with_link(real: Path, target: str) -> None:
    """Make `real` the symlink -> `target` in one rename (a reader never sees it missing)."""
    tmp = real.with_name(f".{real.name}.egpu-setup-tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, real)


def remove_tree(host: Any, path: str) -> None:
    """Delete a venv egpu-setup created (only ever called for paths the manifest lists)."""
    import shutil

    real = _location(host, path)
    if (real / "pyvenv.cfg").is_file():
        shutil.rmtree(real)
    elif real.exists():
        log.warning("%s is not a venv any more: left alone", path)
