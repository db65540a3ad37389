"""An AMD GPU's plan (plan/amd.py): its firmware, the user into render and video, the torch ROCm
venv, and none of the NVIDIA hot-plug files; replayed on the recorded OCuLink RX 7900 XTX host
(tests/fixtures/hosts/oculink-rx7900xtx-debian12, built from public pastes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import RunCli
from egpu_setup.plan.amd import group_members

HOST = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "oculink-rx7900xtx-debian12"


def _plan(cli: RunCli, host: Path) -> list[str]:
    done = cli("install", "--from", str(host), "--profile", "rx7900xtx", "--dry-run")
    assert done.returncode == 0, done.stderr
    plan = done.stdout.split("Plan (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return [line.split(". ", 1)[1] for line in plan]


def test_oculink_rx7900xtx_plans_firmware_groups_and_rocm_torch_only(cli: RunCli) -> None:
    steps = _plan(cli, HOST)
    assert steps == [
        "[driver] apt-get install firmware-amd-graphics (AMD GPU firmware (amdgpu itself is part "
        "of the kernel))",
        "[driver] run gpasswd -a student render (ROCm: student may open /dev/kfd and the render "
        "nodes from the next login; rollback takes student out of render again)",
        "[driver] run gpasswd -a student video (ROCm: student may open /dev/kfd and the render "
        "nodes from the next login; rollback takes student out of video again)",
        "[config] create /etc/udev/rules.d/71-egpu-setup.rules (mode 0644): AMD eGPU udev rule: "
        "runtime PM off when it appears",
        "[config] run udevadm control --reload (load the new udev rules)",
        "[driver] run dpkg --configure --pending (the dpkg triggers the driver's apt step "
        "deferred, run once, after the files they read)",
        "[torch] create venv /opt/egpu-setup/venv; install torch==2.14.1+rocm7.14 torchvision "
        "into /opt/egpu-setup/venv --index-url https://download.pytorch.org/whl/rocm7.14",
        "[driver] reboot needed: amdgpu reads the new GPU firmware when it starts the GPU (the "
        "next boot)",
    ]
    # nothing NVIDIA's: no nouveau blacklist, modprobe options, units, initramfs, driver branch
    assert not [s for s in steps if "nvidia" in s.lower() or "nouveau" in s or "initramfs" in s]


def test_the_amd_rule_turns_runtime_pm_off_for_the_radeon_only(cli: RunCli, tmp_path: Path) -> None:
    """The rule as written (install --diff): vendor 1002 and the card's id, never an address,
    and `removable` only where detect saw the GPU behind an external-facing port (OCuLink: no)."""
    from egpu_setup.profile.load import load_profile
    from egpu_setup.render.amd import render_amd_set
    from helpers.facts import recorded

    rendered = render_amd_set(
        recorded("oculink-rx7900xtx-debian12"), load_profile("rx7900xtx"), "compute"
    )
    (rule,) = rendered.files
    lines = [ln for ln in rule.content.splitlines() if ln and not ln.startswith("#")]
    assert lines == [
        'ACTION=="add", SUBSYSTEM=="pci", ATTR{vendor}=="0x1002", ATTR{device}=="0x744c", '
        'ATTR{class}=="0x03*", TEST=="power/control", ATTR{power/control}="on"'
    ]
    assert [c.argv for c in rendered.commands] == [("udevadm", "control", "--reload")]
    # a profile that keeps runtime PM gets no file
    profile = tmp_path / "keep-pm.yaml"
    text = (Path(__file__).resolve().parents[2] / "profiles" / "rx7900xtx.yaml").read_text()
    profile.write_text(
        text.replace("name: rx7900xtx", "name: keep-pm").replace(
            "runtime_pm_off: true", "runtime_pm_off: false"
        )
    )
    done = cli("install", "--from", str(HOST), "--profile", str(profile), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "71-egpu-setup.rules" not in done.stdout


def test_the_plan_says_why_there_is_no_driver_and_where_torch_comes_from(cli: RunCli) -> None:
    done = cli("install", "--from", str(HOST), "--profile", "rx7900xtx", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["driver"]["action"] == "in-kernel" and data["driver"]["branch"] is None
    assert data["driver"]["packages"] == ["firmware-amd-graphics"]
    assert data["torch"]["index_url"] == "https://download.pytorch.org/whl/rocm7.14"
    assert any("amdgpu is part of the kernel" in w for w in data["plan_warnings"])
    assert any("render and video groups" in r for r in data["reasons"])


def test_install_rocm_flag_picks_the_variant_and_a_bad_one_is_refused(cli: RunCli) -> None:
    done = cli(
        "install", "--from", str(HOST), "--profile", "rx7900xtx", "--rocm", "rocm6.4",
        "--dry-run", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    torch = json.loads(done.stdout)["torch"]
    assert torch["variant"] == "rocm6.4"
    assert torch["index_url"] == "https://download.pytorch.org/whl/rocm6.4"
    bad = cli(
        "install", "--from", str(HOST), "--profile", "rx7900xtx", "--rocm", "banana", "--dry-run"
    )
    assert bad.returncode == 2 and bad.stdout == "", bad.stderr
    err, hint = bad.stderr.splitlines()[:2]
    assert err.startswith("error: ") and "not a ROCm variant" in err, err
    assert hint.startswith("hint: ") and "Traceback" not in bad.stderr


def test_a_user_already_in_both_groups_gets_no_gpasswd(cli: RunCli, tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(HOST, host, symlinks=True)
    (host / "root" / "etc" / "group").write_text(
        "root:x:0:\nvideo:x:44:student\nrender:x:105:lab,student\nstudent:x:1000:\n"
    )
    assert not [s for s in _plan(cli, host) if "gpasswd" in s]
    # in video only: render alone is added (and only render is taken back by rollback)
    (host / "root" / "etc" / "group").write_text("video:x:44:student\nrender:x:105:\n")
    assert [s.split(" (", 1)[0] for s in _plan(cli, host) if "gpasswd" in s] == [
        "[driver] run gpasswd -a student render"
    ]


def test_each_membership_gets_its_own_undo() -> None:
    from egpu_setup.execute.executor import undo_argv

    assert undo_argv(("gpasswd", "-a", "student", "render")) == [
        "gpasswd",
        "-d",
        "student",
        "render",
    ]
    # only the exact form the plan writes has an undo: a multi-group usermod is not guessed at
    assert undo_argv(("usermod", "-aG", "render,video", "student")) is None
    assert undo_argv(("gpasswd", "-a", "student")) is None


def test_without_a_sudo_user_the_plan_says_who_needs_the_groups(
    cli: RunCli, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    shutil.copytree(HOST, host, symlinks=True)
    meta = json.loads((host / "meta.json").read_text())
    for key in ("SUDO_USER", "SUDO_UID"):
        meta["env"].pop(key)
    (host / "meta.json").write_text(json.dumps(meta))
    done = cli("install", "--from", str(host), "--profile", "rx7900xtx", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "gpasswd" not in done.stdout.split("Plan (", 1)[1].split("Summary", 1)[0]
    assert "`usermod -aG render,video USER`, then log in again" in done.stderr


def test_group_file_parsing() -> None:
    assert group_members("render:x:105:a,b\nvideo:x:44:\nbroken\n") == {
        "render": {"a", "b"},
        "video": set(),
    }
    assert group_members(None) == {}
