"""The bundle format (manifest schema egpu-setup/bundle/1), as `install --bundle` reads it.

manifest.json                     targets, every file with sha256 and size, inputs per part
profile.yaml                      the profile it was resolved for
wheels/py3.11/*.whl               torch (+ extras) and their dependencies, one pool per Python
requirements-py3.11-debian-12.txt `name==version --hash=sha256:...` per target
debs/debian-12/*.deb + Packages   the driver's packages: a flat local apt repository
tool/*.whl                        egpu-setup's own wheel and its dependencies (Ansible's
                                  `bundle` source installs from here, --no-index)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.errors import EgpuSetupError, UsageError

SCHEMA = "egpu-setup/bundle/1"


MANIFEST = "manifest.json"


PROFILE_FILE = "profile.yaml"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Manifest:
    path: Path
    data: dict[str, Any]

    @property
    def targets(self) -> list[dict[str, Any]]:
        return list(self.data.get("targets", []))

    def target_names(self) -> str:
        return ", ".join(t["name"] for t in self.targets) or "none"

    def files(self) -> dict[str, dict[str, Any]]:
        return {f["path"]: f for f in self.data.get("files", [])}


def load_manifest(bundle: Path) -> Manifest:
    """The bundle's manifest, validated; UsageError (exit 2) when DIR is not a bundle."""
    path = Path(bundle) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UsageError(
            f"--bundle {bundle}: no {MANIFEST} there", "pass a directory `egpu-setup bundle` wrote"
        ) from exc
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{path}: not a bundle manifest ({exc})", "rebuild it with `egpu-setup bundle`"
        ) from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(
            f"{path}: schema {data.get('schema') if isinstance(data, dict) else None!r}, "
            f"expected {SCHEMA}",
            "rebuild the bundle with this version of egpu-setup",
        )
    for entry in data.get("files", []):
        rel = entry.get("path", "")
        if rel.startswith("/") or ".." in rel.split("/") or not rel:
            raise UsageError(f"{path}: file path {rel!r} leaves the bundle", "rebuild the bundle")
    return Manifest(path, data)


def verify_files(bundle: Path, manifest: Manifest, prefixes: Sequence[str]) -> int:
    """Check size and sha256 of every manifest file under `prefixes`; bytes checked.

    A mismatch is exit 1 before anything is installed: a wheel or .deb changed after `bundle`
    wrote it is exactly what --require-hashes and a local apt repository cannot catch later."""
    checked = 0
    bad: list[str] = []
    for rel, entry in manifest.files().items():
        if not any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes):
            continue
        real = Path(bundle) / rel
        try:
            size = real.stat().st_size
        except OSError:
            bad.append(f"{rel} is missing")
            continue
        if size != entry.get("size") or sha256_file(real) != entry.get("sha256"):
            bad.append(f"{rel} does not match its sha256 in {MANIFEST}")
            continue
        checked += size
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise EgpuSetupError(
            f"bundle {bundle}: {bad[0]}{more}; nothing was installed",
            "copy the bundle again from its source, or rebuild it with `egpu-setup bundle`",
        )
    return checked


def find_target(manifest: Manifest, python: str | None, distro: str | None) -> dict[str, Any]:
    """The manifest target for this machine (python None: driver only; distro None: torch only)."""
    for t in manifest.targets:
        if (python is None or t["python"] == python) and (distro is None or t["distro"] == distro):
            return t
    want = " on ".join(x for x in (f"Python {python}" if python else None, distro) if x)
    pys = " ".join(f"--python {p}" for p in ([python] if python else []))
    dis = f" --distro {distro}" if distro else ""
    raise UsageError(
        f"bundle {manifest.path.parent} has no target for {want}: "
        f"it holds {manifest.target_names()}",
        f"build one with `egpu-setup bundle ... {pys}{dis}`".replace("  ", " "),
    )


def repository_files(manifest: Manifest, repository: str) -> tuple[tuple[str, str], ...]:
    """(file name, sha256) of every file the manifest lists directly in `repository` (relative to
    the bundle, "debs/debian-12"): what the apt repository staged from it must hash to."""
    rel = repository.rstrip("/") + "/"
    out = []
    for path, entry in manifest.files().items():
        name = path[len(rel) :]
        if path.startswith(rel) and name and "/" not in name:
            out.append((name, str(entry.get("sha256", ""))))
    return tuple(sorted(out))
