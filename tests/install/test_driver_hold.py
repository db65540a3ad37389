"""The driver held for the term, for real in a Debian 12 root: packages built from one source
(`nvidia-graphics-drivers`, as Debian's are) installed from a local apt repository by the
executor's apt step, the hold written from dpkg's status after it, then a newer release of the
same packages in the repository. `apt-get -s upgrade` keeps every held package back (and moves
all of them once the pin is out of apt's view: the test can fail); apt itself reads the
unattended-upgrades drop-in; rollback takes both files away and the upgrade goes through.
Doctor reads the root's own dpkg status: held, then split by a `dpkg -i` that ignores the pin.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from egpu_setup.detect.dpkg_status import HOLD_PIN, HOLD_UNATTENDED
from egpu_setup.doctor.hold import hold_findings, judge_hold
from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.steps import AptInstall, HoldDriver, Plan
from egpu_setup.render.headers import classify_generated
from egpu_setup.rollback.core import RollbackOptions, apply_rollback, plan_rollback
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import debroot
from helpers.local_apt import build_deb, local_repository

pytestmark = pytest.mark.debootstrap

SOURCE = "nvidia-graphics-drivers"
OLD, NEW = "550.127-1", "550.135-1"
DRIVER = ("nvidia-kernel-dkms", "libcuda1", "libnvidia-ml1", "nvidia-driver")


def _release(root: Path, version: str) -> list[Path]:
    """One release of the driver: the module, two libraries, the metapackage needing them."""
    debs = [build_deb(root, n, version=version, source=SOURCE) for n in DRIVER[:3]]
    depends = ", ".join(f"{n} (= {version})" for n in DRIVER[:3])
    debs.append(build_deb(root, "nvidia-driver", depends, version=version, source=SOURCE))
    return debs


def _upgrades(root: Path, *extra: str) -> set[str]:
    """The packages `apt-get -s upgrade` would install a new version of (its `Inst` lines)."""
    done = debroot.chroot(root, "apt-get", "-s", *extra, "upgrade")
    assert done.returncode == 0, done.stdout + done.stderr
    return set(re.findall(r"^Inst (\S+)", done.stdout, re.M))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = debroot.copy_or_skip("bookworm", tmp_path / "root")
    old = _release(root, OLD)
    local_repository(root, old)
    plan = Plan(
        (
            AptInstall(("nvidia-driver",), no_install_recommends=True),
            HoldDriver(("nvidia-driver",), "lab-rtx3080", "compute"),
        )
    )
    result = execute(plan, RootHost(root), StatePaths.for_root(root), ExecOptions())
    assert result.steps[1].detail == f"driver held at {OLD}: {', '.join(sorted(DRIVER))}"
    local_repository(root, old + _release(root, NEW))  # the archive moves on mid-term
    return root


def test_held_packages_stay_back_and_rollback_releases_them(root: Path) -> None:
    pin = (root / HOLD_PIN.lstrip("/")).read_text()
    assert classify_generated(pin) == "ours"
    for name in DRIVER:  # each at its exact installed version, from dpkg's status
        assert f"Package: {name}\nPin: version {OLD}\nPin-Priority: 1001\n" in pin
    # without the pin in apt's view the whole driver moves: the check below can fail
    assert _upgrades(root, "-o", "Dir::Etc::PreferencesParts=/nonexistent") == set(DRIVER)
    assert _upgrades(root) == set()
    policy = debroot.chroot(root, "apt-cache", "policy", "libcuda1").stdout
    assert re.search(rf"Candidate: {re.escape(OLD)}", policy), policy

    # apt parses the unattended-upgrades drop-in (the header's # lines included); each pattern
    # matches its own package from the start and nothing longer (re.match, as unattended-upgrades)
    dump = debroot.chroot(root, "apt-config", "dump", "Unattended-Upgrade::Package-Blacklist")
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', dump.stdout, re.M)
    assert sorted(patterns) == sorted(f"^{n}$" for n in DRIVER), dump.stdout + dump.stderr
    assert [p for p in patterns if re.match(p, "libcuda1")] == ["^libcuda1$"]
    assert not [p for p in patterns if re.match(p, "libcuda1-i386")]

    manifest = Manifest.load(StatePaths.for_root(root))
    assert {HOLD_PIN, HOLD_UNATTENDED} <= set(manifest.files)
    apply_rollback(plan_rollback(RollbackOptions(yes=True, root_dir=str(root))))
    assert not (root / HOLD_PIN.lstrip("/")).exists()
    assert not (root / HOLD_UNATTENDED.lstrip("/")).exists()
    assert _upgrades(root) == set(DRIVER)


def test_doctor_tells_a_held_driver_from_a_split_one(root: Path) -> None:
    status = root / "var/lib/dpkg/status"
    pin = (root / HOLD_PIN.lstrip("/")).read_text()
    held = judge_hold(status.read_text(), pin)
    assert held.held and not held.split
    [finding] = hold_findings(held)
    assert finding.id == "driver-held"
    assert finding.summary.startswith(f"The NVIDIA driver is held at {OLD} (4 packages, ")

    # dpkg itself ignores apt's pins: a library moved by hand splits the driver
    done = debroot.chroot(root, "dpkg", "-i", f"/tmp/repo/libcuda1_{NEW}_all.deb")
    assert done.returncode == 0, done.stderr
    split = judge_hold(status.read_text(), pin)
    assert split.moved == ("libcuda1",)
    assert split.split_text() == (
        f"split: nvidia-kernel-dkms {OLD} vs libcuda1 {NEW} (moved: libcuda1)"
    )
    assert hold_findings(split) == []  # the split is driver-library-mismatch's (doctor/checks.py)
    # the same split with the pin gone: measured against the module's package
    assert judge_hold(status.read_text(), None).split_text() == split.split_text()


def test_a_planned_upgrade_releases_the_hold_first_and_holds_the_new_release(root: Path) -> None:
    # with the pin in place apt keeps the held version: an upgrade step alone would do nothing
    sim = debroot.chroot(root, "apt-get", "-s", "install", "nvidia-driver")
    assert f"nvidia-driver is already the newest version ({OLD})" in sim.stdout, sim.stdout
    plan = Plan(
        (
            HoldDriver(("nvidia-driver",), "lab-rtx3080", "compute", release=True),
            AptInstall(("nvidia-driver",), no_install_recommends=True),
            HoldDriver(("nvidia-driver",), "lab-rtx3080", "compute"),
        )
    )
    result = execute(plan, RootHost(root), StatePaths.for_root(root), ExecOptions())
    assert result.steps[2].detail == f"driver held at {NEW}: {', '.join(sorted(DRIVER))}"
    pin = (root / HOLD_PIN.lstrip("/")).read_text()
    assert f"Pin: version {OLD}" not in pin and pin.count(f"Pin: version {NEW}") == 4
    assert _upgrades(root, "-o", "Dir::Etc::PreferencesParts=/nonexistent") == set()
    # rollback still removes both files: they were replaced twice, created by egpu-setup
    apply_rollback(plan_rollback(RollbackOptions(yes=True, root_dir=str(root))))
    assert not (root / HOLD_PIN.lstrip("/")).exists()
    assert not (root / HOLD_UNATTENDED.lstrip("/")).exists()
