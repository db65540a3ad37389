"""ruff is part of the suite: style drift fails the same command as a broken test."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO


def test_ruff_check_is_clean() -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    res = subprocess.run(
        [ruff, "check", "."], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("script", ["scripts/install.sh", "scripts/gpu_verify.sh", ".ci/run"])
def test_repo_scripts_pass_shellcheck(script: str) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install -e '.[test]')")
    res = subprocess.run(
        [shellcheck, "-f", "gcc", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
