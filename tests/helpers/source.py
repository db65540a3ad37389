"""A copy of this checkout that builds a wheel, for tests that must not write build/ into it."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
# What `pip wheel` needs: the packages, the template and profile folders shipped as package
# data, the man page shipped as a data file, and the metadata files pyproject.toml names.
TREES = ("egpu_setup", "templates", "profiles")
FILES = ("pyproject.toml", "README.md", "LICENSE", "docs/egpu-setup.1")


def copy_buildable_source(dest: Path) -> Path:
    """Copy what building egpu-setup's wheel needs into `dest` (created) and return it."""
    for name in TREES:
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in FILES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, dest / name)
    return dest
