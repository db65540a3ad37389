"""The dry run says how much disk space the plan takes, where: the driver's packages in the apt
cache, torch in its venv (a recording's own folder is not the machine's disk: its free space
is unknown, never guessed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from egpu_setup.install.preflight import (
    APT_CACHE,
    DRIVER_BYTES,
    TORCH_CUDA_BYTES,
    TORCH_CUDA_WHEELS,
)

HOST = Path(__file__).parents[1] / "fixtures" / "hosts" / "fresh-debian12-no-venv"
VENV = "/opt/egpu-setup/venv"


def _dry_run(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", "install", "--profile", "rtx4090", "--dry-run",
         "--from", str(HOST), *extra],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_dry_run_shows_the_space_the_plan_needs() -> None:
    res = _dry_run()
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("Disk space:")]
    assert lines == [
        f"Disk space: about 2.0 GiB in {APT_CACHE} (free space unknown)",
        f"Disk space: about 11.5 GiB in {VENV} and {VENV}/.egpu-setup-tmp (free space unknown)",
    ]
    data = json.loads(_dry_run("--json").stdout)
    assert data["space_needed"] == [
        {"paths": [APT_CACHE], "bytes": DRIVER_BYTES, "free_bytes": None},
        {
            "paths": [VENV, f"{VENV}/.egpu-setup-tmp"],
            "bytes": TORCH_CUDA_BYTES + TORCH_CUDA_WHEELS,
            "free_bytes": None,
        },
    ]
