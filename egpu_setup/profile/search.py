"""Finding profiles by name: the shipped ones, /etc/egpu-setup/profiles, the user's, or a path."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from egpu_setup.errors import UsageError

ENV_PATH = "EGPU_SETUP_PROFILE_PATH"


SYSTEM_DIR = Path("/etc/egpu-setup/profiles")


def as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _user_dir() -> Path:
    """The invoking user's profile directory (never searched as root: search_dirs)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "egpu-setup" / "profiles"


# The top-level profiles/ folder ships in the wheel under this package name (pyproject.toml,
# package-dir), apart from the loader package egpu_setup.profile.
SHIPPED_PACKAGE = "egpu_setup.profile_files"


def _package_dir() -> Path:
    from importlib.util import find_spec

    try:
        spec = find_spec(SHIPPED_PACKAGE)
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    # A source checkout that was not (re)installed since the package mapping was added.
    checkout = Path(__file__).resolve().parents[2] / "profiles"
    if (checkout / "__init__.py").is_file():
        return checkout
    raise UsageError(
        f"the shipped profiles ({SHIPPED_PACKAGE}) are missing from this installation",
        "reinstall egpu-setup",
    )


def search_dirs() -> list[tuple[str, Path]]:
    """(origin, directory) in lookup order; a later directory overrides an earlier one.

    EGPU_SETUP_PROFILE_PATH (os.pathsep-separated) replaces the system and user directories.
    As root (sudo) only the shipped and the system directories: a profile decides which
    enclosure is authorized and whether IOMMU protection is required, so a user's folder must
    not change what root installs by a name that also names a shipped profile. A user's profile
    is taken only when named by path, and then only from a tree root owns (document.py)."""
    dirs = [("package", _package_dir())]
    env = os.environ.get(ENV_PATH)
    if env is not None:
        dirs += [("custom", Path(p)) for p in env.split(os.pathsep) if p]
    elif as_root():
        dirs += [("system", SYSTEM_DIR)]
    else:
        dirs += [("system", SYSTEM_DIR), ("user", _user_dir())]
    return dirs


@dataclass(frozen=True)
class ProfileEntry:
    """A profile file found by name in the search path."""

    name: str
    path: Path
    origin: str
    shadows: tuple[str, ...] = ()  # files of the same name it overrides


def available() -> dict[str, ProfileEntry]:
    """Every profile name in the search path, mapped to the file that wins."""
    found: dict[str, ProfileEntry] = {}
    for origin, directory in search_dirs():
        try:
            files = sorted(directory.glob("*.yaml"))
        except OSError:
            continue
        for path in files:
            name = path.stem
            if not NAME_RE.match(name) or not path.is_file():
                continue
            before = found.get(name)
            shadows = (*before.shadows, str(before.path)) if before else ()
            found[name] = ProfileEntry(name, path, origin, shadows)
    return found


NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")  # \Z: "$" would let a final "\n" in


GENERIC = "generic-nvidia"  # profiles/generic-nvidia.yaml: any NVIDIA card (no device ids)


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.endswith((".yaml", ".yml")) or text.startswith(".")


def locate(name_or_path: str) -> tuple[Path, str]:
    """The file a profile argument means, and its origin; UsageError when there is none."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise UsageError(
                f"profile file not found: {name_or_path}",
                "check the path, or pass a profile name (see `egpu-setup profiles list`)",
            )
        return path, "file"
    entries = available()
    entry = entries.get(name_or_path)
    if entry is None:
        close = difflib.get_close_matches(name_or_path.lower(), list(entries), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see `egpu-setup profiles list`"
        if GENERIC in entries and GENERIC not in close:
            # a card without a profile of its own is served by the generic one, with the
            # expectations taken from the GPU table for the detected card
            hint += f"; a card with no profile of its own: --profile {GENERIC}"
        if as_root() and os.environ.get(ENV_PATH) is None:
            hint += (
                f"; as root only the shipped profiles and {SYSTEM_DIR} are looked up by name: "
                "pass a profile of yours by its path, from a folder root owns"
            )
        raise UsageError(f"unknown profile {name_or_path!r}", hint)
    return entry.path, entry.origin
