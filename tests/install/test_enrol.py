"""Enrolling the enclosure: one core for install and firstboot.

The host is tests/fixtures/hosts/tb4-unauthorized-fresh-ubuntu2404: the tb4-rtx4090 notebook on
its first day, the Sonnet box connected with `authorized` 0 and no GPU on the bus. The sysfs
write runs against a temporary copy of that recorded tree (RootHost: writes land inside it);
when `authorized` turns 1 a stand-in for the kernel brings the tunnel up by copying in the same
machine's recorded tree with the enclosure authorized (tb4-rtx4090-ubuntu2404), which is what the
kernel does: the enclosure's bridges and the GPU appear under the port. bolt cannot run here
(no boltd, no Thunderbolt controller): a `boltctl` stand-in on PATH records its argv.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import FIXTURES
from egpu_setup.detect.facts import TbDevice
from egpu_setup.detect.probe import detect_host
from egpu_setup.host import process
from egpu_setup.host.machine import LiveHost, RecordedHost, RootHost
from egpu_setup.install import enrol
from egpu_setup.profile.load import load_profile
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers.cli_runner import invoke

FRESH = FIXTURES / "tb4-unauthorized-fresh-ubuntu2404"
AUTHORIZED = FIXTURES / "tb4-rtx4090-ubuntu2404"
BOX = "00e8d1a4-3c2b-0e01-ffff-ffffffffffff"
BOX_SYSFS = "sys/bus/thunderbolt/devices/0-1/authorized"


def _dev(name: str, uuid: str, vendor: str = "Razer", sysfs: str = "0-1") -> TbDevice:
    return TbDevice(name=name, vendor=vendor, unique_id=uuid, authorized=False, sysfs_name=sysfs)


DOCK = _dev("TB4 Dock", "11111111-2222-3333-4444-555555555555", "Dell", "0-3")
CORE_X = _dev("Core X", "d9010000-0090-8d08-23dd-b41c94851823", "Razer", "0-1")
CORE_X_2 = _dev("Core X", "d9010000-0090-8d08-23dd-b41c94851824", "Razer", "1-1")


def test_only_a_pinned_device_is_chosen_never_a_guess() -> None:
    devices = (DOCK, CORE_X)
    assert enrol.choose(devices, enrol.EnrolPolicy()).device is None
    pinned = enrol.EnrolPolicy(pinned=(CORE_X.unique_id or "",))
    assert enrol.choose(devices, pinned) == enrol.Choice(
        CORE_X, "pinned", f"Razer Core X ({CORE_X.unique_id}) is pinned"
    )
    # one device alone is still not enough: it could be a dock
    assert enrol.choose((DOCK,), enrol.EnrolPolicy()).device is None


def test_the_model_opt_in_takes_the_first_of_that_model_and_says_the_risk() -> None:
    policy = enrol.EnrolPolicy(first_of_model="Razer Core X")
    choice = enrol.choose((CORE_X_2, DOCK, CORE_X), policy)
    assert choice.device == CORE_X and choice.how == "model"  # 0-1 before 1-1
    assert "trusted for its claimed model name" in choice.reason
    assert enrol.choose((DOCK,), policy).device is None
    assert enrol.choose((CORE_X,), enrol.EnrolPolicy(first_of_model="core x")).device == CORE_X


def test_the_policy_takes_the_profiles_uuids_and_refuses_a_bad_one() -> None:
    profile = load_profile("rtx4090")
    assert CORE_X.unique_id is not None and DOCK.unique_id is not None
    hp = replace(profile.hotplug, enclosure_unique_id=BOX, enclosure_unique_ids=(CORE_X.unique_id,))
    assert enrol.EnrolPolicy.of(hp, [DOCK.unique_id.upper()]).pinned == (
        DOCK.unique_id,
        BOX,
        CORE_X.unique_id,
    )
    from egpu_setup.errors import UsageError

    with pytest.raises(UsageError, match="not a Thunderbolt unique_id"):
        enrol.EnrolPolicy.of(hp, ["$(reboot)"])


def test_a_fresh_laptop_needs_enrolment_and_the_dry_run_names_the_device() -> None:
    facts = detect_host(RecordedHost(FRESH))
    assert facts.nvidia_gpus == () and enrol.needs_enrolment(facts)
    (dev,) = enrol.candidates(facts)
    assert (dev.vendor, dev.name, dev.unique_id) == (
        "Sonnet Technologies, Inc.",
        "eGFX Breakaway Box 750ex",
        BOX,
    )
    res = invoke("install", "--profile", "rtx4090", "--from", str(FRESH), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert (
        f"Sonnet Technologies, Inc. eGFX Breakaway Box 750ex ({BOX})" in res.stderr
        and "install asks which one is the enclosure" in res.stderr
        and "with --yes only a pinned hotplug.enclosure_unique_id or --enclosure UUID" in res.stderr
    ), res.stderr
    pinned = invoke(
        "install", "--profile", "rtx4090", "--from", str(FRESH), "--dry-run", "--enclosure", BOX
    )
    assert pinned.returncode == 0, pinned.stderr
    assert (
        f"install enrols Sonnet Technologies, Inc. eGFX Breakaway Box 750ex ({BOX}) (pinned)"
        in (pinned.stderr)
    )


def test_an_authorized_enclosure_needs_no_enrolment() -> None:
    assert not enrol.needs_enrolment(detect_host(RecordedHost(AUTHORIZED)))
    res = invoke("install", "--profile", "rtx4090", "--from", str(AUTHORIZED), "--dry-run")
    assert res.returncode == 0 and "wait for authorization" not in res.stderr


def test_a_bad_enclosure_flag_is_an_error_before_anything() -> None:
    res = invoke("install", "--profile", "rtx4090", "--from", str(FRESH), "--dry-run",
                  "--enclosure", "not-a-uuid")  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.startswith("error: --enclosure: 'not-a-uuid' is not a Thunderbolt unique_id")
    assert "\nhint: " in res.stderr and "Traceback" not in res.stderr


# --- the sysfs write, against a copy of the recorded tree ----------------------------------


def _tree_hashes(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def laptop(tmp_path: Path) -> Path:
    root = tmp_path / "laptop"
    shutil.copytree(FRESH / "root", root, symlinks=True)
    return root


class KernelStandIn:
    """Stands in for the kernel: once the enclosure is authorized, the tunnel comes up and the
    recorded tree of the same machine with the enclosure authorized takes the place of /sys."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.up = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def arm(self) -> KernelStandIn:
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            if (self.root / BOX_SYSFS).read_text().strip() == "1":
                shutil.copytree(AUTHORIZED / "root/sys", self.root / "sys.new", symlinks=True)
                (self.root / "sys").rename(self.root / "sys.old")
                (self.root / "sys.new").rename(self.root / "sys")
                self.up.set()
                return
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


