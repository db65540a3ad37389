"""The driver hold in the plan: after the driver's apt step when there is one, from dpkg's
status when the driver is already there, nothing once the hold on disk is the one dpkg's status
calls for; the profile key and the flag, and a bad value refused before anything is planned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from egpu_setup.detect.dpkg_status import HOLD_PIN
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, HoldDriver, Plan
from egpu_setup.profile.load import load_profile
from egpu_setup.render.hold import hold_files
from helpers import install_values as values

REPO = Path(__file__).resolve().parents[2]
STATUS = (REPO / "tests/data/doctor/dpkg-status-held.txt").read_text()  # 550.127-1, recorded
HOLD = PlanOptions(target="root", only=frozenset({"driver"}), hold_driver=True)
DRIVER = ("nvidia-kernel-dkms", "nvidia-driver", "firmware-nvidia-gsp")


def _root(tmp_path: Path, status: str) -> Path:
    r = tmp_path / "root"
    (r / "var/lib/dpkg").mkdir(parents=True)
    (r / "var/lib/dpkg/status").write_text(status)
    return r


def _plan(root: Path, action: str, options: PlanOptions = HOLD) -> Plan:
    profile = load_profile("rtx4090")
    return build_plan(
        values.facts(), profile, values.resolution(action=action), (), RootHost(root), options
    )


def test_a_fresh_install_holds_what_its_apt_step_installs(tmp_path: Path) -> None:
    plan = _plan(_root(tmp_path, ""), "install")
    kinds = [type(s) for s in plan.steps]
    assert kinds.index(HoldDriver) == kinds.index(AptInstall) + 1  # right after the packages
    hold = plan.steps[kinds.index(HoldDriver)]
    assert isinstance(hold, HoldDriver) and hold.held == ()
    assert set(hold.named) <= {*DRIVER, "nvidia-open-kernel-dkms"} and "nvidia-driver" in hold.named
    assert hold.describe().startswith(
        "hold the NVIDIA driver for the term: its packages at the versions this run installs"
    )
    # off (the default): no step, and the rest of the plan is the same
    off = _plan(_root(tmp_path / "off", ""), "install", PlanOptions(target="root", only=HOLD.only))
    assert [s for s in plan.steps if not isinstance(s, HoldDriver)] == list(off.steps)


def test_an_installed_driver_is_held_once_and_then_planned_no_more(tmp_path: Path) -> None:
    root = _root(tmp_path, STATUS)
    [hold] = _plan(root, "keep").steps
    assert isinstance(hold, HoldDriver)
    assert dict(hold.held) == {
        "libcuda1": "550.127-1",
        "libnvidia-ml1": "550.127-1",
        "nvidia-driver": "550.127-1",
        "nvidia-kernel-dkms": "550.127-1",
    }
    assert "4 packages at 550.127-1 (apt pin /etc/apt/preferences.d/" in hold.describe()
    for path, content, _ in hold_files(dict(hold.held), "rtx4090", "compute"):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(content)
    assert _plan(root, "keep").steps == ()  # a second run plans nothing
    # a package moved since: the hold is planned again, at what dpkg says now
    (root / "var/lib/dpkg/status").write_text(STATUS.replace("550.127-1", "550.135-1"))
    [again] = _plan(root, "keep").steps
    assert isinstance(again, HoldDriver) and {v for _, v in again.held} == {"550.135-1"}
    # the pin removed by hand: planned again
    (root / "var/lib/dpkg/status").write_text(STATUS)
    (root / HOLD_PIN.lstrip("/")).unlink()
    assert [type(s) for s in _plan(root, "keep").steps] == [HoldDriver]


def test_nothing_installed_and_nothing_to_install_holds_nothing(tmp_path: Path) -> None:
    assert _plan(_root(tmp_path, ""), "keep").steps == ()
    assert _plan(_root(tmp_path / "wsl", ""), "host-managed").steps == ()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ.copy(),
        cwd="/",
    )


FROM = str(REPO / "tests/fixtures/hosts/fresh-debian12-no-venv")


def test_the_flag_beats_the_profile_in_the_dry_run(tmp_path: Path) -> None:
    lab = tmp_path / "lab-rtx4090.yaml"
    lab.write_text("name: lab-rtx4090\nextends: rtx4090\ndriver:\n  hold: true\n")
    line = "[driver] hold the NVIDIA driver for the term"
    common = ("install", "--dry-run", "--from", FROM, "--only", "driver")
    on = _cli(*common, "--profile", str(lab))
    assert on.returncode == 0, on.stderr
    assert line in on.stdout
    off = _cli(*common, "--profile", str(lab), "--no-hold-driver")
    assert off.returncode == 0, off.stderr
    assert line not in off.stdout and "apt-get install" in off.stdout
    flag = _cli(*common, "--profile", "rtx4090", "--hold-driver")
    assert flag.returncode == 0 and line in flag.stdout
    assert line not in _cli(*common, "--profile", "rtx4090").stdout  # off by default


def test_a_hold_that_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    lab = tmp_path / "lab.yaml"
    lab.write_text('name: lab\nextends: rtx4090\ndriver:\n  hold: "yes"\n')
    proc = _cli("install", "--dry-run", "--from", FROM, "--profile", str(lab))
    assert proc.returncode == 2
    first, hint = proc.stderr.strip().splitlines()[-2:]
    assert first.startswith(f"error: {lab}:4:9: driver.hold: expected true or false"), first
    assert hint.startswith("hint: ") and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_an_apt_step_under_a_hold_of_ours_releases_it_first(tmp_path: Path) -> None:
    root = _root(tmp_path, STATUS)
    held = {"nvidia-driver": "550.127-1", "libcuda1": "550.127-1"}
    for path, content, _ in hold_files(held, "rtx4090", "compute"):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(content)
    steps = _plan(root, "upgrade").steps
    kinds = [type(s) for s in steps]
    release, hold = (s for s in steps if isinstance(s, HoldDriver))
    assert release.release and not hold.release
    assert kinds.index(HoldDriver) < kinds.index(AptInstall) < steps.index(hold)
    assert release.describe().endswith("for the apt step; it is held again after it")
    # the hold turned off (the default, or --no-hold-driver): released for good, nothing after
    off = PlanOptions(target="root", only=HOLD.only)
    [gone] = _plan(root, "keep", off).steps
    assert isinstance(gone, HoldDriver) and gone.release and gone.for_good
    assert "the profile holds the driver no more" in gone.describe()
    # once released (files empty), nothing more to do
    for path, content, _ in hold_files({}, "rtx4090", "compute", release=True):
        (root / path.lstrip("/")).write_text(content)
    assert _plan(root, "keep", off).steps == ()
