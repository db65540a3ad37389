"""Rollback of managed files and links: exactly what was there before egpu-setup, or nothing.

A file edited by someone after egpu-setup wrote it is kept (with a warning) unless forced; a
file replaced twice goes back to its content from before the first time.

Rollback acts as root on what the manifest says, so it acts only on paths egpu-setup writes
(OWNED: the rendered drop-ins, unit links, apt sources and keyrings, the staged bundle
packages), and removes a rendered file only while it carries egpu-setup's header. It is
idempotent across a kill: before each restore the entry records what is being put back
(`restoring`, the same role `pending` has for a write), so a rollback killed between the
rename and the manifest update recognises the restored file as done, not as someone's edit. A
restore that cannot be done (a missing or corrupt backup, a read-only or full disk) is reported
as failed, its entry kept for a later run, and the rest is undone.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from egpu_setup.errors import EgpuSetupError
from egpu_setup.execute.files import location, read_managed
from egpu_setup.host.identity import MACHINE_ID
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger
from egpu_setup.render.headers import has_header
from egpu_setup.state.atomic import (
    atomic_symlink,
    atomic_write,
    fsync_dir,
    remove,
    remove_dir,
    sha256,
)
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import MARK_VENV
from egpu_setup.state.verify_marker import FIRSTBOOT_MARKER

log = get_logger("egpu_setup.execute")

# Files egpu-setup renders, each starting with its header (render/headers.py): README, "What
# egpu-setup changes on a machine"; the names come from render/files.py.
RENDERED = (
    "/etc/udev/rules.d/*egpu-setup*.rules",
    "/etc/modprobe.d/egpu-setup-*.conf",
    "/etc/systemd/system/egpu-setup-*.service",
    "/etc/systemd/system/egpu-setup-*.timer",
    "/usr/local/bin/egpu-*",
    "/etc/default/grub.d/*egpu-setup*.cfg",
    "/etc/X11/xorg.conf.d/*egpu-setup*.conf",
    "/etc/apt/apt.conf.d/99egpu-setup-*",  # the kernels hook, the hold's unattended-upgrades
    "/etc/apt/preferences.d/99egpu-setup-*",  # the driver hold's pin (render/hold.py)
)
# Paths egpu-setup writes without a header: unit links, apt sources and keys, staged packages.
OTHER_OWNED = (
    "/etc/systemd/system/*.wants/egpu-setup-*.service",
    # NVIDIA's sleep units enabled in display mode (render/sleep.py): the links, never the units
    "/etc/systemd/system/systemd-*.service.requires/nvidia-*.service",
    "/etc/systemd/system/*.wants/egpu-setup-*.timer",
    "/etc/apt/sources.list.d/egpu-setup-*.sources",
    "/etc/apt/keyrings/egpu-setup-*.gpg",
    "/etc/apt/preferences.d/egpu-setup-*",
    "/var/lib/egpu-setup/bundle-apt/*/*",
)
# What `install --root` adds to a lab image (image/additions.py, image/tool.py, which sit
# above this layer; tests/install/test_image_steps_owned.py keeps the two lists in step): the
# first-boot marker and the profiles it names (with a header), the link to the tool's venv,
# Debian's persistenced unit masked, and the seal (machine-id(5) "uninitialized", D-Bus's link);
# with --mok-key the lab's signing key, certificate and password hash, and DKMS's drop-in naming
# them (install/mok_key.py).
IMAGE_OWNED = (
    FIRSTBOOT_MARKER,
    "/etc/egpu-setup/mok/mok.key",
    "/etc/egpu-setup/mok/mok.der",
    "/etc/egpu-setup/mok/mok.hash",
    "/etc/dkms/framework.conf.d/egpu-setup-mok.conf",
    "/etc/egpu-setup/profiles/*.yaml",
    "/usr/local/bin/egpu-setup",
    "/etc/systemd/system/nvidia-persistenced.service",
    MACHINE_ID,
    "/var/lib/dbus/machine-id",
)


def remove_empty_dirs(host: Host, dirs: list[str]) -> None:
    """Remove each of `dirs` that is an empty real directory, the deepest first."""
    for d in sorted(set(dirs), key=lambda p: p.count("/"), reverse=True):
        real = location(host, d)
        st = _lstat(real)
        if st is not None and stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError, EgpuSetupError):  # not empty: something else is in it
                remove_dir(real, anchor=host.root)


def mark_venv(host: Host, venv: str, run_id: str) -> None:
    """The mark `rollback --packages` looks for before it deletes a venv (remove_tree): a
    manifest naming some other directory can never make it delete that one."""
    atomic_write(
        host.location(f"{venv}/{MARK_VENV}"), f"{run_id}\n".encode(), 0o644, anchor=host.root
    )


def owned_path(path: str) -> bool:
    """Is `path` one egpu-setup writes (a whole-path match, component by component)?"""
    p = PurePosixPath(path)
    return any(p.match(pattern) for pattern in (*RENDERED, *OTHER_OWNED, *IMAGE_OWNED))


def rendered_path(path: str) -> bool:
    p = PurePosixPath(path)
    return any(p.match(pattern) for pattern in RENDERED)


@dataclass(frozen=True)
class Undo:
    path: str
    action: str  # restored / removed / kept-edited / already-gone / unlinked / refused / failed
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "action": self.action, "detail": self.detail}


def plan_undo(host: Host, manifest: Manifest) -> list[Undo]:
    """What rollback would do to each managed path (read-only)."""
    out: list[Undo] = []
    for path in reversed(list(manifest.files)):
        entry = manifest.files[path]
        if not owned_path(path):
            out.append(Undo(path, "refused", "not a path egpu-setup writes: left alone"))
            continue
        try:
            real = location(host, path)
            if entry["kind"] == "link":
                out.append(_plan_link(path, entry, real))
            else:
                out.append(_plan_file(path, entry, real, manifest))
        except EgpuSetupError as exc:  # a FIFO where our file was, a link loop above it
            out.append(Undo(path, "refused", exc.message))
    return out


def _prior(entry: dict[str, Any]) -> str:
    """What rollback puts back, in words."""
    if entry.get("prior_link") is not None:
        return f"to the link -> {entry['prior_link']} from before egpu-setup"
    return f"to the content from before egpu-setup ({(entry.get('prior_sha256') or '?')[:12]})"


def _lstat(real: Path) -> os.stat_result | None:
    try:
        return os.lstat(real)
    except FileNotFoundError:
        return None


def _plan_link(path: str, entry: dict[str, Any], real: Path) -> Undo:
    st = _lstat(real)
    current = os.readlink(real) if st is not None and stat.S_ISLNK(st.st_mode) else None
    if current is not None and current == entry.get("target"):
        if entry["created"]:
            return Undo(path, "unlinked")
        return Undo(path, "restored", _prior(entry))
    if current is not None:
        if current == entry.get("prior_link"):
            return Undo(path, "already-gone", f"already points to {current} again")
        return Undo(path, "kept-edited", f"now points to {current}")
    if st is not None:  # a regular file where our link was
        data = read_managed(real, path)
        if entry.get("prior_sha256") and sha256(data) == entry["prior_sha256"]:
            return Undo(path, "already-gone", "the file from before egpu-setup is back")
        return Undo(path, "kept-edited", "replaced by a file since egpu-setup linked it")
    if entry["created"]:
        return Undo(path, "already-gone")
    return Undo(path, "restored", _prior(entry))  # our link was removed: put theirs back


def _plan_file(path: str, entry: dict[str, Any], real: Path, manifest: Manifest) -> Undo:
    # we only ever write regular files: a link here now is someone else's (or the old one back)
    st = _lstat(real)
    if st is not None and stat.S_ISLNK(st.st_mode):
        current = os.readlink(real)
        if current == entry.get("prior_link"):
            return Undo(path, "already-gone", f"already the link -> {current} again")
        return Undo(path, "kept-edited", f"now a link to {current}")
    data = read_managed(real, path) if st is not None else None
    if data is not None and not entry["created"] and sha256(data) == entry.get("prior_sha256"):
        # put back already: by hand, or by a rollback killed before it could say so
        return Undo(path, "already-gone", "the file from before egpu-setup is back")
    if data is not None and not manifest.is_ours(path, data):
        return Undo(path, "kept-edited", "changed since egpu-setup wrote it")
    if entry["created"]:
        if data is None:
            return Undo(path, "already-gone")
        if rendered_path(path) and not has_header(_text(data)):
            return Undo(path, "refused", "it does not carry egpu-setup's header: left alone")
        return Undo(path, "removed")
    return Undo(path, "restored", _prior(entry))


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def apply_undo(host: Host, manifest: Manifest, undo: list[Undo], force: bool = False) -> list[Undo]:
    """Carry out `undo`; entries that were handled leave the manifest (saved after each).

    One that cannot be handled (its backup missing or corrupt, the disk read-only or full) comes
    back as action "failed", its entry kept, and the others are still undone."""
    done: list[Undo] = []
    for u in undo:
        if u.action == "refused":
            log.warning("%s: %s", u.path, u.detail)
            done.append(u)
            continue
        if u.action == "kept-edited" and not force:
            log.warning("%s was edited after egpu-setup wrote it: kept as it is", u.path)
            done.append(u)
            continue
        try:
            _undo_one(host, manifest, u)
        except EgpuSetupError as exc:
            log.warning("%s: not restored: %s", u.path, exc.message)
            done.append(Undo(u.path, "failed", exc.message))
            continue
        except OSError as exc:  # EROFS, ENOSPC, EACCES: said per file, the rest goes on
            why = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            log.warning("%s: not restored: %s", u.path, why)
            done.append(Undo(u.path, "failed", why))
            continue
        done.append(u)
    return done


def _undo_one(host: Host, manifest: Manifest, u: Undo) -> None:
    entry = manifest.files[u.path]
    real = location(host, u.path)
    if u.action == "already-gone" and not entry["created"]:
        pass  # what was there before us is back already: nothing to put back
    elif entry.get("prior_link") is not None:
        # a link before us (file or unit link entry alike): the same link text, exactly
        _mark_restoring(manifest, entry, "link:" + entry["prior_link"])
        atomic_symlink(real, entry["prior_link"], anchor=host.root)
    elif entry.get("prior_sha256"):
        # a regular file before us, whatever we put there (a file or a unit link): its bytes,
        # mode and owner from the backup (a link we made over it goes with the rename)
        data = manifest.read_backup(entry["backup"])
        _mark_restoring(manifest, entry, entry["prior_sha256"])
        mode = entry["prior_mode"] & 0o7777 if entry.get("prior_mode") is not None else None
        owner = entry.get("prior_owner")
        atomic_write(  # the rename replaces our link too; the owner is set on the descriptor
            real,
            data,
            mode,
            anchor=host.root,
            owner=(owner[0], owner[1]) if owner else None,
        )
    else:  # created by us
        remove(real, anchor=host.root)
    remove_empty_dirs(host, entry.get("created_dirs") or [])
    with contextlib.suppress(OSError, EgpuSetupError):
        fsync_dir(real.parent, anchor=host.root)
    del manifest.files[u.path]
    manifest.save()


def _mark_restoring(manifest: Manifest, entry: dict[str, Any], what: str) -> None:
    """Say what is about to be put back before the rename, as a write records `pending`."""
    entry["restoring"] = what
    manifest.save()


def temp_dirs(host: Host, manifest: Manifest) -> set[Path]:
    """The directories a killed write or restore may have left a temp file in."""
    out = {manifest.paths.state_dir, manifest.paths.backups}
    for path in manifest.files:
        with contextlib.suppress(EgpuSetupError):
            out.add(location(host, path).parent)
    return out


def clean_temp(host: Host, manifest: Manifest) -> list[Path]:
    """Remove the temp files (TMP_MARK) a killed install or rollback left next to its targets."""
    from egpu_setup.state.atomic import clean_temp_files

    removed = clean_temp_files(temp_dirs(host, manifest), anchor=host.root)
    for p in removed:
        log.warning("removed a temp file a dead run left: %s", p)
    return removed


def remove_tree(host: Host, path: str) -> bool:
    """Delete a venv egpu-setup created: only a real directory (not a link) that holds the mark
    egpu-setup left in it before making it (a run killed before venv wrote pyvenv.cfg leaves
    just the mark); True when it was removed."""
    import shutil

    real = location(host, path)
    st = _lstat(real)
    if st is None:
        return False
    marked = os.path.isfile(real / MARK_VENV) and not os.path.islink(real / MARK_VENV)
    if stat.S_ISDIR(st.st_mode) and marked:
        shutil.rmtree(real)
        return True
    why = "a link" if stat.S_ISLNK(st.st_mode) else "not a venv egpu-setup made"
    log.warning("%s is %s (no %s in it): left alone", path, why, MARK_VENV)
    return False
