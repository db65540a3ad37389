"""Shared test setup: state goes to a temp dir, and recorded hosts are easy to reach."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "hosts"


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """No test writes to /var/lib/egpu-setup or reads a developer's own profiles."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))
    yield


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run the real command line in a child process (errors are printed by cli.main)."""
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def cli():
    return run_cli
