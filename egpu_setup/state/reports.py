"""Reports under <state>/reports/: one JSON file per install or verify, for `egpu-setup report`."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

REPORTS = "reports"  # what a fleet collects from each machine (fleet/report.py, the Ansible role)
BUILD_REPORTS = "build-reports"  # a lab image's build: kept apart, not any machine's own
_SAVED_NAME = re.compile(r"(?P<base>.+?)(?:-(?P<n>\d+))?\.json")


def save_report(
    state_dir: Path,
    kind: str,
    data: dict[str, Any],
    when: float,
    folder: str = REPORTS,
    *,
    anchor: Path = Path("/"),
) -> Path:
    """Write <state>/<folder>/<kind>-<UTC time>.json atomically (never over an older one),
    walking from `anchor` (the image root under `--root`) with no link followed."""
    from egpu_setup.state.atomic import atomic_write
    from egpu_setup.state.paths import refuse_link

    refuse_link(state_dir)
    reports = refuse_link(state_dir / folder)  # a planted link must not carry them away
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    path = reports / f"{kind}-{stamp}.json"
    n = 1
    while os.path.lexists(path):
        n += 1
        path = reports / f"{kind}-{stamp}-{n}.json"
    atomic_write(path, (json.dumps(data, indent=2) + "\n").encode(), 0o644, anchor=anchor)
    return path


def saved_order(name: str) -> tuple[str, int]:
    """Sort key of a report's file name in the order save_report wrote them: within one second,
    `<kind>-<stamp>.json`, then `-2.json`, `-3.json` (as strings "-2" sorts before ".json")."""
    m = _SAVED_NAME.fullmatch(name)
    if m is None:
        return name, 0
    return m["base"], int(m["n"] or 1)
