"""Wheels for another machine: platform tags, markers, metadata, the dependency closure, hashes.

Pure over files: which wheels a target needs is decided from their METADATA alone, evaluated in
the target's environment (PEP 508 markers), never by asking pip.
"""

from __future__ import annotations

import email.parser
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from egpu_setup.bundle.targets import Target
from egpu_setup.errors import EgpuSetupError

if TYPE_CHECKING:
    from packaging.requirements import Requirement

_OLDEST_MANYLINUX = 17  # manylinux2014 == manylinux_2_17 (PEP 600)
# A target whose glibc the data does not know gets the wheels torch 2.7 and newer need (glibc 2.28).
_UNKNOWN_GLIBC_MINOR = 28


ARCH = "x86_64"  # eGPU laptops; an aarch64 bundle is not planned yet


# The environment a requirement marker is evaluated in for a target (PEP 508).
_MARKER_ENV = {
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "platform_machine": ARCH,
}


def glibc_minor(distro: str) -> int:
    """X of the glibc 2.X of a target ("debian-12" -> 36), from compat/glibc.py's one table
    (distros.yaml): it decides which manylinux wheels run there (PEP 600: manylinux_2_X needs
    glibc >= 2.X)."""
    from egpu_setup.compat.glibc import distro_glibc, glibc_key

    dist_id, _, version = distro.partition("-")
    found = distro_glibc(dist_id, version)
    key = glibc_key(found[0]) if found else None
    return key[1] if key and key[0] == 2 else _UNKNOWN_GLIBC_MINOR


def platform_tags(distro: str) -> list[str]:
    """manylinux tags a wheel may carry to run on `distro` (newest first)."""
    top = glibc_minor(distro)
    tags = [f"manylinux_2_{minor}_{ARCH}" for minor in range(top, _OLDEST_MANYLINUX - 1, -1)]
    return [*tags, f"manylinux2014_{ARCH}"]


def marker_env(python: str) -> dict[str, str]:
    return {**_MARKER_ENV, "python_version": python, "python_full_version": f"{python}.0"}


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # as in METADATA
    version: str
    requires: tuple[str, ...]  # Requires-Dist lines


def read_wheel(path: Path) -> Wheel:
    """Name, version and Requires-Dist of a wheel, from its *.dist-info/METADATA."""
    try:
        with zipfile.ZipFile(path) as zf:
            meta_name = next(
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            )
            text = zf.read(meta_name).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile, StopIteration) as exc:
        raise EgpuSetupError(
            f"{path} is not a readable wheel: {exc}", "delete it and run `egpu-setup bundle` again"
        ) from exc
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    return Wheel(
        path, msg["Name"] or "", msg["Version"] or "", tuple(msg.get_all("Requires-Dist") or ())
    )


def wheel_pool(directory: Path) -> dict[str, list[Wheel]]:
    pool: dict[str, list[Wheel]] = {}
    for path in sorted(directory.glob("*.whl")):
        whl = read_wheel(path)
        pool.setdefault(canonicalize_name(whl.name), []).append(whl)
    return pool


def direct_requirements(wheel: Wheel, python: str, extras: Iterable[str] = ()) -> list[Requirement]:
    """The Requires-Dist entries of `wheel` that apply on the target (markers evaluated there)."""
    from packaging.requirements import Requirement

    env = marker_env(python)
    out = []
    for text in wheel.requires:
        req = Requirement(text)
        if req.marker is None or any(
            req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)
        ):
            out.append(req)
    return out


def closure(pool: dict[str, list[Wheel]], roots: Sequence[str], python: str) -> list[Wheel]:
    """Every wheel needed to install `roots` on the target, chosen from `pool`; an incomplete
    pool (pip resolved differently, a file went missing) is an error naming what is missing."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    chosen: dict[str, Wheel] = {}
    queue = [Requirement(r) for r in roots]
    while queue:
        req = queue.pop(0)
        key = canonicalize_name(req.name)
        if key in chosen:
            if not req.specifier.contains(chosen[key].version, prereleases=True):
                raise EgpuSetupError(
                    f"the wheels do not fit together: {req} but {chosen[key].name} "
                    f"{chosen[key].version} was chosen",
                    "pin compatible versions with --torch (torchvision follows torch releases)",
                )
            continue
        fits = [w for w in pool.get(key, []) if req.specifier.contains(w.version, prereleases=True)]
        if not fits:
            raise EgpuSetupError(
                f"no wheel for {req} in the wheelhouse (Python {python})",
                "run `egpu-setup bundle` again with network; check that the index has it",
            )
        best = max(fits, key=lambda w: Version(w.version))
        chosen[key] = best
        queue += direct_requirements(best, python, req.extras)
    return sorted(chosen.values(), key=lambda w: canonicalize_name(w.name))


def requirements_text(wheels: Sequence[Wheel], hashes: dict[str, str], header: str) -> str:
    lines = [header]
    for w in wheels:
        lines.append(f"{w.name}=={w.version} --hash=sha256:{hashes[w.path.name]}")
    return "\n".join(lines) + "\n"


def manylinux_minor(tag: str) -> int:
    """X of a manylinux_2_X tag (compat/glibc.py reads the tag)."""
    from egpu_setup.compat.glibc import glibc_key, tag_glibc

    key = glibc_key(tag_glibc(tag))
    return key[1] if key else _OLDEST_MANYLINUX


def matching(pool: dict[str, list[Wheel]], text: str) -> list[Wheel]:
    from packaging.requirements import Requirement

    req = Requirement(text)
    return [
        w
        for w in pool.get(canonicalize_name(req.name), [])
        if req.specifier.contains(w.version, prereleases=True)
    ]


def root_names(group: Sequence[Target]) -> set[str]:
    from packaging.requirements import Requirement

    return {
        canonicalize_name(Requirement(r).name)
        for t in group
        for r in t.resolution.torch.requirements
    }


def without_marker(req: Requirement) -> str:
    """The requirement as pip must see it for another interpreter: markers already evaluated."""
    from packaging.requirements import Requirement

    copy = Requirement(str(req))
    copy.marker = None
    return str(copy)
