"""`doctor --venv`: the torch build is read from the venv's own Python, for real."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, RunCli
from egpu_setup.doctor.torchcheck import parse_torch_info, probe_venv_torch
from egpu_setup.host.machine import LiveHost
from helpers.venvs import make_venv


def test_cpu_only_torch_is_found(cli: RunCli, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    venv = make_venv(tmp_path / "v", with_torch=True)
    res = cli("doctor", "--json", "--venv", str(venv))
    ids = [f["id"] for f in json.loads(res.stdout)["findings"]]
    assert "torch-cpu-only-build" in ids


def test_venv_without_torch_is_a_clear_error(cli: RunCli, tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "v", with_torch=False)
    res = cli("doctor", "--venv", str(venv))
    assert res.returncode == 2
    assert res.stderr.startswith("error: cannot import torch in ")
    assert "hint: install torch there" in res.stderr and "Traceback" not in res.stderr


def test_missing_venv_and_conflicting_options(cli: RunCli, tmp_path: Path) -> None:
    res = cli("doctor", "--venv", str(tmp_path / "nope"))
    assert res.returncode == 2 and "does not exist" in res.stderr
    res = cli("doctor", "--venv", str(tmp_path), "--from", str(FIXTURES / "tb4-rtx4090-ubuntu2404"))
    assert res.returncode == 2 and res.stderr.startswith("error: --venv")


def _verify_saved_report(cli: RunCli, *target: str) -> Path:
    """Run the real `verify --device cpu --quick` and return the report it saved."""
    reports = Path(os.environ["EGPU_SETUP_STATE_DIR"]) / "reports"
    before = set(reports.glob("verify-*.json")) if reports.is_dir() else set()
    res = cli("verify", *target, "--device", "cpu", "--quick", "--json", timeout=300)
    assert res.stdout, res.stderr
    (path,) = set(reports.glob("verify-*.json")) - before
    saved = json.loads(path.read_text())
    # The saved copy also carries where it stands among the machine's reports (state/reports.py).
    assert isinstance(saved.pop("sequence"), int) and saved.pop("boot_id")
    assert saved == json.loads(res.stdout)
    return path


def test_doctor_reads_the_verify_report_it_points_to(cli: RunCli, tmp_path: Path) -> None:
    """`doctor --torch-info <state>/reports/verify-*.json`: the file its own hint names."""
    pytest.importorskip("torch")
    report = _verify_saved_report(cli, "--python", sys.executable)
    info = parse_torch_info(json.loads(report.read_text()), str(report))
    # The same facts as asking that Python's torch directly (the small form).
    probed = probe_venv_torch(LiveHost(), make_venv(tmp_path / "v", with_torch=True))
    assert (info.torch_version, info.cuda) == (probed.torch_version, probed.cuda)
    bundle = str(FIXTURES / "tb4-rtx4090-ubuntu2404")
    res = cli("doctor", "--json", "--from", bundle, "--torch-info", str(report))
    assert res.returncode == 1, res.stderr
    found = {f["id"]: f for f in json.loads(res.stdout)["findings"]}
    assert found["torch-cpu-only-build"]["severity"] == "error"
    assert any(info.torch_version in e for e in found["torch-cpu-only-build"]["evidence"])
    # The small form still works, and gives the same finding.
    small = tmp_path / "torch.json"
    small.write_text(json.dumps(probed.to_json()))
    res = cli("doctor", "--json", "--from", bundle, "--torch-info", str(small))
    assert res.returncode == 1 and "torch-cpu-only-build" in res.stdout, res.stderr


def test_verify_report_without_torch_is_a_clear_error(cli: RunCli, tmp_path: Path) -> None:
    report = _verify_saved_report(cli, "--venv", str(make_venv(tmp_path / "v", with_torch=False)))
    res = cli("doctor", "--torch-info", str(report))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(
        f"error: {report}: this verify report has no torch facts "
        "(torch did not import in the verified venv)"
    ), res.stderr
    assert "\nhint: " in res.stderr and "Traceback" not in res.stderr