@pytest.fixture
def kernel(laptop: Path) -> Iterator[KernelStandIn]:
    stand_in = KernelStandIn(laptop)
    yield stand_in
    stand_in.stop()


def test_without_bolt_the_one_device_is_authorized_in_sysfs_and_nothing_else(
    laptop: Path, kernel: KernelStandIn
) -> None:
    host = RootHost(laptop)
    facts = detect_host(host)
    before = _tree_hashes(laptop)
    (dev,) = enrol.candidates(facts)
    said = enrol.apply_enrolment(
        host, StatePaths.for_root(laptop), dev, facts, load_profile("rtx4090").hotplug
    )
    assert said == (
        f"authorized Sonnet Technologies, Inc. eGFX Breakaway Box 750ex ({BOX}) "
        "(/sys/bus/thunderbolt/devices/0-1/authorized = 1)"
    )
    after = _tree_hashes(laptop)
    assert {p for p in after if after[p] != before.get(p)} == {
        "sys/devices/pci0000:00/0000:00:01.0/0000:05:00.0/0000:06:00.0/0000:07:00.0/domain0/0-0/"
        "0-1/authorized"
    }  # exactly one attribute written, nothing created
    assert set(after) == set(before)
    kernel.arm()
    seen = enrol.wait_for_egpu(host, 20)
    assert kernel.up.is_set()
    assert seen is not None and [g.name for g in seen.nvidia_gpus] == ["GeForce RTX 4090"]


