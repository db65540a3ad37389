"""ruff and mypy are part of the suite: style or type drift fails the same command as a broken
test (mypy's settings live in pyproject.toml: the package, scripts, benchmarks and these tests,
every function typed)."""

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


def test_mypy_is_clean() -> None:
    mypy = shutil.which("mypy")
    if mypy is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    res = subprocess.run([mypy], cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no issues found" in res.stdout


@pytest.mark.parametrize("script", ["scripts/install.sh", "scripts/gpu_verify.sh", ".ci/run"])
def test_repo_scripts_pass_shellcheck(script: str) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install -e '.[test]')")
    res = subprocess.run(
        [shellcheck, "-f", "gcc", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_merge_conflict_markers_are_committed() -> None:
    # A conflict inside a docstring or a Markdown table still imports and renders, so nothing
    # else fails on it (one sat in commands/__init__.py through a whole CI run).
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    marked = []
    for name in filter(None, files):
        path = REPO / name.decode()
        if not path.is_file() or path.is_symlink():
            continue
        for n, line in enumerate(path.read_bytes().split(b"\n"), 1):
            if line.startswith((b"<<<<<<< ", b">>>>>>> ")):
                marked.append(f"{name.decode()}:{n}")
    assert not marked, marked
