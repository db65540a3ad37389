"""`eject` against a fake sysfs/proc under a root directory: the exact writes, the refusals."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from egpu_setup.detect.facts import Gpu, HostFacts, TbDevice
from egpu_setup.errors import BusyError, EgpuSetupError, UsageError
from egpu_setup.execute.eject import EjectPlan, EjectStep, plan_eject, run_eject
from egpu_setup.host.machine import RecordedHost, RootHost
from helpers.cli_runner import invoke
from helpers.render_cases import CORE_X_UUID, DEBIAN12_TB3_4090

CHAIN = "sys/devices/pci0000:00/0000:00:07.0/0000:3a:00.0/0000:3b:01.0"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_root(tmp: Path, *, deauth: str = "1", tb_bridges: bool = True) -> Path:
    """A machine with a TB3 RTX 4090 (VGA + audio functions), bolt-style domain, driver loaded.

    tb_bridges: the enclosure's PCIe switch is an Alpine Ridge (8086:15d3), so detect sees a
    Thunderbolt link; False leaves the bridges without ids: connection "unknown"."""
    root = tmp / "root"
    bridge_dirs = {
        "0000:00:07.0": root / "sys/devices/pci0000:00/0000:00:07.0",
        "0000:3a:00.0": root / "sys/devices/pci0000:00/0000:00:07.0/0000:3a:00.0",
        "0000:3b:01.0": root / CHAIN,
    }
    for addr, d in bridge_dirs.items():
        if tb_bridges and addr != "0000:00:07.0":
            _write(d / "vendor", "0x8086\n")
            _write(d / "device", "0x15d3\n")
            _write(d / "class", "0x060400\n")
            link = root / "sys/bus/pci/devices" / addr
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(d, link.parent))
    for fn, dev_id, cls in (
        ("0000:3c:00.0", "0x2684", "0x030000"),
        ("0000:3c:00.1", "0x22ba", "0x040300"),
    ):
        d = root / CHAIN / fn
        for attr, value in {
            "vendor": "0x10de",
            "device": dev_id,
            "class": cls,
            "remove": "",
            "removable": "removable",
        }.items():
            _write(d / attr, value + ("\n" if value else ""))
        link = root / "sys/bus/pci/devices" / fn
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(d, link.parent))
    card = root / CHAIN / "0000:3c:00.0/drm/card1"
    _write(card / "card1-DP-1/status", "disconnected\n")
    _write(card / "card1-DP-1/enabled", "disabled\n")
    _write(card / "card1-HDMI-A-1/status", "disconnected\n")
    (root / CHAIN / "0000:3c:00.0/drm/renderD129").mkdir(parents=True)
    tb = root / "sys/bus/thunderbolt/devices"
    _write(tb / "domain0/deauthorization", deauth + "\n")
    _write(tb / "domain0/security", "user\n")
    _write(tb / "0-1/authorized", "1\n")
    _write(tb / "0-1/unique_id", CORE_X_UUID + "\n")
    _write(
        root / "proc/modules",
        "nvidia_uvm 1970176 0 - Live 0x0\nnvidia_drm 90112 0 - Live 0x0\n"
        "nvidia_modeset 1314816 1 nvidia_drm, Live 0x0\nnvidia 56807424 2 nvidia_uvm,nvidia_modeset, Live 0x0\n"
        "snd_hda_intel 61440 0 - Live 0x0\n",
    )
    _write(
        root / "proc/driver/nvidia/gpus/0000:3c:00.0/information",
        "Model: NVIDIA GeForce RTX 4090\nDevice Minor: 0\n",
    )
    _process(root, 1, "systemd", ["/dev/null"])
    _write(root / "etc/systemd/system/egpu-setup-persistenced.service", "[Unit]\n")
    return root


def _process(root: Path, pid: int, comm: str, fds: list[str], maps: str = "") -> None:
    p = root / "proc" / str(pid)
    _write(p / "comm", comm + "\n")
    _write(p / "maps", maps)
    (p / "fd").mkdir(parents=True, exist_ok=True)
    for i, target in enumerate(fds):
        (p / "fd" / str(i)).symlink_to(target)


EGPU = DEBIAN12_TB3_4090.gpus[1]


def test_eject_writes_exactly_remove_then_deauthorize(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    _process(
        root, 812, "nvidia-persiste", ["/dev/nvidiactl", "/dev/nvidia0"]
    )  # stopped, not a blocker
    (root / "proc/812/exe").symlink_to("/usr/bin/nvidia-persistenced")  # the daemon's binary
    host = RootHost(root)
    plan = plan_eject(host, DEBIAN12_TB3_4090)
    assert plan.blockers == ()
    assert plan.functions == ("0000:3c:00.0", "0000:3c:00.1")
    assert plan.steps == (
        EjectStep(
            "command",
            "stop nvidia-persistenced (it holds /dev/nvidia*)",
            argv=("systemctl", "stop", "egpu-setup-persistenced.service"),
        ),
        EjectStep(
            "command",
            "unload nvidia_uvm, nvidia_drm, nvidia_modeset, nvidia",
            argv=("modprobe", "-r", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia"),
        ),
        EjectStep(
            "write",
            "remove PCI function 0000:3c:00.1",
            path="/sys/bus/pci/devices/0000:3c:00.1/remove",
            value="1\n",
        ),
        EjectStep(
            "write",
            "remove PCI function 0000:3c:00.0",
            path="/sys/bus/pci/devices/0000:3c:00.0/remove",
            value="1\n",
        ),
        EjectStep(
            "write",
            "de-authorize Thunderbolt device 0-1 (Core X Chroma)",
            path="/sys/bus/thunderbolt/devices/0-1/authorized",
            value="0\n",
        ),
    )
    said: list[str] = []
    done = run_eject(host, plan, say=said.append)
    assert done == plan.steps[2:]  # no services or kernel in a directory image
    assert (root / CHAIN / "0000:3c:00.0/remove").read_text() == "1\n"
    assert (root / CHAIN / "0000:3c:00.1/remove").read_text() == "1\n"
    assert (root / "sys/bus/thunderbolt/devices/0-1/authorized").read_text() == "0\n"
    assert "  skipped under --root: modprobe -r nvidia_uvm nvidia_drm nvidia_modeset nvidia" in said


def test_a_cuda_process_blocks_and_is_named_nothing_written(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    _process(root, 4242, "python3", ["/dev/pts/0", "/dev/nvidia-uvm", "/dev/nvidiactl"])
    _process(root, 4300, "blender", [], maps="7f00-7f10 rw-s 00000000 00:05 123  /dev/nvidia0\n")
    plan = plan_eject(RootHost(root), DEBIAN12_TB3_4090)
    assert plan.users == (
        "pid 4242 (python3): /dev/nvidia-uvm, /dev/nvidiactl",
        "pid 4300 (blender): /dev/nvidia0",
    )
    with pytest.raises(BusyError) as exc:
        run_eject(RootHost(root), plan)
    assert exc.value.exit_code == 5 and "pid 4242 (python3)" in exc.value.message
    assert (root / CHAIN / "0000:3c:00.0/remove").read_text() == ""
    assert (root / "sys/bus/thunderbolt/devices/0-1/authorized").read_text() == "1\n"


def test_a_driven_display_blocks(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    card = root / CHAIN / "0000:3c:00.0/drm/card1"
    _write(card / "card1-HDMI-A-1/status", "connected\n")
    _write(card / "card1-DP-1/status", "connected\n")  # connected but disabled: not driven
    plan = plan_eject(RootHost(root), DEBIAN12_TB3_4090)
    assert plan.blockers == ("drives display card1-HDMI-A-1",)
    _process(root, 900, "Xorg", ["/dev/dri/card1"])
    assert plan_eject(RootHost(root), DEBIAN12_TB3_4090).users == (
        "pid 900 (Xorg): /dev/dri/card1",
    )


def test_with_a_second_nvidia_gpu_only_this_card_counts_and_modules_stay(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    internal = Gpu(
        "0000:01:00.0", vendor="nvidia", vendor_id="10de", device_id="28e0", external=False
    )
    facts = replace(DEBIAN12_TB3_4090, gpus=(internal, EGPU))
    _process(root, 77, "python3", ["/dev/nvidiactl", "/dev/nvidia1"])  # uses the internal GPU
    plan = plan_eject(RootHost(root), facts)
    assert plan.users == ()
    assert not [s for s in plan.steps if s.argv[:2] == ("modprobe", "-r")]
    assert any("driver stays loaded" in n for n in plan.notes)


def test_no_deauthorization_support_is_said_not_written(tmp_path: Path) -> None:
    root = fake_root(tmp_path, deauth="0")
    plan = plan_eject(RootHost(root), DEBIAN12_TB3_4090)
    assert not [s for s in plan.steps if s.path.endswith("/authorized")]
    assert any("cannot de-authorize" in n for n in plan.notes)


def test_nothing_attached_is_an_error(tmp_path: Path) -> None:
    facts = replace(DEBIAN12_TB3_4090, gpus=DEBIAN12_TB3_4090.gpus[:1])
    with pytest.raises(EgpuSetupError, match="nothing to eject"):
        plan_eject(RootHost(fake_root(tmp_path)), facts)


def test_missing_sysfs_attribute_is_an_execution_error_not_a_new_file(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    plan = plan_eject(RootHost(root), DEBIAN12_TB3_4090)
    (root / CHAIN / "0000:3c:00.1/remove").unlink()
    with pytest.raises(EgpuSetupError, match="cannot write"):
        run_eject(RootHost(root), plan)
    assert not (root / CHAIN / "0000:3c:00.1/remove").exists()


def test_a_recorded_host_is_never_written(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    root.rename(bundle / "root")
    host = RecordedHost(bundle)
    plan = plan_eject(host, DEBIAN12_TB3_4090)
    with pytest.raises(UsageError, match="recorded host"):
        run_eject(host, plan)


def test_eject_command_needs_yes_without_a_terminal(tmp_path: Path) -> None:
    res = invoke("eject", "--root", str(fake_root(tmp_path)))
    assert res.returncode in (1, 2), res.stderr
    assert res.stderr.startswith("error: ") or "\nerror: " in res.stderr
    assert "Traceback" not in res.stderr
    assert (tmp_path / "root" / CHAIN / "0000:3c:00.0/remove").read_text() == ""


def test_eject_command_end_to_end_under_root(tmp_path: Path) -> None:
    """detect -> plan -> writes, through the real command line."""
    root = fake_root(tmp_path)
    res = invoke("eject", "--yes", "--root", str(root))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "now safe to unplug GeForce RTX 4090 (0000:3c:00.0)\n"
    assert (root / CHAIN / "0000:3c:00.0/remove").read_text() == "1\n"
    assert (root / CHAIN / "0000:3c:00.1/remove").read_text() == "1\n"
    assert (root / "sys/bus/thunderbolt/devices/0-1/authorized").read_text() == "0\n"


def test_eject_command_refuses_with_exit_5_naming_the_process(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    _process(root, 4242, "python3", ["/dev/nvidia0"])
    res = invoke("eject", "--yes", "--root", str(root))
    assert res.returncode == 5
    assert "error: not safe to unplug" in res.stderr and "pid 4242 (python3)" in res.stderr
    assert "hint: close those programs" in res.stderr
    assert (root / CHAIN / "0000:3c:00.0/remove").read_text() == ""


# -- which Thunderbolt device is the enclosure ----------------------------------------------------

DOCK = TbDevice(
    name="Thunderbolt Dock",
    vendor="Dell",
    unique_id="d4030000-0000-0000-0000-00000000dd01",
    authorized=True,
    sysfs_name="0-3",
    domain="domain0",
)


def _with_devices(*devices: TbDevice, connection: str = "thunderbolt") -> HostFacts:
    egpu = replace(EGPU, connection=connection)
    return replace(
        DEBIAN12_TB3_4090,
        gpus=(DEBIAN12_TB3_4090.gpus[0], egpu),
        thunderbolt=replace(DEBIAN12_TB3_4090.thunderbolt, devices=devices),
    )


def _deauth_paths(plan: EjectPlan) -> list[str]:
    return [s.path for s in plan.steps if s.path.endswith("/authorized")]


def test_unknown_connection_never_deauthorizes_and_says_so(tmp_path: Path) -> None:
    """The review's failure: connection unknown, a dock is the only device -> it was cut off."""
    root = fake_root(tmp_path)
    (root / "sys/bus/thunderbolt/devices/0-1/unique_id").write_text(f"{DOCK.unique_id}\n")
    dock_only = replace(DOCK, sysfs_name="0-1")
    plan = plan_eject(RootHost(root), _with_devices(dock_only, connection="unknown"))
    assert _deauth_paths(plan) == []
    assert [s.path for s in plan.steps if s.kind == "write"] == [
        "/sys/bus/pci/devices/0000:3c:00.1/remove",
        "/sys/bus/pci/devices/0000:3c:00.0/remove",
    ]
    (note,) = [n for n in plan.notes if "stays authorized" in n]
    assert "'unknown'" in note and "only the PCI device is removed" in note
    run_eject(RootHost(root), plan)
    assert (root / "sys/bus/thunderbolt/devices/0-1/authorized").read_text() == "1\n"