def test_no_gpu_after_enrolling_is_said_within_the_bound(laptop: Path) -> None:
    host = RootHost(laptop)
    started = time.monotonic()
    assert enrol.wait_for_egpu(host, 0.5, sleep=lambda _s: time.sleep(0.05)) is None
    assert time.monotonic() - started < 30


def test_security_level_secure_without_bolt_needs_bolt(laptop: Path) -> None:
    from egpu_setup.errors import ActionRequired

    host = RootHost(laptop)
    facts = detect_host(host)
    secure = replace(
        facts,
        thunderbolt=replace(
            facts.thunderbolt,
            domains=tuple(replace(d, security="secure") for d in facts.thunderbolt.domains),
        ),
    )
    with pytest.raises(ActionRequired, match="needs bolt"):
        enrol.apply_enrolment(
            host, StatePaths.for_root(laptop), enrol.candidates(secure)[0], secure,
            load_profile("rtx4090").hotplug,
        )  # fmt: skip
    assert (laptop / BOX_SYSFS).read_text() == "0\n"


def test_with_bolt_it_enrols_through_the_executor_and_rollback_knows_the_undo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "boltctl.log"
    stand_in = bindir / "boltctl"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    stand_in.chmod(0o755)
    # where root looks for a program (host/process.SYSTEM_PATH), never the caller's PATH
    monkeypatch.setattr(process, "SYSTEM_PATH", f"{bindir}:{process.SYSTEM_PATH}")
    facts = detect_host(RecordedHost(FRESH))
    paths = StatePaths.for_root(Path("/"))  # EGPU_SETUP_STATE_DIR: the test's own state
    said = enrol.apply_enrolment(
        LiveHost(), paths, enrol.candidates(facts)[0], facts, load_profile("rtx4090").hotplug
    )
    assert said.startswith("enrolled Sonnet Technologies, Inc. eGFX Breakaway Box 750ex")
    assert said.endswith("in bolt with policy iommu")  # the domain has IOMMU DMA protection
    assert log.read_text() == f"enroll --policy iommu {BOX}\n"
    manifest = Manifest.load(paths)
    assert [c["undo"] for c in manifest.commands] == [["boltctl", "forget", BOX]]


