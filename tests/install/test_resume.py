"""`egpu-setup resume-check` over a recorded laptop's sysfs copied into a root (--root DIR):
the eGPU back, gone (one rescan, written to the root's /sys/bus/pci/rescan), its enclosure
de-authorized, a damaged record, a link planted on the way to the rescan attribute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES
from helpers.cli_runner import invoke

TB4 = FIXTURES / "tb4-rtx4090-ubuntu2404"  # RTX 4090 at 0000:0a:00.0 behind Thunderbolt 0-1
GPU = "0000:0a:00.0"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("EGPU_SETUP_STATE_DIR")  # the image's own state, under it
    root = tmp_path / "root"
    shutil.copytree(TB4 / "root", root, symlinks=True)
    (root / "sys/bus/pci/rescan").write_text("")  # the attribute, as the kernel has it
    return root


def _check(root: Path) -> tuple[int, dict[str, Any]]:
    res = invoke("resume-check", "--root", str(root), "--json")
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def _before_sleep(root: Path) -> dict[str, Any]:
    res = invoke("resume-check", "--root", str(root), "--before-sleep", "--json")
    assert res.returncode == 0, res.stderr
    result: dict[str, Any] = json.loads(res.stdout)
    return result


def test_before_sleep_records_the_egpu_and_its_enclosure(root: Path) -> None:
    record = _before_sleep(root)
    assert record == {"gpu": GPU, "enclosure": "0-1", "cuda": []}
    kept = root / "run/egpu-setup/sleep.json"
    assert json.loads(kept.read_text()) == record
    assert kept.stat().st_mode & 0o777 == 0o600


def test_egpu_back_after_resume_needs_no_rescan(root: Path) -> None:
    _before_sleep(root)
    rc, out = _check(root)
    assert (rc, out["ok"], out["rescanned"], out["findings"]) == (0, True, False, [])
    assert (out["present"], out["driver"], out["authorized"]) == (True, "nvidia", True)
    assert out["schema"] == "egpu-setup/resume/1"
    assert (root / "sys/bus/pci/rescan").read_text() == ""
    assert json.loads((root / "var/lib/egpu-setup/resume.json").read_text()) == out


def test_egpu_gone_gets_one_rescan_then_a_finding(root: Path) -> None:
    _before_sleep(root)
    (root / f"sys/bus/pci/devices/{GPU}").unlink()  # what a GPU the resume lost looks like
    rc, out = _check(root)
    assert (rc, out["ok"], out["rescanned"], out["present"]) == (1, False, True, False)
    assert (root / "sys/bus/pci/rescan").read_text() == "1\n"
    (finding,) = out["findings"]
    assert finding["id"] == "gpu-lost-after-resume"
    assert finding["evidence"] == [f"/sys/bus/pci/devices/{GPU}: absent"]
    assert "rescan did not bring it back" in finding["summary"]


def test_an_unbound_gpu_is_not_back(root: Path) -> None:
    _before_sleep(root)
    driver = root / f"sys/bus/pci/devices/{GPU}/driver"
    assert driver.is_symlink()
    driver.unlink()
    rc, out = _check(root)
    assert (rc, out["driver"], out["rescanned"]) == (1, None, True)
    assert out["findings"][0]["evidence"] == [f"/sys/bus/pci/devices/{GPU}/driver: no driver bound"]


def test_a_deauthorized_enclosure_is_named_and_not_rescanned(root: Path) -> None:
    _before_sleep(root)
    (root / "sys/bus/thunderbolt/devices/0-1/authorized").write_text("0\n")
    (root / f"sys/bus/pci/devices/{GPU}").unlink()  # no tunnel, no GPU
    rc, out = _check(root)
    assert (rc, out["authorized"], out["rescanned"]) == (1, False, False)
    assert [f["id"] for f in out["findings"]] == [
        "thunderbolt-not-authorized",
        "gpu-lost-after-resume",
    ]
    assert (root / "sys/bus/pci/rescan").read_text() == ""


def test_no_record_detects_the_egpu_now(root: Path) -> None:
    rc, out = _check(root)
    assert (rc, out["gpu"], out["enclosure"]) == (0, GPU, "0-1")


def test_a_damaged_record_is_refused_and_nothing_is_kept(root: Path) -> None:
    record = root / "run/egpu-setup/sleep.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"gpu": "../../etc/passwd", "enclosure": null, "cuda": []}')
    res = invoke("resume-check", "--root", str(root))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and "\nhint: " in res.stderr
    assert "Traceback" not in res.stderr
    assert not (root / "var/lib/egpu-setup/resume.json").exists()
    assert (root / "sys/bus/pci/rescan").read_text() == ""


def test_a_link_on_the_way_to_rescan_stays_in_the_root(root: Path, tmp_path: Path) -> None:
    """The rescan write resolves /sys/bus/pci inside the root and walks it one directory
    descriptor at a time (O_NOFOLLOW): a link planted there to a folder outside never reaches
    it; the write fails (error and hint, exit 1) and the outside file is not written."""
    _before_sleep(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rescan").write_text("untouched\n")
    (root / f"sys/bus/pci/devices/{GPU}").unlink()
    pci = root / "sys/bus/pci"
    (outside / "devices").symlink_to(pci / "devices")  # keep the devices readable
    shutil.move(str(pci / "devices"), str(tmp_path / "devices"))
    shutil.rmtree(pci)
    pci.symlink_to(outside)
    res = invoke("resume-check", "--root", str(root))
    assert res.returncode == 1, res.stderr
    assert "error: cannot write 1 to /sys/bus/pci/rescan" in res.stderr
    assert "\nhint: " in res.stderr and "Traceback" not in res.stderr
    assert (outside / "rescan").read_text() == "untouched\n"
