"""Rollback of managed files and links: exactly what was there before egpu-setup, or nothing.

A file edited by someone after egpu-setup wrote it is kept (with a warning) unless forced; a
file replaced twice goes back to its content from before the first time.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.execute.files import location
from egpu_setup.host.machine import Host
from egpu_setup.state.atomic import atomic_symlink, atomic_write, fsync_dir, sha256
from egpu_setup.state.manifest import Manifest

log = logging.getLogger("egpu_setup.execute")


@dataclass(frozen=True)
class Undo:
    path: str
    action: str  # restored / removed / kept-edited / already-gone / unlinked
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "action": self.action, "detail": self.detail}


def plan_undo(host: Host, manifest: Manifest) -> list[Undo]:
    """What rollback would do to each managed path (read-only)."""
    out: list[Undo] = []
    for path in reversed(list(manifest.files)):
        entry = manifest.files[path]
        real = location(host, path)
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


def apply_undo(host: Host, manifest: Manifest, undo: list[Undo], force: bool = False) -> list[Undo]:
    """Carry out `undo`; entries that were handled leave the manifest (saved after each)."""
    done: list[Undo] = []
    for u in undo:
        entry = manifest.files[u.path]
        real = location(host, u.path)
        if u.action == "kept-edited" and not force:
            log.warning("%s was edited after egpu-setup wrote it: kept as it is", u.path)
            done.append(u)
            continue
        if u.action == "already-gone" and not entry["created"]:
            pass  # what was there before us is back already (by hand): nothing to put back
        elif entry.get("prior_link") is not None:
            # a link before us (file or unit link entry alike): the same link text, exactly
            atomic_symlink(real, entry["prior_link"])
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
                location(host, d).rmdir()
        with contextlib.suppress(OSError):
            fsync_dir(real.parent)
        del manifest.files[u.path]
        manifest.save()
        done.append(u)
    return done


def remove_tree(host: Host, path: str) -> None:
    """Delete a venv egpu-setup created (only ever called for paths the manifest lists)."""
    import shutil

    real = location(host, path)
    if (real / "pyvenv.cfg").is_file():
        shutil.rmtree(real)
    elif real.exists():
        log.warning("%s is not a venv any more: left alone", path)
