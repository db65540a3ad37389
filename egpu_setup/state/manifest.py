"""The manifest: every file, link, package, venv and command egpu-setup is responsible for.

Why content-addressed backups: a file replaced twice keeps its *original* content (the one from
before egpu-setup ever touched it), which is what rollback must restore byte for byte.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from egpu_setup.errors import EgpuSetupError
from egpu_setup.state.atomic import atomic_write, sha256
from egpu_setup.state.paths import StatePaths, denied, read_state, refuse_link

MANIFEST_SCHEMA = "egpu-setup/manifest/1"
HEX64 = re.compile(r"[0-9a-f]{64}")
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?")


@dataclass
class Manifest:
    """Files, links, packages and venvs egpu-setup is responsible for, keyed by host path.

    A file entry: created (did not exist before us), prior_sha256/prior_mode/backup (the content
    from before egpu-setup first touched it), sha256 (what we last wrote, confirmed on disk),
    pending (what we are about to write: set before the rename, cleared after, so a crash between
    the two is recognised as ours, not as a user's edit).
    """

    paths: StatePaths
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    packages: list[dict[str, Any]] = field(default_factory=list)
    venvs: list[dict[str, Any]] = field(default_factory=list)
    # commands whose effect outlives the files, with the argv that undoes each, e.g.
    # {"argv": ["boltctl", "enroll", …, UUID], "undo": ["boltctl", "forget", UUID], "run": …}
    commands: list[dict[str, Any]] = field(default_factory=list)
    # follow-up commands (initramfs rebuild, reloads) owed for files a run set out to write:
    # recorded before any file is written, cleared when the command ran, so a run that failed or
    # was killed in between plans them again: [{"argv": [...], "run": run_id}]
    pending: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, paths: StatePaths) -> Manifest:
        """The manifest of `paths` (empty when there is none); EgpuSetupError naming the key
        when it is not one egpu-setup wrote (a link, bad JSON, the wrong shape)."""
        raw = read_state(
            paths.manifest, anchor=paths.anchor
        )  # StateAccessError (a PermissionError) when not root
        if raw is None:
            return cls(paths)
        try:
            data = json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError) as exc:
            raise EgpuSetupError(
                f"cannot read the manifest {paths.manifest}: {exc}",
                "restore it from a backup or move it away to start over (rollback needs it)",
            ) from None
        if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
            schema = data.get("schema") if isinstance(data, dict) else None
            raise EgpuSetupError(
                f"{paths.manifest}: unknown schema {schema!r}",
                "this manifest was written by another egpu-setup version",
            )
        check_shape(data, str(paths.manifest))
        return cls(
            paths,
            data.get("files", {}),
            data.get("packages", []),
            data.get("venvs", []),
            data.get("commands", []),
            data.get("pending_commands", []),
        )

    def save(self) -> None:
        data = {
            "schema": MANIFEST_SCHEMA,
            "files": self.files,
            "packages": self.packages,
            "venvs": self.venvs,
            "commands": self.commands,
            "pending_commands": self.pending,
        }
        try:
            refuse_link(self.paths.state_dir)
            atomic_write(
                self.paths.manifest,
                (json.dumps(data, indent=2) + "\n").encode(),
                0o600,
                anchor=self.paths.anchor,
            )
        except PermissionError as exc:
            raise denied(self.paths.manifest, "write") from exc
        except OSError as exc:  # EROFS, ENOSPC: said, never a traceback
            raise EgpuSetupError(
                f"cannot write the manifest {self.paths.manifest}: {exc.strerror or exc}",
                "free space or remount the filesystem read-write, then run the same command "
                "again (nothing done so far is lost: each change was recorded before it was made)",
            ) from exc

    @property
    def empty(self) -> bool:
        return not (self.files or self.packages or self.venvs or self.commands)

    def pending_commands(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(p["argv"]) for p in self.pending)

    def add_pending_command(self, argv: tuple[str, ...], run_id: str) -> None:
        if tuple(argv) not in self.pending_commands():
            self.pending.append({"argv": list(argv), "run": run_id})

    def clear_pending_command(self, argv: tuple[str, ...]) -> None:
        self.pending = [p for p in self.pending if tuple(p["argv"]) != tuple(argv)]

    def backup(self, data: bytes) -> str:
        """Store `data` content-addressed; return the backup's name."""
        digest = sha256(data)
        refuse_link(self.paths.state_dir)
        target = refuse_link(self.paths.backups) / digest
        have = read_state(target, anchor=self.paths.anchor) if os.path.lexists(target) else None
        if have is None or sha256(have) != digest:  # missing, or not what its name says
            try:
                atomic_write(target, data, 0o600, anchor=self.paths.anchor)
            except PermissionError as exc:
                raise denied(self.paths.backups, "write") from exc
            except OSError as exc:  # ENOSPC, EDQUOT, EROFS: the file it backs up stays as it is
                raise EgpuSetupError(
                    f"cannot keep a backup ({len(data)} bytes) in {self.paths.backups}: "
                    f"{exc.strerror or exc}; the file it is the backup of was left unchanged",
                    "free space or remount the filesystem read-write, then run the same command "
                    "again: it goes on from where this one stopped",
                ) from None
        return digest

    def read_backup(self, name: str) -> bytes:
        """The backed-up bytes named `name`; EgpuSetupError when missing or corrupt."""
        path = refuse_link(self.paths.backups) / name
        data = read_state(path, anchor=self.paths.anchor) if HEX64.fullmatch(name) else None
        if data is None:
            raise EgpuSetupError(
                f"backup {path} is missing",
                "the file cannot be restored byte for byte; restore it by hand",
            )
        if sha256(data) != name:
            raise EgpuSetupError(
                f"backup {path} is corrupt (hash mismatch)",
                "the file cannot be restored byte for byte; restore it by hand",
            )
        return data

    def is_ours(self, path: str, current: bytes | None) -> bool:
        """True when the file on disk is what we wrote (or about to write): safe to change."""
        entry = self.files.get(path)
        if entry is None:
            return False
        if current is None:
            return True
        digest = sha256(current)
        if digest in (entry.get("sha256"), entry.get("pending")):
            return True
        # a crash after recording the intent but before the rename: the old content is still there
        return entry.get("sha256") is None and digest == entry.get("prior_sha256")

    def add_package(self, name: str, run_id: str, *, pulled_in: bool = False) -> None:
        """A package a run installed: one it named, or (pulled_in) one apt brought with it."""
        if not any(p["name"] == name for p in self.packages):
            entry: dict[str, Any] = {"name": name, "run": run_id}
            if pulled_in:
                entry["pulled_in"] = True
            self.packages.append(entry)

    def add_venv(self, path: str, run_id: str, created_dirs: list[str] | None = None) -> None:
        """A venv a run creates; created_dirs: the directories above it that did not exist
        (rollback --packages removes them with it, once empty)."""
        if not any(v["path"] == path for v in self.venvs):
            entry: dict[str, Any] = {"path": path, "run": run_id}
            if created_dirs:
                entry["created_dirs"] = list(created_dirs)
            self.venvs.append(entry)

    def add_command(self, argv: list[str], undo: list[str], run_id: str) -> None:
        if not any(c["undo"] == undo for c in self.commands):
            self.commands.append({"argv": argv, "undo": undo, "run": run_id})

    def forget_command(self, undo: list[str]) -> bool:
        """Drop the command recorded with this undo; True when one was recorded."""
        before = len(self.commands)
        self.commands = [c for c in self.commands if c["undo"] != undo]
        return len(self.commands) != before


# -- the shape of a manifest egpu-setup wrote ---------------------------------------------------

_OPT_STR = (str, type(None))
_FILE_KEYS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "created": (bool,),
    "prior_sha256": _OPT_STR,
    "prior_mode": (int, type(None)),
    "prior_owner": (list, type(None)),
    "prior_link": _OPT_STR,
    "backup": _OPT_STR,
    "created_dirs": (list, type(None)),
    "sha256": _OPT_STR,
    "pending": _OPT_STR,
    "restoring": _OPT_STR,
    "run": _OPT_STR,
    "target": _OPT_STR,
    "mode": (int, type(None)),
    "replaced_edits": (list,),
    "replaced_links": (list,),
}


