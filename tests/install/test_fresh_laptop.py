"""The situations a fresh laptop meets, each run as a new user would run it (the real
command line on a recorded host), ending in a working plan or in one `error:`/`hint:` before any
change: python3-venv missing, Secure Boot with a DKMS driver, another GPU manager, the wrong
profile, the only NVIDIA GPU with an undecided placement, two identical eGPUs, a plan that fits a
screen, the day after the reboot, and the advice where users look (power, NUMA, known problems,
temperature)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES, run_cli
from egpu_setup.host.machine import LiveHost, RecordedHost
from egpu_setup.plan.triggers import INITRAMFS_REBUILD, INITRAMFS_TRIGGER, TRIGGER_RUN
from helpers.cli_runner import invoke

FRESH = FIXTURES / "fresh-debian12-no-venv"
SECURE = FIXTURES / "secure-boot-dkms-debian12"
SECURE_UBUNTU = FIXTURES / "secure-boot-on"
ENVY = FIXTURES / "envycontrol-integrated-ubuntu2204"
TB3_3090 = FIXTURES / "tb3-rtx3090-ubuntu2204"
TB4 = FIXTURES / "tb4-rtx4090-ubuntu2404"
TB5 = FIXTURES / "tb5-rtx5090-ubuntu2404"
NUMA2 = FIXTURES / "numa2-workstation-ubuntu2204"
TWO = FIXTURES / "two-identical-egpus"
PASTE = FIXTURES / "user-paste-commands-only"
NOUVEAU = FIXTURES / "nouveau-bound"
LAPTOP_AND_EGPU = FIXTURES / "laptop-3070ti-plus-egpu-3080"


def dry(host: Path, profile: str, *extra: str) -> dict[str, Any]:
    res = invoke(
        "install", "--profile", profile, "--dry-run", "--json", "--from", str(host), *extra
    )
    assert res.returncode == 0, res.stderr
    result: dict[str, Any] = json.loads(res.stdout)
    return result


def kinds(plan: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["kind"], s["part"]) for s in plan["steps"]]


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b""
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


# -- python3-venv missing, and the venv a failed run left ------------------------------------------


def test_a_fresh_debian_gets_python3_11_venv_right_before_the_venv() -> None:
    plan = dry(FRESH, "rtx4090")
    steps = plan["steps"]
    i = next(i for i, s in enumerate(steps) if s["kind"] == "pip-install")
    assert steps[i - 1]["kind"] == "apt-install" and steps[i - 1]["packages"] == ["python3.11-venv"]
    assert steps[i - 1]["part"] == "torch" and steps[i]["create_venv"] is True
    # a Python whose ensurepip is there gets no such step
    other = dry(TB4, "rtx4090")
    assert not [s for s in other["steps"] if s["kind"] == "apt-install" and s["part"] == "torch"]


def half_made(venv: Path, python: str = "3.11") -> None:
    """What Debian 12's `python3 -m venv` leaves when ensurepip is missing: pyvenv.cfg and the
    interpreter links, empty site-packages, no pip, no bin/activate (EnvBuilder.create() stops
    in _setup_pip, before setup_scripts)."""
    (venv / "bin").mkdir(parents=True)
    (venv / "include" / f"python{python}").mkdir(parents=True)
    (venv / "lib" / f"python{python}" / "site-packages").mkdir(parents=True)
    os.symlink("lib", venv / "lib64")
    (venv / "pyvenv.cfg").write_text(
        "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n"
        f"executable = /usr/bin/python{python}\ncommand = /usr/bin/python3 -m venv {venv}\n"
    )
    os.symlink(f"/usr/bin/python{python}", venv / "bin/python")
    os.symlink("python", venv / "bin/python3")
    os.symlink("python", venv / f"bin/python{python}")


def test_a_half_made_venv_is_rebuilt_and_a_healthy_one_is_kept(tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(FRESH, host, symlinks=True)
    venv = host / "root/opt/egpu-setup/venv"
    half_made(venv)
    res = invoke("install", "--profile", "rtx4090", "--dry-run", "--json", "--from", str(host))
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    (pip,) = [s for s in plan["steps"] if s["kind"] == "pip-install"]
    assert pip["rebuild_venv"] is True and pip["create_venv"] is True
    assert pip["description"].startswith("rebuild the half-made venv /opt/egpu-setup/venv")
    assert any("left half-made by a failed run" in w for w in plan["plan_warnings"])
    assert ["python3.11-venv"] in [s.get("packages") for s in plan["steps"]]
    # the same directory once it works (a stdlib, --without-pip or uv venv: all have activate)
    (venv / "bin/activate").write_text("# activate\n")
    res = invoke("install", "--profile", "rtx4090", "--dry-run", "--json", "--from", str(host))
    (pip,) = [s for s in json.loads(res.stdout)["steps"] if s["kind"] == "pip-install"]
    assert pip["rebuild_venv"] is False and pip["create_venv"] is False


def test_offline_without_ensurepip_is_one_error_before_anything(tmp_path: Path) -> None:
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.errors import UsageError
    from egpu_setup.plan.options import BundleSource, PlanOptions
    from egpu_setup.plan.torch import torch_steps
    from egpu_setup.resolve.constraints import Constraints
    from egpu_setup.resolve.resolver import resolve

    host = RecordedHost(FRESH)
    facts = detect_host(host)
    resolution = resolve(facts, None, Constraints(torch_spec="2.13.0", cuda="cpu"))
    bundle = BundleSource(str(tmp_path), "py3.11-debian-12", None, str(tmp_path), "r.txt", None)
    with pytest.raises(UsageError) as err:
        torch_steps(resolution, host, PlanOptions(bundle=bundle), [], facts)
    assert "python3.11-venv is not installed" in err.value.message
    assert (err.value.hint or "").startswith("install it from this machine's own sources first")


# -- Secure Boot with a DKMS driver ----------------------------------------------------------------


def test_secure_boot_dkms_shows_the_mok_steps_before_anything_is_installed() -> None:
    res = invoke("install", "--profile", "rtx4070", "--dry-run", "--from", str(SECURE))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    after = out.index("After these steps, a person must (the run stops there, exit 4):")
    assert out.index("Plan (") < after < out.index("Summary")
    for line in (
        "DKMS creates the signing key /var/lib/dkms/mok.pub when it builds the module",
        "run `sudo mokutil --import /var/lib/dkms/mok.pub` and choose a one-time password",
        "'Enroll MOK'",
    ):
        assert line in out, line
    plan = dry(SECURE, "rtx4070")
    (action,) = plan["actions"]
    assert action["id"] == "mok-enrolment" and action["when"] == "after"
    assert "nvidia-kernel-dkms" in plan["driver"]["packages"]
    # Secure Boot off, or a torch-only plan: nothing for a person to do
    assert dry(FRESH, "rtx4090")["actions"] == []
    assert dry(SECURE, "rtx4070", "--only", "torch")["actions"] == []


def test_a_recorded_key_that_is_not_enrolled_is_read_from_mokutil_test_key() -> None:
    from egpu_setup.install.attention import UBUNTU_KEY, key_state, signing_key

    host = RecordedHost(SECURE_UBUNTU)
    from egpu_setup.detect.probe import detect_host

    assert signing_key(detect_host(host), host) == UBUNTU_KEY
    assert key_state(host, UBUNTU_KEY) == "not-enrolled"
    # Debian's DKMS key does not exist on the fresh Debian laptop yet
    assert key_state(RecordedHost(SECURE), "/var/lib/dkms/mok.pub") == "missing"


# -- another GPU manager ---------------------------------------------------------------------------


def test_envycontrol_is_named_with_its_undo_in_the_dry_run() -> None:
    res = invoke("install", "--profile", "rtx3080", "--dry-run", "--from", str(ENVY))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    before = out.index("Before anything changes, a person must:")
    assert before < out.index("Plan (")
    assert "EnvyControl is in integrated mode" in out
    assert "/etc/udev/rules.d/50-remove-nvidia.rules removes every NVIDIA PCI function" in out
    assert "`sudo envycontrol -s hybrid`, then reboot" in out
    (action,) = dry(ENVY, "rtx3080")["actions"]
    assert action["id"] == "competing-gpu-manager:envycontrol" and action["when"] == "before"


def envy_image(tmp_path: Path) -> Path:
    """An image built where EnvyControl had switched to integrated mode: its files are in it."""
    img = tmp_path / "img"
    for rel in ("etc/modprobe.d/blacklist-nvidia.conf", "etc/udev/rules.d/50-remove-nvidia.rules"):
        (img / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ENVY / "root" / rel, img / rel)
    return img


def test_envycontrol_is_refused_with_exit_4_before_any_change(tmp_path: Path) -> None:
    img = envy_image(tmp_path)
    before = tree(img)
    state = tmp_path / "state"
    args = ("install", "--profile", "rtx3080", "--only", "config", "--root", str(img))
    res = invoke(*args, "--from", str(ENVY), "--yes", env={"EGPU_SETUP_STATE_DIR": str(state)})
    assert res.returncode == 4, res.stderr
    error, hint = res.stderr.strip().splitlines()[-2:]
    assert (
        error.startswith("error: EnvyControl is in integrated mode")
        and "nothing was changed" in error
    )
    assert hint == (
        "hint: undo it: `sudo envycontrol -s hybrid`, then reboot, then run this command again "
        "(or pass --force to install anyway)"
    )
    assert tree(img) == before and not state.exists()
    # --force goes ahead, saying so
    res = invoke(
        *args, "--from", str(ENVY), "--yes", "--force", env={"EGPU_SETUP_STATE_DIR": str(state)}
    )
    assert res.returncode == 0, res.stderr
    assert "going ahead although EnvyControl is in integrated mode" in res.stderr
    assert (img / "etc/udev/rules.d/71-egpu-setup.rules").is_file()


MANAGER_FILES = {
    # (path, text) as each tool writes it (sources in egpu_setup/data/gpu_managers.yaml)
    "system76-power integrated": (
        "/etc/modprobe.d/system76-power.conf",
        "# Automatically generated by system76-power\nblacklist nouveau\nblacklist nvidia\n"
        "blacklist nvidia-drm\nblacklist nvidia-modeset\nalias nouveau off\nalias nvidia off\n"
        "alias nvidia-drm off\nalias nvidia-modeset off\n",
    ),
    "system76-power compute": (
        "/etc/modprobe.d/system76-power.conf",
        "# Automatically generated by system76-power\nblacklist nvidia-drm\n"
        "blacklist nvidia-modeset\nalias nvidia-drm off\nalias nvidia-modeset off\n",
    ),
    "system76-power hybrid": (
        "/etc/modprobe.d/system76-power.conf",
        "# Automatically generated by system76-power\n"
        "options nvidia NVreg_EnableS0ixPowerManagement=1\n",
    ),
    "nvidia-prime intel": (
        "/lib/modprobe.d/blacklist-nvidia.conf",
        "# Do not modify\n# This file was generated by nvidia-prime\nblacklist nvidia\n"
        "blacklist nvidia-drm\nblacklist nvidia-modeset\nalias nvidia off\n",
    ),
    "nvidia-prime on-demand": ("/etc/prime-discrete", "on-demand\n"),
    "optimus-manager integrated": (
        "/var/lib/optimus-manager/tmp/state.json",
        '{"type": "done", "current_mode": "integrated", "requested_mode": "integrated"}',
    ),
    "optimus-manager hybrid": (
        "/var/lib/optimus-manager/tmp/state.json",
        '{"type": "done", "current_mode": "hybrid", "requested_mode": "hybrid"}',
    ),
    "bumblebee": ("/etc/bumblebee/bumblebee.conf", "[bumblebeed]\nDriver=nvidia\n"),
    "all-ways-egpu": ("/usr/share/all-ways-egpu/user-bus-ids", "0000:00:02.0\n"),
    "egpu-switcher": (
        "/etc/X11/xorg.conf.d/99-egpu-switcher.conf",
        'Section "Device"\n  Identifier "Device0"\n  Driver "nvidia"\n  BusID "PCI:34:0:0"\n'
        '  Option "AllowExternalGpus" "True"\nEndSection\n',
    ),
    "gpu-manager": (
        "/usr/share/X11/xorg.conf.d/11-nvidia-prime.conf",
        "# DO NOT EDIT. AUTOMATICALLY GENERATED BY gpu-manager\n",
    ),
}
# mode -> (what install does: "refuse" / "warn" / None), and the undo text it shows
EXPECT = {
    "system76-power integrated": ("refuse", "refuse", "sudo system76-power graphics hybrid"),
    "system76-power compute": (None, "refuse", "sudo system76-power graphics hybrid"),
    "system76-power hybrid": (None, None, None),
    "nvidia-prime intel": ("refuse", "refuse", "sudo prime-select on-demand"),
    "nvidia-prime on-demand": (None, None, None),
    "optimus-manager integrated": ("refuse", "refuse", "optimus-manager --switch hybrid"),
    "optimus-manager hybrid": (None, "refuse", "sudo systemctl disable optimus-manager.service"),
    "bumblebee": ("refuse", "refuse", "sudo systemctl disable --now bumblebeed"),
    "all-ways-egpu": ("refuse", "refuse", "sudo all-ways-egpu uninstall"),
    "egpu-switcher": ("refuse", "refuse", "sudo egpu-switcher disable --hard"),
    "gpu-manager": ("warn", None, "nogpumanager"),
}


@pytest.mark.parametrize("case", sorted(MANAGER_FILES))
def test_each_manager_is_judged_by_its_mode(case: str, tmp_path: Path) -> None:
    from egpu_setup.install.attention import manager_actions

    path, text = MANAGER_FILES[case]
    f = tmp_path / "root" / path.lstrip("/")
    f.parent.mkdir(parents=True)
    f.write_text(text)
    host = RecordedHost(tmp_path)
    for mode, want in zip(("compute", "display"), EXPECT[case][:2], strict=True):
        actions, warnings = manager_actions(host, mode, frozenset({"driver", "config", "torch"}))
        got = "refuse" if actions else "warn" if warnings else None
        assert got == want, (case, mode, actions, warnings)
        said = " ".join([a.steps[0] for a in actions] + warnings)
        if want:
            expected = EXPECT[case][2]
            assert expected is not None and expected in said, said
        if "bumblebee" in case and want:
            assert "UNCONFIRMED" in said  # no upstream document gives its undo
    # a torch-only run (a CI box) is told, never stopped
    actions, _ = manager_actions(host, "display", frozenset({"torch"}))
    assert actions == []


# -- the wrong profile, the only NVIDIA GPU, two identical eGPUs -----------------------------------


def test_a_profile_for_another_card_is_said_and_the_rules_match_the_detected_card() -> None:
    res = invoke("install", "--profile", "rtx4090", "--dry-run", "--diff", "--from", str(TB3_3090))
    assert res.returncode == 0, res.stderr
    assert (
        "warning: the detected eGPU is GeForce RTX 3090 [10de:2204] at 0000:0a:00.0, not profile "
        "rtx4090's GeForce RTX 4090 (2684)" in res.stderr
    )
    rules = [ln for ln in res.stdout.splitlines() if ln.startswith("+ACTION==")]
    assert rules and all('ATTR{device}=="0x2204"' in ln for ln in rules), rules
    assert dry(TB3_3090, "rtx4090")["profile_mismatch"]
    # a generic profile accepts any NVIDIA card
    assert dry(TB3_3090, "generic-nvidia")["profile_mismatch"] is None
    assert dry(TB3_3090, "rtx3090")["profile_mismatch"] is None


def test_yes_refuses_a_plan_for_another_card_unless_forced(tmp_path: Path) -> None:
    img = tmp_path / "img"
    img.mkdir()
    env = {"EGPU_SETUP_STATE_DIR": str(tmp_path / "state")}
    args = ("install", "--profile", "rtx4090", "--only", "config", "--root", str(img))
    res = invoke(*args, "--from", str(TB3_3090), "--yes", env=env)
    assert res.returncode == 2, res.stderr
    error, hint = res.stderr.strip().splitlines()[-2:]
    assert (
        error.startswith("error: the detected eGPU is GeForce RTX 3090")
        and "nothing was changed" in error
    )
    assert hint.startswith("hint: pass the profile of the detected card")
    assert not any(img.rglob("*"))
    res = invoke(*args, "--from", str(TB3_3090), "--yes", "--force", env=env)
    assert res.returncode == 0, res.stderr
    rules = (img / "etc/udev/rules.d/71-egpu-setup.rules").read_text()
    assert 'ATTR{device}=="0x2204"' in rules and "2684" not in rules.split("\n# Runtime PM")[-1]
    res = invoke("install", "--profile", "generic-nvidia", "--only", "config", "--root",
                  str(tmp_path / "img2"), "--from", str(TB3_3090), "--yes", env=env)  # fmt: skip
    assert res.returncode == 2 and "no such directory" in res.stderr  # the image must exist
    (tmp_path / "img2").mkdir()
    res = invoke("install", "--profile", "generic-nvidia", "--only", "config", "--root",
                  str(tmp_path / "img2"), "--from", str(TB3_3090), "--yes", env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr


def test_render_generic_uses_the_only_nvidia_gpu_when_its_placement_is_undecided(
    tmp_path: Path,
) -> None:
    """docs/decisions.md, "How egpu-setup decides": otherwise the only NVIDIA GPU (lspci text only here)."""
    from egpu_setup.detect.probe import detect_host

    (gpu,) = detect_host(RecordedHost(PASTE)).nvidia_gpus
    assert gpu.external is None and gpu.device_id == "2206"
    out = tmp_path / "cfg"
    res = invoke("render", "--profile", "generic-nvidia", "--out", str(out), "--from", str(PASTE))
    assert res.returncode == 0, res.stderr
    rules = (out / "etc/udev/rules.d/71-egpu-setup.rules").read_text()
    assert 'ATTR{device}=="0x2206"' in rules
    page = (FIXTURES.parent.parent.parent / "docs" / "decisions.md").read_text()
    assert "Otherwise the only NVIDIA GPU" in page


def test_two_identical_egpus_get_one_consistent_message() -> None:
    for profile in ("rtx3090", "generic-nvidia"):
        res = invoke("install", "--profile", profile, "--dry-run", "--from", str(TWO))
        assert res.returncode == 0, res.stderr
        gpus = [w for w in res.stderr.splitlines() if "NVIDIA GPU" in w]
        assert gpus == [
            "warning: 2 external NVIDIA GPUs (0000:22:00.0, 0000:52:00.0): planning for GeForce "
            "RTX 3090, the same model in each, so one driver and one torch serve all of them"
        ], res.stderr
        assert "none known to be external" not in res.stderr
    res = invoke("resolve", "--from", str(TWO))
    assert "2 external NVIDIA GPUs" in res.stdout + res.stderr


# -- a plan that fits a screen ---------------------------------------------------------------------


def test_the_plan_fits_a_screen_and_diffs_come_with_diff() -> None:
    res = invoke("install", "--profile", "rtx4090", "--dry-run", "--from", str(TB4))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) < 60, len(lines)
    assert not [ln for ln in lines if ln.startswith(("+++ ", "--- ", "@@"))]
    assert lines[-1] == "16 files change: --diff shows how."  # kernels, sleep, guard, health units
    # no warning that does not apply: the sudoers note needs an egpu-setup others could replace
    assert "sudoers" not in res.stderr
    full = invoke("install", "--profile", "rtx4090", "--dry-run", "--diff", "--from", str(TB4))
    sep = full.stdout.index("-" * 30 + " file diffs " + "-" * 30)
    assert full.stdout.index("Summary") < sep < full.stdout.index("+++ b/etc/udev/rules.d/")
    assert full.stdout[:sep].rstrip("\n") == res.stdout.rstrip("\n").rsplit("\n", 2)[0]


def test_the_sudoers_note_only_for_an_egpu_setup_others_could_replace(tmp_path: Path) -> None:
    from egpu_setup.render.files import tool_path_exposed

    live = LiveHost()
    assert tool_path_exposed(live, None) is False
    assert tool_path_exposed(live, "/usr/bin/env") is False  # root's, all the way up
    mine = tmp_path / "bin" / "egpu-setup"
    mine.parent.mkdir()
    mine.write_text("#!/bin/sh\n")
    os.chown(mine, 65534, 65534)
    assert tool_path_exposed(live, str(mine)) is True
    os.chown(mine, 0, 0)
    mine.parent.chmod(0o777)
    assert tool_path_exposed(live, str(mine)) is True
    mine.parent.chmod(0o755)
    assert tool_path_exposed(live, str(mine)) is False
    assert tool_path_exposed(RecordedHost(TB4), str(mine)) is None


@pytest.mark.parametrize("host", [TB4, NOUVEAU], ids=lambda p: p.name)
def test_render_and_install_plan_the_same_commands(host: Path, tmp_path: Path) -> None:
    res = invoke("render", "--profile", "rtx4090", "--out", str(tmp_path / "cfg"), "--json",
                  "--from", str(host))  # fmt: skip
    assert res.returncode == 0, res.stderr
    rendered = {tuple(c["argv"]) for c in json.loads(res.stdout)["commands"]}
    rendered = {c for c in rendered if c[:2] != ("systemctl", "enable")}  # install: unit links
    planned = {
        tuple(s["argv"]) for s in dry(host, "rtx4090")["steps"] if s["kind"] == "run-command"
    }
    # the driver's apt step defers dpkg's triggers to one run after the files (plan/triggers.py),
    # where the initramfs rebuild is an activation of the trigger that run processes (the
    # nouveau-bound host installs the driver; the tb4 one has it)
    assert (TRIGGER_RUN in planned) == (host == NOUVEAU), planned
    planned.discard(TRIGGER_RUN)
    if INITRAMFS_TRIGGER in planned:
        planned = planned - {INITRAMFS_TRIGGER} | {INITRAMFS_REBUILD}
    assert rendered == planned
    enrol = {c for c in rendered if c[0] == "boltctl"}
    # bolt already stores the tb4 enclosure; the nouveau-bound one is not stored yet
    assert bool(enrol) == (host == NOUVEAU), enrol


# -- the day after ---------------------------------------------------------------------------------


def journal_with_reboot_run(state: Path, ended: float, boot_id: str) -> None:
    state.mkdir(parents=True, exist_ok=True)
    run = "20261127T090000-4242"
    events = [
        {"time": ended - 60, "event": "run-begin", "run": run, "steps": [], "boot_id": boot_id},
        {"time": ended, "event": "run-end", "run": run, "status": "reboot", "boot_id": boot_id},
    ]
    (state / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def verify_report(state: Path, when: float, *, ok: bool, temp: float = 70.0) -> Path:
    """A verify report as `egpu-setup verify` writes it (its own classes make it)."""
    from egpu_setup.verify.checks import Check
    from egpu_setup.verify.report import VerifyReport

    checks = (
        # as the verify child writes them (egpu_setup/verify/_child.py)
        Check(
            "torch-import", "pass", "torch 2.9.1+cu128 (CUDA 12.8) in 2.1 s", value="2.9.1+cu128"
        ),
        Check("amp-training", "pass" if ok else "fail", "loss 2.31 -> 0.41" if ok else "loss nan"),
        Check(
            "gpu-temperature",
            "warn" if temp >= 88 else "pass",
            f"peak {temp:.0f} °C over 40 samples (limit 88 °C)",
            value=temp,
            expected=88.0,
        ),
    )
    report = VerifyReport(
        checks=checks,
        device={"type": "cuda", "name": "NVIDIA GeForce RTX 4090", "index": 0},
        python="/opt/egpu-setup/venv/bin/python",
        profile="rtx4090",
        options={"quick": True},
        outcome="finished",
        started=when,
        seconds=41.0,
        hostname="lab-07",
    )
    return report.save(state)


def test_after_the_reboot_the_boot_time_verify_result_comes_with_nothing_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from egpu_setup.install.day_after import after_reboot
    from egpu_setup.state.paths import StatePaths

    state = tmp_path / "state"
    monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
    paths = StatePaths.for_root(Path("/"))
    ended = time.time() - 3600
    journal_with_reboot_run(state, ended, boot_id="a boot before this one")
    verify_report(state, ended - 7200, ok=True)  # before the install: not its verify
    seen = after_reboot(paths, LiveHost())
    assert seen is not None and seen.report is None
    assert "no verify report since the reboot" in seen.text() or "has not run yet" in seen.text()
    path = verify_report(state, ended + 120, ok=False)
    seen = after_reboot(paths, LiveHost())
    assert seen is not None and seen.ok is False and seen.path == str(path)
    assert "FAILED (amp-training;" in seen.text() and "run `egpu-setup verify`" in seen.text()
    later = verify_report(state, ended + 900, ok=True)  # fixed, verified again by hand
    seen = after_reboot(paths, LiveHost())
    assert seen is not None and seen.ok is True and seen.path == str(later)
    assert "OK (3 checks passed" in seen.text()
    # not rebooted yet: nothing to say (the plan still says "reboot needed")
    boot = LiveHost().read_attr("/proc/sys/kernel/random/boot_id")
    journal_with_reboot_run(state, ended, boot_id=boot or "")
    assert after_reboot(paths, LiveHost()) is None


def test_the_summary_says_how_to_use_torch_and_a_relogin_in_display_mode() -> None:
    res = invoke(
        "install", "--profile", "rtx4090", "--dry-run", "--mode", "display", "--from", str(TB4)
    )
    assert res.returncode == 0, res.stderr
    summary = res.stdout[res.stdout.index("Summary") :]
    assert "/opt/egpu-setup/venv/bin/python train.py" in summary
    assert "source /opt/egpu-setup/venv/bin/activate" in summary
    assert "log out and back in (or reboot)" in summary
    compute = invoke("install", "--profile", "rtx4090", "--dry-run", "--from", str(TB4))
    assert "log out and back in" not in compute.stdout


# -- a CPU install (a CI box, a laptop away from its eGPU) ----------------------------------------


@pytest.mark.slow
def test_a_cpu_install_verifies_on_the_cpu_and_exits_0(tmp_path: Path) -> None:
    """`install --only torch --cuda cpu` on this machine (no GPU): torch 2.13.0+cpu from a
    loopback PEP 503 index into a new venv, then the post-install `verify --quick` trains on the
    CPU for real; exit 0, and the report says the device was the CPU. Then the day after, through
    the same command line: the boot-time verify's result beside "Nothing to do"."""
    from helpers import pypi_index

    wheels = pypi_index.download_torch(pypi_index.cache_dir())
    venv = tmp_path / "venv"
    env = {"EGPU_SETUP_STATE_DIR": str(tmp_path / "state")}
    # what a failed first try left (python3.X-venv was missing then): rebuilt, not reused
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not Path(f"/usr/bin/python{python}").exists():
        pytest.skip(f"no /usr/bin/python{python} for the half-made venv to point at")
    half_made(venv, python)
    with pypi_index.LocalIndex(wheels) as idx:
        args: tuple[str, ...] = ("install", "--profile", "generic-nvidia", "--only", "torch")
        args += ("--cuda", "cpu")
        args += ("--torch", "2.13.0")
        args += ("--venv", str(venv), "--index-url", idx.url, "--yes")
        res = run_cli(*args, "--json", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    done = json.loads(res.stdout)
    assert done["steps"][0]["description"].startswith(f"rebuild the half-made venv {venv}")
    result = done["result"]
    assert [s["status"] for s in result["steps"]] == ["done"]
    assert (venv / "bin/activate").is_file() and (venv / "bin/pip").exists()
    verify = result["verify"]
    assert verify["ok"] is True and verify["device_kind"] == "cpu", verify
    assert verify["device"]["type"] == "cpu"
    # the text says so too, and a second run has nothing to do
    res = run_cli(*args, env=env, timeout=300)
    assert res.returncode == 0 and res.stdout.startswith("Nothing to do"), res.stderr[-2000:]
    assert "After the reboot" not in res.stdout  # no run asked for one
    # the day after: the last run asked for a reboot (in another boot) and the boot-time verify
    # failed; re-running says so, with exit 1, and then passes once a verify by hand does
    state = tmp_path / "state"
    ended = time.time()  # after the real verify above: the reports below are the newer ones
    journal_with_reboot_run(state, ended, boot_id="a boot before this one")
    verify_report(state, ended + 5, ok=False)
    res = run_cli(*args, env=env, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr[-2000:]
    seen = next(line for line in res.stdout.splitlines() if line.startswith("After the reboot:"))
    assert "FAILED (amp-training;" in seen and "run `egpu-setup verify`" in seen
    verify_report(state, ended + 10, ok=True)
    res = run_cli(*args, "--json", env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    after = json.loads(res.stdout)["result"]["after_reboot"]
    assert after["ok"] is True and "OK (3 checks passed" in after["text"]


# -- the advice where users look -------------------------------------------------------------------


def test_power_advice_and_the_cards_power_limit_in_the_summary() -> None:
    plan = dry(TB3_3090, "rtx3090")
    (power,) = [a["text"] for a in plan["advice"] if a["label"] == "Power"]
    assert "a supply of 750 W or more" in power
    assert "GeForce RTX 3090 runs with a 350 W power limit now" in power  # nvidia-smi's cap


def test_numa_node_and_the_numactl_line_only_on_a_multi_node_machine() -> None:
    (numa,) = [a["text"] for a in dry(NUMA2, "rtx4090")["advice"] if a["label"] == "NUMA"]
    assert numa.startswith("the eGPU is on NUMA node 1 of 2")
    assert "numactl --cpunodebind=1 --membind=1 /opt/egpu-setup/venv/bin/python train.py" in numa
    assert not [a for a in dry(TB4, "rtx4090")["advice"] if a["label"] == "NUMA"]
    res = invoke("detect", "--from", str(NUMA2))
    assert "NUMA node 1 of 2" in res.stdout and "NUMA node 0 of 2" in res.stdout
    res = invoke("detect", "--json", "--from", str(NUMA2))
    data = json.loads(res.stdout)
    assert data["numa_nodes"] == [0, 1]


def test_tb5_blackwell_is_warned_by_detect_doctor_and_install() -> None:
    res = invoke("detect", "--from", str(TB5))
    assert "Known problems" in res.stdout and "via thunderbolt (TB5)" in res.stdout
    assert "open-gpu-kernel-modules/issues/979" in res.stdout
    res = invoke("detect", "--json", "--from", str(TB5))
    assert "warning: GeForce RTX 5090 at 0000:0a:00.0 via thunderbolt (TB5)" in res.stderr
    res = invoke("doctor", "--json", "--from", str(TB5))
    known = [f for f in json.loads(res.stdout)["findings"] if f["id"] == "known-egpu-issue"]
    assert len(known) == 2 and {f["severity"] for f in known} == {"warning"}
    assert any("power/control=on" in f["fix"] for f in known)
    assert all("does not prevent it" in f["fix"] or "did not help" in f["fix"] for f in known)
    warnings = dry(TB5, "rtx5090")["plan_warnings"]
    assert sum("via thunderbolt (TB5)" in w for w in warnings) == 2
    # an Ada card on Thunderbolt has none of these
    assert not [w for w in dry(TB4, "rtx4090")["plan_warnings"] if "Blackwell" in w]


def test_a_verify_too_hot_for_the_profile_is_a_doctor_finding(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(TB4, bundle, symlinks=True)
    reports = bundle / "root/var/lib/egpu-setup"
    verify_report(reports, time.time() - 60, ok=True, temp=70.0)
    res = invoke("doctor", "--json", "--from", str(bundle))
    assert "gpu-temperature-over-limit" not in res.stdout
    hot = verify_report(reports, time.time(), ok=True, temp=91.0)
    res = invoke("doctor", "--json", "--from", str(bundle))
    (finding,) = [
        f for f in json.loads(res.stdout)["findings"] if f["id"] == "gpu-temperature-over-limit"
    ]
    assert finding["severity"] == "warning"
    assert finding["summary"].startswith("The GPU reached 91 °C during verify")
    assert "88 °C limit of rtx4090" in finding["summary"]
    assert finding["evidence"] == [
        f"/var/lib/egpu-setup/reports/{hot.name}: gpu-temperature peak 91 °C over 40 samples "
        "(limit 88 °C)"
    ]
    # the same report named with --torch-info
    res = invoke("doctor", "--json", "--from", str(TB4), "--torch-info", str(hot))
    assert "gpu-temperature-over-limit" in res.stdout


def test_the_power_line_follows_the_detected_card_not_the_profiles() -> None:
    # an RTX 5090 (575 W, a 1000 W supply) planned with the RTX 4090 profile (850 W): the
    # supply is the 5090's, from the profile that names its device id
    plan = dry(TB5, "rtx4090")
    assert plan["profile_mismatch"].startswith("the detected eGPU is GeForce RTX 5090")
    (power,) = [a["text"] for a in plan["advice"] if a["label"] == "Power"]
    assert "profile rtx5090 (GeForce RTX 5090): a supply of 1000 W or more" in power
    assert "850" not in power and "4090" not in power
    # the card's own profile: the same line
    (own,) = [a["text"] for a in dry(TB5, "rtx5090")["advice"] if a["label"] == "Power"]
    assert own.startswith("profile rtx5090 (GeForce RTX 5090): a supply of 1000 W or more")


def test_a_detected_card_without_a_profile_gets_no_borrowed_supply_figure() -> None:
    from dataclasses import replace

    from egpu_setup.detect.probe import detect_host
    from egpu_setup.install.advice import card_for, power_advice, profile_for_card
    from egpu_setup.profile.load import load_profile

    facts = detect_host(RecordedHost(TB5))
    (seen,) = [g for g in facts.gpus if g.device_id == "2b85"]
    # the recorded card as an RTX 5090 D (pci.ids 2b87), which no bundled profile names
    card = replace(seen, device_id="2b87", name="GeForce RTX 5090 D")
    assert profile_for_card(card) is None and profile_for_card(seen) is not None
    advice = power_advice(load_profile("rtx4090"), card, None, profile_for_card(card))
    assert advice is not None
    assert advice.text == (
        "no supply figure for the detected GeForce RTX 5090 D [10de:2b87]: profile rtx4090's 850 W is "
        "for a GeForce RTX 4090"
    )
    assert card_for(facts, None) == seen


def test_the_torch_header_and_the_pip_step_name_the_one_index_given() -> None:
    mirror = "https://mirror.lab.example/pytorch/whl/cu128"
    plan = dry(TB4, "rtx4090", "--index-url", mirror)
    public = plan["torch"]["mirror_of"]
    assert plan["torch"]["index_url"] == mirror and public.startswith("https://download.pytorch")
    (pip,) = [s for s in plan["steps"] if s["kind"] == "pip-install"]
    assert pip["index_url"] == mirror
    res = invoke(
        "install", "--profile", "rtx4090", "--dry-run", "--from", str(TB4), "--index-url", mirror
    )
    assert res.returncode == 0, res.stderr
    named = [line for line in res.stdout.splitlines() if "--index-url" in line]
    assert len(named) == 2 and all(mirror in line for line in named), named
    assert f"(a mirror of {public})" in res.stdout
    assert res.stdout.count(public) == 1
    # without a mirror there is none to name
    assert dry(TB4, "rtx4090")["torch"]["mirror_of"] is None


def _driver_line(*args: str) -> str:
    res = invoke("install", "--dry-run", "--from", str(FRESH), *args)
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("Driver ")]
    assert "apt install" not in res.stdout.split("Torch ")[0], res.stdout
    return line


def test_a_torch_only_plan_does_not_announce_a_driver_install() -> None:
    cpu = _driver_line("--profile", "rtx4090", "--only", "torch", "--cuda", "cpu")
    assert cpu.startswith("Driver   not part of this run (--only leaves the driver out)")
    assert "the cpu torch needs none" in cpu
    pinned = _driver_line("--profile", "rtx4090", "--only", "torch", "--driver-branch", "580")
    assert pinned.startswith("Driver   not part of this run"), pinned
    assert "needs >= 580" in pinned and "none is installed now" in pinned
    # the whole run still says what it installs
    whole = invoke("install", "--dry-run", "--from", str(FRESH), "--profile", "rtx4090")
    assert "Driver   install branch" in whole.stdout


def test_a_laptop_gpu_beside_the_egpu_the_summary_names_the_egpus_cuda_index() -> None:
    # a recorded laptop: its own RTX 3070 Ti at 01:00.0, the RTX 3080 eGPU at 22:00.0; under
    # PCI bus order the eGPU is cuda:1, and CUDA's default (fastest first) may give cuda:0 to either
    plan = dry(LAPTOP_AND_EGPU, "rtx3080")
    advice = {a["label"]: a["text"] for a in plan["advice"]}
    assert advice["Devices"] == (
        "2 NVIDIA GPUs: the eGPU GeForce RTX 3080 at 0000:22:00.0 is cuda:1 under "
        "CUDA_DEVICE_ORDER=PCI_BUS_ID (also Geforce RTX 3070 Ti Laptop GPU at 0000:01:00.0). "
        "CUDA's default order is fastest first, so a bare cuda:0 may be the other card\n"
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 makes the eGPU the only one, cuda:0"
    )
    assert advice["Torch"].startswith(
        "run your code with CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 "
        "/opt/egpu-setup/venv/bin/python train.py"
    )
    res = invoke("install", "--profile", "rtx3080", "--dry-run", "--from", str(LAPTOP_AND_EGPU))
    assert "is cuda:1 under CUDA_DEVICE_ORDER=PCI_BUS_ID" in " ".join(res.stdout.split())
    # one NVIDIA GPU, or two eGPUs used together: no such line, and the plain python line
    for host, profile in ((TB4, "rtx4090"), (TWO, "rtx3090")):
        one = {a["label"]: a["text"] for a in dry(host, profile)["advice"]}
        assert "Devices" not in one
        assert one["Torch"].startswith("run your code with /opt/egpu-setup/venv/bin/python")


def test_the_thunderbolt_list_names_a_tb5_enclosure_as_the_gpu_line_does() -> None:
    # the recorded Core X V2: sysfs generation 4 (every USB4 router), two 40 Gb/s lanes
    lines = invoke("detect", "--from", str(TB5)).stdout.splitlines()
    (enclosure,) = [ln for ln in lines if "Core X V2" in ln]
    assert ", TB5 (kernel generation 4)," in enclosure and "gen 4" not in enclosure
    assert any("via thunderbolt (TB5)" in ln for ln in lines)
    # a TB3 enclosure (sysfs generation 3) is named TB3 in both places
    lines = invoke("detect", "--from", str(TB3_3090)).stdout.splitlines()
    assert any("TB3 (kernel generation 3)" in ln for ln in lines), lines
