"""An AMD GPU's plan (plan/amd.py): its firmware, the user into render and video, the torch ROCm
venv, and none of the NVIDIA hot-plug files; replayed on the recorded OCuLink RX 7900 XTX host
(tests/fixtures/hosts/oculink-rx7900xtx-debian12, built from public pastes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from egpu_setup.plan.amd import group_members

HOST = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "oculink-rx7900xtx-debian12"


def _plan(cli, host: Path) -> list[str]:
    done = cli("install", "--from", str(host), "--profile", "rx7900xtx", "--dry-run")
    assert done.returncode == 0, done.stderr
    plan = done.stdout.split("Plan (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return [line.split(". ", 1)[1] for line in plan]


def test_oculink_rx7900xtx_plans_firmware_groups_and_rocm_torch_only(cli) -> None:
    steps = _plan(cli, HOST)
    assert steps == [
        "[driver] apt-get install firmware-amd-graphics (AMD GPU firmware (amdgpu itself is part "
        "of the kernel))",
        "[driver] run usermod -aG render,video student (ROCm: student may open /dev/kfd and the "
        "render nodes from the next login; rollback leaves the membership)",
        "[torch] create venv /opt/egpu-setup/venv; install torch==2.14.1+rocm7.14 torchvision "
        "into /opt/egpu-setup/venv --index-url https://download.pytorch.org/whl/rocm7.14",
        "[driver] reboot needed: amdgpu reads the new GPU firmware when it starts the GPU (the "
        "next boot)",
    ]
    # nothing NVIDIA's: no nouveau blacklist, modprobe options, units, initramfs, driver branch
    assert not [s for s in steps if "nvidia" in s.lower() or "nouveau" in s or "initramfs" in s]


def test_the_plan_says_why_there_is_no_driver_and_where_torch_comes_from(cli) -> None:
    done = cli("install", "--from", str(HOST), "--profile", "rx7900xtx", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["driver"]["action"] == "in-kernel" and data["driver"]["branch"] is None
    assert data["driver"]["packages"] == ["firmware-amd-graphics"]
    assert data["torch"]["index_url"] == "https://download.pytorch.org/whl/rocm7.14"
    assert any("amdgpu is part of the kernel" in w for w in data["plan_warnings"])
    assert any("render and video groups" in r for r in data["reasons"])


def test_a_user_already_in_both_groups_gets_no_usermod(cli, tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(HOST, host, symlinks=True)
    (host / "root" / "etc" / "group").write_text(
        "root:x:0:\nvideo:x:44:student\nrender:x:105:lab,student\nstudent:x:1000:\n"
    )
    assert not [s for s in _plan(cli, host) if "usermod" in s]
    # in video only: render alone is added
    (host / "root" / "etc" / "group").write_text("video:x:44:student\nrender:x:105:\n")
    assert next(s for s in _plan(cli, host) if "usermod" in s).startswith(
        "[driver] run usermod -aG render student "
    )


def test_without_a_sudo_user_the_plan_says_who_needs_the_groups(cli, tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(HOST, host, symlinks=True)
    meta = json.loads((host / "meta.json").read_text())
    for key in ("SUDO_USER", "SUDO_UID"):
        meta["env"].pop(key)
    (host / "meta.json").write_text(json.dumps(meta))
    done = cli("install", "--from", str(host), "--profile", "rx7900xtx", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "usermod" not in done.stdout.split("Plan (", 1)[1].split("Summary", 1)[0]
    assert "`usermod -aG render,video USER`, then log in again" in done.stderr


def test_group_file_parsing() -> None:
    assert group_members("render:x:105:a,b\nvideo:x:44:\nbroken\n") == {
        "render": {"a", "b"},
        "video": set(),
    }
    assert group_members(None) == {}