def host_path_ok(path: object) -> bool:
    """An absolute, normalised host path: no `.`, `..` or empty component, no NUL, no newline."""
    if not isinstance(path, str) or not path.startswith("/") or path == "/":
        return False
    parts = path[1:].split("/")
    return all(p not in ("", ".", "..") for p in parts) and not ({"\0", "\n"} & set(path))


def check_shape(data: dict[str, Any], where: str) -> None:
    """EgpuSetupError naming the first key of `data` that a manifest egpu-setup wrote never has:
    rollback acts on these values as root, so well-formed JSON of another shape is refused."""

    def bad(key: str, what: str) -> EgpuSetupError:
        return EgpuSetupError(
            f"{where}: {key}: {what}",
            "this manifest was not written by egpu-setup (or was edited): restore it from a "
            "backup, or move it away to start over (rollback needs it)",
        )

    def strings(value: object, key: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad(key, "expected a list of strings")
        return value

    files = data.get("files", {})
    if not isinstance(files, dict):
        raise bad("files", "expected an object keyed by host path")
    for path, entry in files.items():
        key = f"files[{path!r}]"
        if not host_path_ok(path):
            raise bad(key, "not an absolute, normalised host path")
        if not isinstance(entry, dict) or entry.get("kind") not in ("file", "link"):
            raise bad(key, 'expected an object with "kind": "file" or "link"')
        for name, value in entry.items():
            types = _FILE_KEYS.get(name)
            if types is not None and not isinstance(value, types):
                raise bad(f"{key}.{name}", f"unexpected {type(value).__name__}")
        for name in ("backup", "prior_sha256"):
            if entry.get(name) is not None and not HEX64.fullmatch(entry[name]):
                raise bad(f"{key}.{name}", "not a sha256")
        for d in strings(entry.get("created_dirs") or [], f"{key}.created_dirs"):
            if not host_path_ok(d) or not path.startswith(d + "/"):
                raise bad(f"{key}.created_dirs", f"{d!r} is not a directory above {path}")
        for name in strings(entry.get("replaced_edits", []), f"{key}.replaced_edits"):
            if not HEX64.fullmatch(name):
                raise bad(f"{key}.replaced_edits", "not a sha256")
        owner = entry.get("prior_owner")
        if owner is not None and (len(owner) != 2 or not all(isinstance(i, int) for i in owner)):
            raise bad(f"{key}.prior_owner", "expected [uid, gid]")
    for name, field_name in (("packages", "name"), ("venvs", "path")):
        items = data.get(name, [])
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get(field_name), str) for i in items
        ):
            raise bad(name, f'expected a list of objects with a "{field_name}" string')
    for pkg in data.get("packages", []):
        # Debian Policy 5.6.1: rollback passes these to `apt-get purge`, so an option ("-o…")
        # or anything but a package name must never get there
        if not PACKAGE_NAME.fullmatch(pkg["name"]):
            raise bad("packages", f"{pkg['name']!r} is not a Debian package name")
        for flag in ("pulled_in", "purging"):
            if not isinstance(pkg.get(flag, False), bool):
                raise bad("packages", f"{pkg['name']!r}: {flag} is not true or false")
    for v in data.get("venvs", []):
        if not host_path_ok(v["path"]):
            raise bad("venvs", f"{v['path']!r} is not an absolute, normalised path")
        for d in strings(v.get("created_dirs") or [], "venvs.created_dirs"):
            if not host_path_ok(d) or not v["path"].startswith(d + "/"):
                raise bad("venvs.created_dirs", f"{d!r} is not a directory above {v['path']}")
    for name, keys in (("commands", ("argv", "undo")), ("pending_commands", ("argv",))):
        items = data.get(name, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise bad(name, "expected a list of objects")
        for i, item in enumerate(items):
            for k in keys:
                strings(item.get(k), f"{name}[{i}].{k}")
