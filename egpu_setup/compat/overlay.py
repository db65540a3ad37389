"""The overlay the last good `matrix update` cached: where it lives, and reading it back.

Anything unreadable or malformed is ignored with a warning: the shipped snapshot stays in force.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from egpu_setup.log import get_logger

log = get_logger("egpu_setup.matrix")

STATE_ENV = "EGPU_SETUP_STATE_DIR"
DEFAULT_STATE_DIR = "/var/lib/egpu-setup"
OVERLAY_SCHEMA = "egpu-setup/torch-index/1"
OVERLAY_NAME = "matrix/torch-index.json"


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where egpu-setup keeps state: EGPU_SETUP_STATE_DIR, else /var/lib/egpu-setup."""
    return Path(explicit or os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR)


def overlay_path(state: str | os.PathLike[str] | None = None) -> Path:
    return state_dir(state) / OVERLAY_NAME


def load_overlay(state: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The overlay written by the last good `matrix update`, or None (absent or unreadable)."""
    path = overlay_path(state)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s (%s); using the shipped matrix", path, exc)
        return None
    if (
        not isinstance(data, dict)
        or data.get("schema") != OVERLAY_SCHEMA
        or not _valid_releases(data.get("releases"))
    ):
        log.warning("ignoring %s: not an egpu-setup index overlay; using the shipped matrix", path)
        return None
    return data


def _valid_releases(releases: Any) -> bool:
    """The overlay's {version: {variant: [python, ...]}} shape, checked before anything uses it."""
    if not isinstance(releases, dict):
        return False
    for version, variants in releases.items():
        if not re.fullmatch(r"\d+\.\d+\.\d+", str(version)) or not isinstance(variants, dict):
            return False
        for variant, pythons in variants.items():
            if not re.fullmatch(r"cpu|cu\d{3}", str(variant)) or not isinstance(pythons, list):
                return False
            if not all(isinstance(p, str) and re.fullmatch(r"3\.\d{1,2}", p) for p in pythons):
                return False
    return True