def test_whether_bolt_can_enrol_is_decided_in_one_place(
    laptop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image cannot enrol even with bolt installed in it (no boltd in a chroot); a recording
    cannot say; this machine can when boltctl is where root looks for programs (SYSTEM_PATH).
    The render plan asks the same."""
    from egpu_setup.install import inputs

    (laptop / "usr/bin").mkdir(parents=True, exist_ok=True)
    (laptop / "usr/bin/boltctl").write_text("#!/bin/sh\n")
    (laptop / "usr/bin/boltctl").chmod(0o755)
    assert RootHost(laptop).which("boltctl") == "/usr/bin/boltctl"
    assert enrol.bolt_can_enrol(RootHost(laptop)) is False
    assert enrol.bolt_can_enrol(RecordedHost(FRESH)) is None
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setattr(process, "SYSTEM_PATH", str(bindir))
    assert enrol.bolt_can_enrol(LiveHost()) is False
    (bindir / "boltctl").write_text("#!/bin/sh\n")
    (bindir / "boltctl").chmod(0o755)
    assert enrol.bolt_can_enrol(LiveHost()) is True
    assert vars(inputs)["bolt_can_enrol"] is enrol.bolt_can_enrol  # no second copy of the rule


def test_firstboot_on_the_fresh_laptop_enrols_the_pinned_box_and_sees_the_gpu(
    laptop: Path, kernel: KernelStandIn
) -> None:
    kernel.arm()
    res = invoke("firstboot", "--profile", "rtx4090", "--root", str(laptop), "--enclosure", BOX,
                  "--wait", "20", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["outcome"] == "ready" and out["enrolled"] == BOX
    report = json.loads(Path(out["report"]).read_text())
    assert report["schema"] == "egpu-setup/firstboot/1"
    assert report["devices"] == [f"Sonnet Technologies, Inc. eGFX Breakaway Box 750ex ({BOX})"]
    assert report["steps"] == [
        f"authorized Sonnet Technologies, Inc. eGFX Breakaway Box 750ex ({BOX}) "
        "(/sys/bus/thunderbolt/devices/0-1/authorized = 1)"
    ]


def test_firstboot_enrols_nothing_the_profile_does_not_name(laptop: Path) -> None:
    res = invoke("firstboot", "--profile", "rtx4090", "--root", str(laptop), "--wait", "1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("not-enrolled: no eGPU is visible and the profile names none")
    assert (laptop / BOX_SYSFS).read_text() == "0\n"


def test_firstboot_without_an_egpu_ends_cleanly_and_keeps_the_marker(tmp_path: Path) -> None:
    root = tmp_path / "machine"
    shutil.copytree(FIXTURES / "intel-igpu-only" / "root", root, symlinks=True)
    marker = root / "var/lib/egpu-setup/firstboot-pending"
    marker.parent.mkdir(parents=True)
    marker.write_text("armed\n")
    res = invoke("firstboot", "--profile", "rtx4090", "--root", str(root), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["outcome"] == "no-egpu" and marker.exists()
    assert "no eGPU is connected" in json.loads(Path(out["report"]).read_text())["message"]


@pytest.mark.parametrize("host", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_a_dry_run_says_once_what_waits_for_authorization(host: str) -> None:
    """Over every recorded host: where a device waits for authorization, the dry run names it in
    one statement (what install enrols or asks), never also "none is authorized" beside it."""
    facts = detect_host(RecordedHost(FIXTURES / host))
    if not enrol.needs_enrolment(facts):
        return
    res = invoke("install", "--profile", "rtx4090", "--from", str(FIXTURES / host), "--dry-run")
    assert res.returncode == 0, res.stderr
    naming = [
        line
        for line in res.stderr.splitlines()
        if any(d.unique_id and d.unique_id in line for d in enrol.candidates(facts))
    ]
    assert len(naming) == 1 and "install asks which one" in naming[0], res.stderr
    assert "none is authorized" not in res.stderr, res.stderr


def _model_profile(tmp_path: Path, accept_no_iommu: bool) -> str:
    import yaml

    profile = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "profiles/rtx4090.yaml").read_text()
    )
    profile["hotplug"]["first_boot_enrol_model"] = "eGFX Breakaway Box 750ex"
    profile["hotplug"]["accept_no_iommu"] = accept_no_iommu
    path = tmp_path / f"model-{accept_no_iommu}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


IOMMU = "sys/bus/thunderbolt/devices/domain0/iommu_dma_protection"


def test_firstboot_enrols_the_first_of_the_model_where_the_iommu_protects(
    laptop: Path, kernel: KernelStandIn, tmp_path: Path
) -> None:
    assert (laptop / IOMMU).read_text().strip() == "1"  # as recorded on that notebook
    kernel.arm()
    res = invoke("firstboot", "--profile", _model_profile(tmp_path, False), "--root",
                  str(laptop), "--wait", "20", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["enrolled"] == BOX


@pytest.mark.parametrize("accept", [False, True])
def test_without_iommu_protection_the_model_is_enrolled_only_when_the_risk_is_accepted(
    laptop: Path, kernel: KernelStandIn, tmp_path: Path, accept: bool
) -> None:
    (laptop / IOMMU).write_text("0\n")  # the same laptop with Kernel DMA Protection off
    kernel.arm()
    res = invoke("firstboot", "--profile", _model_profile(tmp_path, accept), "--root",
                  str(laptop), "--wait", "20", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    if accept:
        assert out["enrolled"] == BOX, out
    else:
        assert out["outcome"] == "not-enrolled" and "no IOMMU DMA protection" in out["message"]
        assert (laptop / BOX_SYSFS).read_text() == "0\n" and not kernel.up.is_set()


# --- hotplug.first_boot_enrol: by the DROM's vendor:device ids, or the first seen ------------

DOCK_IDS = replace(DOCK, vendor_id="00d4", device_id="b070")
CORE_X_IDS = replace(CORE_X, vendor_id="0127", device_id="0002")


def test_the_id_list_takes_the_first_device_of_those_ids_only() -> None:
    policy = enrol.EnrolPolicy(first_of_ids=(("0127", "0002"),))
    picked = enrol.choose([DOCK_IDS, CORE_X_IDS], policy)
    assert picked.device == CORE_X_IDS and picked.how == "ids", picked
    assert "0x127:0x2" in picked.reason and "trusted for the ids it reports" in picked.reason
    nothing = enrol.choose([DOCK_IDS], policy)
    assert nothing.device is None and nothing.how == "none"
    # a pasted report without sysfs has no ids: never matched by them
    assert enrol.choose([DOCK, CORE_X], policy).device is None


def test_first_seen_takes_one_device_in_sysfs_order_and_a_pin_still_wins() -> None:
    later = replace(DOCK_IDS, sysfs_name="1-3")
    picked = enrol.choose([later, CORE_X_IDS], enrol.EnrolPolicy(first_seen=True))
    assert picked.device == CORE_X_IDS and picked.how == "first-seen", picked
    pinned = enrol.EnrolPolicy(pinned=(later.unique_id or "",), first_seen=True)
    assert enrol.choose([later, CORE_X_IDS], pinned).how == "pinned"
    assert enrol.choose([], enrol.EnrolPolicy(first_seen=True)).device is None


def _policy_profile(tmp_path: Path, value: object, accept_no_iommu: bool = False) -> str:
    import yaml

    profile = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "profiles/rtx4090.yaml").read_text()
    )
    profile["hotplug"]["first_boot_enrol"] = value
    profile["hotplug"]["accept_no_iommu"] = accept_no_iommu
    path = tmp_path / f"policy-{accept_no_iommu}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


@pytest.mark.parametrize("value", [["0x8:0x36"], ["0x0008:0x0036", "0x27:0x1"], "first-seen"])
def test_firstboot_enrols_by_the_ids_sysfs_reports_or_the_first_seen(
    laptop: Path, kernel: KernelStandIn, tmp_path: Path, value: object
) -> None:
    # the recorded box reports vendor 0x8, device 0x36 (sysfs `vendor`, `device`)
    dev = laptop / "sys/bus/thunderbolt/devices/0-1"
    assert ((dev / "vendor").read_text(), (dev / "device").read_text()) == ("0x8\n", "0x36\n")
    kernel.arm()
    res = invoke("firstboot", "--profile", _policy_profile(tmp_path, value), "--root",
                  str(laptop), "--wait", "20", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["enrolled"] == BOX, res.stdout


def test_firstboot_enrols_nothing_whose_ids_are_not_listed(laptop: Path, tmp_path: Path) -> None:
    before = _tree_hashes(laptop)
    res = invoke("firstboot", "--profile", _policy_profile(tmp_path, ["0x27:0x1"]), "--root",
                  str(laptop), "--wait", "1", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["outcome"] == "not-enrolled"
    assert (laptop / BOX_SYSFS).read_text() == "0\n"
    changed = {k for k, v in _tree_hashes(laptop).items() if before.get(k) != v}
    assert changed <= {"var/lib/egpu-setup/firstboot.json"}, changed


@pytest.mark.parametrize("accept", [False, True])
def test_first_seen_without_iommu_protection_needs_the_risk_accepted(
    laptop: Path, kernel: KernelStandIn, tmp_path: Path, accept: bool
) -> None:
    (laptop / IOMMU).write_text("0\n")
    kernel.arm()
    res = invoke("firstboot", "--profile", _policy_profile(tmp_path, "first-seen", accept),
                  "--root", str(laptop), "--wait", "20", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    if accept:
        assert out["enrolled"] == BOX, out
    else:
        assert out["outcome"] == "not-enrolled", out
        assert "hotplug.first_boot_enrol" in out["message"] and "IOMMU" in out["message"]
        assert (laptop / BOX_SYSFS).read_text() == "0\n" and not kernel.up.is_set()


@pytest.mark.parametrize(
    "value", ["all", ["0x8-0x36"], ["8:36"], ["0x12345:0x1"], ["0x8:0x36", "0x8:0x36"], True]
)
def test_a_bad_enrol_policy_is_refused_with_a_hint_and_nothing_written(
    tmp_path: Path, value: object
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    res = invoke("firstboot", "--profile", _policy_profile(tmp_path, value), "--root",
                  str(root))  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "first_boot_enrol" in res.stderr and "\nhint: " in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not any(root.iterdir())
