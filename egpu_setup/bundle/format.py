"""The bundle format (manifest schema egpu-setup/bundle/1), as `install --bundle` reads it.

manifest.json                     targets, every file with sha256 and size, inputs per part
profile.yaml                      the profile it was resolved for
wheels/py3.11/*.whl               torch (+ extras) and their dependencies, one pool per Python
requirements-py3.11-debian-12.txt `name==version --hash=sha256:...` per target
debs/debian-12/*.deb + Packages   the driver's packages: a flat local apt repository
tool/*.whl                        egpu-setup's own wheel and its dependencies (Ansible's
                                  `bundle` source installs from here, --no-index)
manifest.sha256                   the manifest's sha256 (`sha256sum` format), for the admin

Nothing in a bundle is trusted until manifest.json hashes to the pin the admin carried over from
the machine that built it (`install --bundle DIR --bundle-sha256 HEX`, or EGPU_SETUP_BUNDLE_SHA256):
every other file is then trusted only through its sha256 in that manifest. A pin read from the
bundle itself proves nothing: whoever could swap a wheel could rewrite manifest.sha256 too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.errors import EgpuSetupError, UsageError

SCHEMA = "egpu-setup/bundle/1"


MANIFEST = "manifest.json"


PROFILE_FILE = "profile.yaml"


def sha256_file(path: Path, base: Path | None = None) -> str:
    """The sha256 of the regular file `path`; with `base` (a bundle), opened by open_beneath
    from it, no link followed on the way. Without, `path` is in a private directory of ours."""
    from egpu_setup.host.machine import open_beneath

    h = hashlib.sha256()
    fd = open_beneath(base, path.relative_to(base)) if base is not None else None
    with os.fdopen(fd, "rb") if fd is not None else open(path, "rb", opener=_nofollow) as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            h.update(chunk)
    return h.hexdigest()


PIN_FILE = "manifest.sha256"  # `sha256sum` format; the admin copies it from the build machine
PIN_ENV = "EGPU_SETUP_BUNDLE_SHA256"
MAX_MANIFEST = 64 * 1024 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


@dataclass(frozen=True)
class Manifest:
    path: Path
    data: dict[str, Any]
    sha256: str = ""  # of the bytes `data` was parsed from: what a pin is compared with

    @property
    def targets(self) -> list[dict[str, Any]]:
        return list(self.data.get("targets", []))

    def target_names(self) -> str:
        return ", ".join(t["name"] for t in self.targets) or "none"

    def files(self) -> dict[str, dict[str, Any]]:
        return {f["path"]: f for f in self.data.get("files", [])}


def check_pin(pin: str) -> str:
    """A manifest pin as `bundle` prints it (64 hex digits, any case); UsageError otherwise."""
    value = pin.strip().lower()
    if not _HEX64.fullmatch(value):
        raise UsageError(
            f"--bundle-sha256 {pin!r}: expected the 64 hex digits `egpu-setup bundle` printed",
            f"copy the value from {PIN_FILE} on the machine that built the bundle",
        )
    return value


def read_bundle_file(bundle: Path, rel: str, limit: int = MAX_MANIFEST) -> bytes:
    """The bytes of `rel` in the bundle, never through a link (none between the bundle and it,
    nor it), nor from anything but a regular file; UsageError naming what is wrong."""
    from egpu_setup.host.machine import read_beneath, refuse_links_below

    path = refuse_links_below(bundle, bundle / rel, leaf=True)  # names the link, if one is there
    data = read_beneath(bundle, rel, limit + 1)
    if data is None:
        raise UsageError(
            f"{path}: missing, unreadable or not a regular file",
            "copy the bundle again from its source, or rebuild it with `egpu-setup bundle`",
        )
    if len(data) > limit:
        raise UsageError(f"{path}: larger than {limit >> 20} MiB", "rebuild the bundle")
    return data


@contextlib.contextmanager
def pinned_copy(bundle: Path, manifest: Manifest, rel: str) -> Iterator[Path]:
    """A private copy of `rel`, made from bytes that hash to its sha256 in `manifest`: what is
    read from it is what was checked, whatever happens to the bundle meanwhile."""
    data = read_bundle_file(bundle, rel, 16 * 1024 * 1024)
    if hashlib.sha256(data).hexdigest() != manifest.files().get(rel, {}).get("sha256"):
        raise EgpuSetupError(
            f"bundle {bundle}: {rel} does not match its sha256 in {MANIFEST}; nothing was "
            "installed",
            "copy the bundle again from its source, or rebuild it with `egpu-setup bundle`",
        )
    with tempfile.TemporaryDirectory(prefix="egpu-setup-bundle-") as tmp:
        copy = Path(tmp) / Path(rel).name
        copy.write_bytes(data)
        yield copy


def load_manifest(bundle: Path, pin: str | None = None) -> Manifest:
    """The bundle's manifest, validated; UsageError (exit 2) when DIR is not a bundle.

    With `pin` (the sha256 `bundle` printed), the bytes must hash to it before anything in them
    is believed: a manifest re-hashed after a wheel was swapped is refused (exit 1)."""
    path = Path(bundle) / MANIFEST
    if not os.path.lexists(path):
        raise UsageError(
            f"--bundle {bundle}: no {MANIFEST} there", "pass a directory `egpu-setup bundle` wrote"
        )
    raw = read_bundle_file(Path(bundle), MANIFEST)
    digest = hashlib.sha256(raw).hexdigest()
    if pin is not None and digest != pin:
        raise EgpuSetupError(
            f"bundle {bundle}: {MANIFEST} has sha256 {digest}, not the pinned {pin}: it is not "
            "the bundle that was built; nothing was installed",
            "copy the bundle again from the machine that built it, and its pin from there",
        )
    try:
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as exc:
        raise UsageError(
            f"{path}: not a bundle manifest ({exc})", "rebuild it with `egpu-setup bundle`"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(
            f"{path}: schema {data.get('schema') if isinstance(data, dict) else None!r}, "
            f"expected {SCHEMA}",
            "rebuild the bundle with this version of egpu-setup",
        )
    _check_shape(data, path)
    return Manifest(path, data, digest)


def _check_shape(data: dict[str, Any], path: Path) -> None:
    """UsageError naming the first value `install --bundle` would use that has the wrong shape."""

    def bad(key: str, what: str) -> UsageError:
        return UsageError(f"{path}: {key}: {what}", "rebuild the bundle with `egpu-setup bundle`")

    files = data.get("files", [])
    if not isinstance(files, list):
        raise bad("files", "expected a list")
    for i, entry in enumerate(files):
        if not isinstance(entry, dict):
            raise bad(f"files[{i}]", "expected an object")
        rel = entry.get("path")
        if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/"):
            raise bad(f"files[{i}].path", f"{rel!r} leaves the bundle")
        if not isinstance(entry.get("sha256"), str) or not _HEX64.fullmatch(entry["sha256"]):
            raise bad(f"files[{i}].sha256", "not a sha256")
        if not isinstance(entry.get("size"), int) or isinstance(entry["size"], bool):
            raise bad(f"files[{i}].size", "not a size in bytes")
    targets = data.get("targets", [])
    if not isinstance(targets, list):
        raise bad("targets", "expected a list")
    shapes = {
        "torch": {
            "version": str,
            "variant": str,
            "index_url": str,
            "requirements": list,
            "wheels": str,
            "requirements_file": str,
        },
        "driver": {"packages": list, "repository": str},
    }
    for i, t in enumerate(targets):
        if not isinstance(t, dict):
            raise bad(f"targets[{i}]", "expected an object")
        for key in ("name", "python", "distro"):
            if not isinstance(t.get(key), str):
                raise bad(f"targets[{i}].{key}", "expected a string")
        for part, keys in shapes.items():
            value = t.get(part)
            if value is None:
                continue
            if not isinstance(value, dict):
                raise bad(f"targets[{i}].{part}", "expected an object or null")
            for key, kind in keys.items():
                if not isinstance(value.get(key), kind):
                    raise bad(f"targets[{i}].{part}.{key}", f"expected a {kind.__name__}")
            for key in ("requirements", "packages"):
                if key in keys and not all(isinstance(x, str) for x in value[key]):
                    raise bad(f"targets[{i}].{part}.{key}", "expected a list of strings")
            for key in ("wheels", "requirements_file", "repository"):
                if key not in keys:
                    continue
                rel = str(value[key])
                if rel.startswith("/") or ".." in rel.split("/") or not rel:
                    raise bad(f"targets[{i}].{part}.{key}", f"{rel!r} leaves the bundle")


def verify_files(bundle: Path, manifest: Manifest, prefixes: Sequence[str]) -> int:
    """Check size and sha256 of every manifest file under `prefixes`; bytes checked.

    A mismatch is exit 1 before anything is installed: a wheel or .deb changed after `bundle`
    wrote it is exactly what --require-hashes and a local apt repository cannot catch later.
    Files are read only from inside the bundle: a link there (to a host file) is refused."""
    from egpu_setup.host.machine import refuse_links_below

    checked = 0
    bad: list[str] = []
    for rel, entry in manifest.files().items():
        if not any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes):
            continue
        real = refuse_links_below(Path(bundle), Path(bundle) / rel, leaf=True)
        try:
            st = os.lstat(real)
        except OSError:
            bad.append(f"{rel} is missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            bad.append(f"{rel} is not a regular file")
            continue
        if st.st_size != entry.get("size") or sha256_file(real, Path(bundle)) != entry.get(
            "sha256"
        ):
            bad.append(f"{rel} does not match its sha256 in {MANIFEST}")
            continue
        checked += st.st_size
    from egpu_setup.host.machine import listdir_beneath

    listed = manifest.files()
    for prefix in prefixes:
        folder = Path(bundle) / prefix
        if not folder.is_dir() or folder.is_symlink():
            continue
        # pip picks any wheel a --find-links folder holds: a file the manifest does not list
        # (a planted wheel with a .pth) is refused, not ignored
        for name in listdir_beneath(Path(bundle), prefix):
            if f"{prefix.rstrip('/')}/{name}" not in listed:
                bad.append(f"{prefix.rstrip('/')}/{name} is not listed in {MANIFEST}")
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
