"""Shared test setup: state goes to a temp dir, and recorded hosts are easy to reach."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "hosts"


def pytest_configure(config: pytest.Config) -> None:
    """In an unpacked sdist, which cannot carry symlinks, rebuild the recorded sysfs trees first.

    A git checkout has them committed (a test checks they equal the generator's output)."""
    if hasattr(config, "workerinput"):
        return  # a pytest-xdist worker: the controller has done it
    if FIXTURES.is_dir() and not (FIXTURES / "tb3-rtx3090-ubuntu2204" / "root").is_dir():
        subprocess.run([sys.executable, str(FIXTURES.parent / "build_hosts.py")], check=True)


# pytest-xdist hands out whole files (--dist loadfile) in the order they were collected. The
# lab-image file alone runs about 9 minutes and is collected 64th of 80 (root files after the
# folders); started first, it overlaps the rest of the suite instead of risking a lone tail.
LONGEST_FIRST = ("test_image_boot.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: order otherwise kept


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


@pytest.fixture
def sentinel(tmp_path: Path):
    """Files outside the target that a hostile input points at (helpers/sentinel.py)."""
    from helpers.sentinel import Sentinel

    return Sentinel(tmp_path / "outside")


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty image root whose state lives inside it (not in the test's state dir)."""
    monkeypatch.delenv("EGPU_SETUP_STATE_DIR")
    img = tmp_path / "img"
    img.mkdir()
    return img