def test_unknown_connection_end_to_end_leaves_the_device_authorized(tmp_path: Path) -> None:
    """Through detect: bridges without Thunderbolt ids -> connection unknown -> no de-auth."""
    root = fake_root(tmp_path, tb_bridges=False)
    res = invoke("eject", "--yes", "--root", str(root))
    assert res.returncode == 0, res.stderr
    assert "stays authorized" in res.stderr
    assert (root / CHAIN / "0000:3c:00.0/remove").read_text() == "1\n"
    assert (root / "sys/bus/thunderbolt/devices/0-1/authorized").read_text() == "1\n"


def test_a_dock_next_to_the_enclosure_is_ambiguous_and_nothing_is_deauthorized(
    tmp_path: Path,
) -> None:
    root = fake_root(tmp_path)
    core_x = DEBIAN12_TB3_4090.thunderbolt.devices[0]
    plan = plan_eject(RootHost(root), _with_devices(core_x, DOCK))
    assert _deauth_paths(plan) == []
    (note,) = [n for n in plan.notes if "stays authorized" in n]
    assert "0-1 (Core X Chroma)" in note and "0-3 (Thunderbolt Dock)" in note
    # An unauthorized device is no candidate: its tunnel cannot carry the visible GPU.
    plan = plan_eject(RootHost(root), _with_devices(core_x, replace(DOCK, authorized=False)))
    assert _deauth_paths(plan) == ["/sys/bus/thunderbolt/devices/0-1/authorized"]


