"""`doctor --venv`: the torch build is read from the venv's own Python, for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES


def make_venv(path: Path, *, with_torch: bool) -> Path:
    args = [sys.executable, "-m", "venv", "--without-pip", str(path)]
    if with_torch:
        args.insert(3, "--system-site-packages")
    subprocess.run(args, check=True, timeout=120)
    return path


def test_cpu_only_torch_is_found(cli, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    venv = make_venv(tmp_path / "v", with_torch=True)
    res = cli("doctor", "--json", "--venv", str(venv))
    ids = [f["id"] for f in json.loads(res.stdout)["findings"]]
    assert "torch-cpu-only-build" in ids


def test_venv_without_torch_is_a_clear_error(cli, tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "v", with_torch=False)
    res = cli("doctor", "--venv", str(venv))
    assert res.returncode == 2
    assert res.stderr.startswith("error: cannot import torch in ")
    assert "hint: install torch there" in res.stderr and "Traceback" not in res.stderr


def test_missing_venv_and_conflicting_options(cli, tmp_path: Path) -> None:
    res = cli("doctor", "--venv", str(tmp_path / "nope"))
    assert res.returncode == 2 and "does not exist" in res.stderr
    res = cli("doctor", "--venv", str(tmp_path), "--from", str(FIXTURES / "tb4-rtx4090-ubuntu2404"))
    assert res.returncode == 2 and res.stderr.startswith("error: --venv")
