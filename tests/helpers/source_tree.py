"""A copy of this checkout holding what building egpu-setup's wheel reads, and nothing else.

Tests that build or install the project from a copy (the Ansible role's wheel, the Vagrant guest
script) take it from here, so every file pyproject.toml names (the man page in data-files, the
license file) comes along and the shared tree never gets a build/ folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREES = ("egpu_setup", "templates", "profiles")
FILES = ("pyproject.toml", "README.md", "LICENSE", "docs/egpu-setup.1")


def copy_source(dest: Path) -> Path:
    """Copy the packaged sources of this checkout to `dest` (created); return `dest`."""
    for name in TREES:
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in FILES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, dest / name)
    return dest
