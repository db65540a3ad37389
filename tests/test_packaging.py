"""What a user gets from `pip install .`: every module, template, profile and data file."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return next(out.glob("egpu_setup-*.whl"))


def test_wheel_ships_every_module_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(REPO).as_posix() for p in (REPO / "egpu_setup").rglob("*.py")}
    expected |= {f"egpu_setup/data/{p.name}" for p in (REPO / "egpu_setup/data").glob("*.yaml")}
    expected |= {
        "egpu_setup/templates/" + p.relative_to(REPO / "templates").as_posix()
        for p in (REPO / "templates").rglob("*.j2")
    }
    expected |= {f"egpu_setup/profile_files/{p.name}" for p in (REPO / "profiles").glob("*.yaml")}
    missing = sorted(n for n in expected if "__pycache__" not in n and n not in names)
    assert missing == []
    # The loader module and the shipped profiles must not collide (a package named like the
    # module would shadow it at import time).
    assert "egpu_setup/profiles.py" in names and "egpu_setup/profiles/__init__.py" not in names


@pytest.mark.slow
def test_clean_venv_runs_the_quick_start(wheel: Path, tmp_path: Path) -> None:
    """The README's first command, from a wheel in a fresh venv, run from an unrelated directory."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    res = subprocess.run(
        [str(venv / "bin/egpu-setup"), "install", "--profile", "rtx4090", "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "torch" in res.stdout
