"""Every real install leaves a report that `egpu-setup report` reads; odd hosts are refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import FIXTURES
from helpers.cli_runner import invoke

TB4 = str(FIXTURES / "tb4-rtx4090-ubuntu2404")


def test_config_install_into_an_image_writes_a_report(tmp_path: Path) -> None:
    img = tmp_path / "img"
    img.mkdir()
    state = tmp_path / "state"
    env = {"EGPU_SETUP_STATE_DIR": str(state)}
    args: tuple[str, ...] = ("install", "--profile", "rtx4090", "--only", "config")
    args += ("--root", str(img))
    args += ("--from", TB4, "--yes")
    res = invoke(*args, env=env)
    assert res.returncode == 0, res.stderr
    # an image's build report is not any machine's own: kept apart from reports/, which a
    # fleet collects from every machine made from the image
    assert not (state / "reports").exists()
    (report,) = (state / "build-reports").glob("install-*.json")
    data = json.loads(report.read_text())
    assert (
        data["schema"] == "egpu-setup/install/1" and data["ok"] is True and data["exit_code"] == 0
    )
    assert data["changed"] == len(data["steps"]) > 0
    assert data["host"]["gpu"] == {"name": "GeForce RTX 4090", "pci_address": "0000:0a:00.0"}
    assert data["host"]["connection"] == "thunderbolt" and data["host"]["link"]["width"] == 4
    table = invoke("report", "--json", str(state / "build-reports"))
    assert table.returncode == 0, table.stderr
    assert "GeForce RTX 4090" in table.stdout
    # Without bolt in the image, the enclosure is authorized by its UUID alone, never blanket.
    rule = (img / "etc/udev/rules.d/61-egpu-setup-tb-authorize.rules").read_text()
    assert 'ATTR{unique_id}=="00e8d1a4-3c2b-0e01-ffff-ffffffffffff"' in rule
    # a second run finds nothing to do and saves its own report of that (the day
    # after, a fleet report shows the run)
    time.sleep(1.1)  # reports are named by the second
    again = invoke(*args, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("Nothing to do: this machine already matches the profile.")
    reports = sorted((state / "build-reports").glob("install-*.json"))
    assert len(reports) == 2
    newest = json.loads(reports[-1].read_text())
    assert newest["schema"] == "egpu-setup/install/1" and newest["changed"] == 0
    assert newest["ok"] is True and newest["exit_code"] == 0 and newest["steps"] == []


def test_a_failed_install_is_reported_too(tmp_path: Path) -> None:
    img = tmp_path / "img"
    (img / "etc/udev/rules.d").mkdir(parents=True)
    # A file of the user's where ours goes: a conflict, so the run stops before changing anything.
    (img / "etc/udev/rules.d/71-egpu-setup.rules").write_text("# mine\n")
    state = tmp_path / "state"
    env = {"EGPU_SETUP_STATE_DIR": str(state)}
    res = invoke(
        "install",
        "--profile",
        "rtx4090",
        "--only",
        "config",
        "--root",
        str(img),
        "--from",
        TB4,
        "--yes",
        env=env,
    )
    # the image is an empty directory: its distribution and Python are unknown (warnings first)
    assert res.returncode == 1 and "\nerror: " in "\n" + res.stderr, res.stderr
    (report,) = (state / "build-reports").glob("install-*.json")
    data = json.loads(report.read_text())
    assert data["ok"] is False and data["exit_code"] == 1 and data["error"]["hint"]
    assert (img / "etc/udev/rules.d/71-egpu-setup.rules").read_text() == "# mine\n"


def test_an_amd_egpu_behind_thunderbolt_is_refused_before_anything() -> None:
    res = invoke(
        "install",
        "--profile",
        "rtx4090",
        "--dry-run",
        "--from",
        str(FIXTURES / "amd-rx7900xt-egpu"),
    )
    # an AMD eGPU is planned for ROCm (resolve/rocm.py), whatever the profile: this one's
    # Thunderbolt link has no PCIe atomics, so nothing is planned at all
    assert res.returncode == 2 and res.stdout == ""
    assert "error: this link cannot run ROCm" in res.stderr and "hint: " in res.stderr


def test_wsl2_plans_torch_only() -> None:
    res = invoke(
        "install", "--profile", "rtx4090", "--dry-run", "--json", "--from", str(FIXTURES / "wsl2")
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert {s["part"] for s in data["steps"]} == {"torch"}
    assert data["driver"]["action"] == "host-managed"


def test_index_urls_that_could_mislead_or_leak_are_refused() -> None:
    for url, says in [
        ("https://m.lab/whl/cu126 --extra-index-url https://evil", "no spaces"),
        ("https://user:secret@m.lab/whl/cu126", "carries credentials"),
        ("http://m.lab/whl/cu126", "only https://"),
    ]:
        res = invoke("install", "--profile", "rtx4090", "--dry-run", "--index-url", url)
        assert res.returncode == 2 and says in res.stderr and "secret" not in res.stdout


def test_two_identical_egpus_are_named_not_called_missing() -> None:
    res = invoke(
        "install",
        "--profile",
        "rtx3090",
        "--dry-run",
        "--from",
        str(FIXTURES / "two-identical-egpus"),
    )
    assert res.returncode == 0, res.stderr
    assert "2 external NVIDIA GPUs (0000:22:00.0, 0000:52:00.0)" in res.stderr
    assert "no external NVIDIA GPU detected" not in res.stderr
    assert "61-egpu-setup-tb-authorize" not in res.stdout  # neither enclosure is guessed