def test_the_kernel_link_root_port_to_nhi_narrows_to_the_gpus_domain(tmp_path: Path) -> None:
    """USB4 hosts: root port -> NHI device link (supplier:pci:*, drivers/thunderbolt/acpi.c);
    the dock on the other controller (domain1) is no candidate."""
    root = fake_root(tmp_path)
    nhi0 = root / "sys/devices/pci0000:00/0000:00:0d.2"
    nhi1 = root / "sys/devices/pci0000:00/0000:00:0d.3"
    (nhi0 / "domain0").mkdir(parents=True)
    (nhi1 / "domain1").mkdir(parents=True)
    devices = root / "sys/bus/pci/devices"
    for addr, d in (("0000:00:0d.2", nhi0), ("0000:00:0d.3", nhi1)):
        (devices / addr).symlink_to(os.path.relpath(d, devices))
    port = root / "sys/devices/pci0000:00/0000:00:07.0"
    (port / "supplier:pci:0000:00:0d.2").symlink_to("../../virtual/devlink/x")
    (devices / "0000:00:07.0").symlink_to(os.path.relpath(port, devices))
    core_x = DEBIAN12_TB3_4090.thunderbolt.devices[0]
    other = replace(DOCK, sysfs_name="1-1", domain="domain1")
    plan = plan_eject(RootHost(root), _with_devices(core_x, other))
    assert _deauth_paths(plan) == ["/sys/bus/thunderbolt/devices/0-1/authorized"]
    # Same controller: the link cannot tell them apart.
    plan = plan_eject(RootHost(root), _with_devices(core_x, DOCK))
    assert _deauth_paths(plan) == []
