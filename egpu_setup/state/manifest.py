"""The manifest: every file, link, package, venv and command egpu-setup is responsible for.

Why content-addressed backups: a file replaced twice keeps its *original* content (the one from
before egpu-setup ever touched it), which is what rollback must restore byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from egpu_setup.errors import EgpuSetupError
from egpu_setup.state.atomic import atomic_write, sha256
from egpu_setup.state.paths import StatePaths, denied

MANIFEST_SCHEMA = "egpu-setup/manifest/1"


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
        try:
            data = json.loads(paths.manifest.read_text())
        except FileNotFoundError:
            return cls(paths)
        except PermissionError as exc:
            # not root: a dry run goes on without it (catches PermissionError); the rest says so
            raise denied(paths.manifest, "read") from exc
        except (OSError, ValueError) as exc:
            raise EgpuSetupError(
                f"cannot read the manifest {paths.manifest}: {exc}",
                "restore it from a backup or move it away to start over (rollback needs it)",
            ) from exc
        if data.get("schema") != MANIFEST_SCHEMA:
            raise EgpuSetupError(
                f"{paths.manifest}: unknown schema {data.get('schema')!r}",
                "this manifest was written by another egpu-setup version",
            )
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
            self.paths.state_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.paths.manifest, (json.dumps(data, indent=2) + "\n").encode(), 0o600)
        except PermissionError as exc:
            raise denied(self.paths.manifest, "write") from exc

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
        target = self.paths.backups / digest
        if not target.exists():
            atomic_write(target, data, 0o600)
        return digest

    def read_backup(self, name: str) -> bytes:
        data = (self.paths.backups / name).read_bytes()
        if sha256(data) != name:
            raise EgpuSetupError(
                f"backup {self.paths.backups / name} is corrupt (hash mismatch)",
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

    def add_package(self, name: str, run_id: str) -> None:
        if not any(p["name"] == name for p in self.packages):
            self.packages.append({"name": name, "run": run_id})

    def add_venv(self, path: str, run_id: str) -> None:
        if not any(v["path"] == path for v in self.venvs):
            self.venvs.append({"path": path, "run": run_id})

    def add_command(self, argv: list[str], undo: list[str], run_id: str) -> None:
        if not any(c["undo"] == undo for c in self.commands):
            self.commands.append({"argv": argv, "undo": undo, "run": run_id})
