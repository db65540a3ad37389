"""A lab image's dry run (install --root) says, before anything is built, what each laptop that
boots it will need: the Secure Boot key of a DKMS-built module, an enclosure to pin, the firmware
settings. The roots are recorded hosts' trees (tests/fixtures/hosts): Debian 12, whose archive
builds the module with DKMS (nvidia-kernel-dkms), and Ubuntu 24.04 (no driver yet), whose archive ships it prebuilt
and signed (linux-modules-nvidia-*)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from conftest import FIXTURES, run_cli

REPO = Path(__file__).resolve().parents[2]
BOX = "00e8d1a4-3c2b-0e01-ffff-ffffffffffff"


def dry_run(tmp_path: Path, host: str, profile: str = "rtx4090") -> dict[str, Any]:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / host / "root", root, symlinks=True)
    res = run_cli("install", "--dry-run", "--json", "--profile", profile, "--root", str(root))
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def each_laptop(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["id"]: a for a in data["actions"] if a["when"] == "each-laptop"}


def test_a_debian_image_names_the_mok_the_enclosure_and_the_firmware(tmp_path: Path) -> None:
    todo = each_laptop(dry_run(tmp_path, "fresh-debian12-no-venv"))
    assert set(todo) == {"mok-enrolment", "enclosure-to-pin", "firmware-settings"}, todo
    mok = todo["mok-enrolment"]
    assert "nvidia-kernel-dkms is built by DKMS" in mok["summary"], mok
    assert any("mokutil --import /var/lib/dkms/mok.pub" in s for s in mok["steps"]), mok
    assert any(s.startswith("instead:") and "Debian 12's has none" in s for s in mok["steps"])
    assert "iommu_dma_protection" in " ".join(todo["firmware-settings"]["steps"])


def test_an_ubuntu_image_with_signed_prebuilt_modules_needs_no_mok(tmp_path: Path) -> None:
    data = dry_run(tmp_path, "tb4-unauthorized-fresh-ubuntu2404")
    assert "linux-modules-nvidia-" in json.dumps(data), data.keys()
    assert set(each_laptop(data)) == {"enclosure-to-pin", "firmware-settings"}, data["actions"]


def test_a_pinned_enclosure_needs_no_pinning_at_the_laptop(tmp_path: Path) -> None:
    profile = yaml.safe_load((REPO / "profiles/rtx4090.yaml").read_text())
    profile["hotplug"]["enclosure_unique_id"] = BOX
    path = tmp_path / "pinned.yaml"
    path.write_text(yaml.safe_dump(profile))
    todo = each_laptop(dry_run(tmp_path, "fresh-debian12-no-venv", str(path)))
    assert "enclosure-to-pin" not in todo and "firmware-settings" in todo, todo


def test_a_laptop_run_is_not_told_about_other_laptops(tmp_path: Path) -> None:
    res = run_cli(
        "install", "--dry-run", "--json", "--profile", "rtx4090",
        "--from", str(FIXTURES / "secure-boot-dkms-debian12"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not each_laptop(json.loads(res.stdout)), res.stdout


def test_a_model_opt_in_is_named_with_its_iommu_guard(tmp_path: Path) -> None:
    profile = yaml.safe_load((REPO / "profiles/rtx4090.yaml").read_text())
    profile["hotplug"]["first_boot_enrol_model"] = "eGFX Breakaway Box 750ex"
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(profile))
    todo = each_laptop(dry_run(tmp_path, "fresh-debian12-no-venv", str(path)))
    assert "enclosure-to-pin" not in todo, todo
    said = todo["enclosure-by-model"]["summary"]
    assert "'eGFX Breakaway Box 750ex'" in said and "only where the domain has IOMMU" in said


def _profile_with(tmp_path: Path, **hotplug: Any) -> str:
    profile = yaml.safe_load((REPO / "profiles/rtx4090.yaml").read_text())
    profile["hotplug"].update(hotplug)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


def test_an_id_list_or_first_seen_is_named_by_the_dry_run_with_its_guard(tmp_path: Path) -> None:
    ids = _profile_with(tmp_path, first_boot_enrol=["0x8:0x36", "0x27:0x1"])
    todo = each_laptop(dry_run(tmp_path, "fresh-debian12-no-venv", ids))
    assert "enclosure-to-pin" not in todo and "enclosure-by-model" not in todo, todo
    said = todo["enclosure-by-id"]["summary"]
    assert "0x8:0x36, 0x27:0x1" in said and "only where the domain has IOMMU" in said, said
    again = tmp_path / "again"
    again.mkdir()
    seen = _profile_with(again, first_boot_enrol="first-seen", accept_no_iommu=True)
    todo = each_laptop(dry_run(again, "fresh-debian12-no-venv", seen))
    said = todo["enclosure-first-seen"]["summary"]
    assert "whatever it is" in said and "hotplug.accept_no_iommu" in said, said


def test_a_pinned_enclosure_wins_over_the_enrol_policy_in_the_dry_run(tmp_path: Path) -> None:
    both = _profile_with(tmp_path, first_boot_enrol="first-seen", enclosure_unique_ids=[BOX])
    todo = each_laptop(dry_run(tmp_path, "fresh-debian12-no-venv", both))
    assert not {"enclosure-first-seen", "enclosure-to-pin"} & set(todo), todo
