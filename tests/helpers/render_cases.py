"""Hosts and profiles the render tests share (tests/render/test_render.py, tests/render/test_checkers.py).

The hosts are written by hand from real machines' sysfs and boltctl output (PCI topology of a
TB3 enclosure, a USB4 'secure' controller, a VMD domain 10000 for an OCuLink dock), because a
render needs only the facts; tests/fixtures/hosts/ bundles go through detect in tests/render/test_render.py.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from egpu_setup.detect.facts import (
    Gpu,
    HostFacts,
    Link,
    NvidiaFacts,
    OsFacts,
    TbDevice,
    TbDomain,
    ThunderboltFacts,
)
from egpu_setup.profile.types import (
    DriverConstraints,
    Expectations,
    GpuSpec,
    HotplugOptions,
    PowerAdvice,
    Profile,
    TorchConstraints,
)
from egpu_setup.render.files import BIN_HOTPLUG, RenderedFile, render_set
from egpu_setup.resolve.resolution import Resolution

CORE_X_UUID = "c9030000-0080-7708-2307-a11e8c1b3d12"
AG02_UUID = "d1030000-0090-8d18-a3b2-6c0a1c5f4e01"


def profile(
    name: str = "rtx4090",
    device_ids: tuple[str, ...] = ("2684",),
    mode: str = "compute",
    **hotplug: object,
) -> Profile:
    hp: dict[str, Any] = {
        "thunderbolt_policy": "iommu",
        "runtime_pm_off": True,
        "persistenced": True,
        "enclosure_unique_id": None,
        "accept_no_iommu": False,
        "connection": "thunderbolt",
        **hotplug,
    }
    return Profile(
        name=name,
        description="test profile",
        path=f"/tmp/{name}.yaml",
        gpu=GpuSpec(device_ids, "GeForce RTX", "Ada Lovelace", "8.9", 24.0),
        expect=Expectations(None, None, None, None, {}, 100, 0.9, 87.0, None),
        power=PowerAdvice(None, None),
        driver=DriverConstraints(None, None, None, "auto"),
        torch=TorchConstraints(None, None, ()),
        mode=mode,
        hotplug=HotplugOptions(**hp),
    )


def _gpu(address: str, device_id: str, connection: str, **kw: Any) -> Gpu:
    return Gpu(
        pci_address=address,
        vendor="nvidia",
        vendor_id="10de",
        device_id=device_id,
        external=True,
        connection=connection,
        class_id="030000",
        **kw,
    )


INTERNAL_IGPU = Gpu(
    "0000:00:02.0",
    vendor="intel",
    vendor_id="8086",
    device_id="a7a0",
    external=False,
    connection="pcie",
    boot_vga=True,
    class_id="030000",
)

DEBIAN12_TB3_4090 = HostFacts(
    os=OsFacts(
        id="debian",
        version_id="12",
        kernel="6.1.0-41-amd64",
        arch="x86_64",
        session_type="tty",
        codename="bookworm",
    ),
    gpus=(
        INTERNAL_IGPU,
        _gpu(
            "0000:3c:00.0",
            "2684",
            "thunderbolt",
            removable="removable",
            bridges=("0000:00:07.0", "0000:3a:00.0", "0000:3b:01.0"),
            link=Link(2.5, 4, 16.0, 16),
        ),
    ),
    nvidia=NvidiaFacts(
        driver_version="535.261.03",
        module_loaded=True,
        module_flavour="proprietary",
        nouveau_loaded=False,
    ),
    thunderbolt=ThunderboltFacts(
        domains=(TbDomain("domain0", "user", True),),
        devices=(
            TbDevice(
                name="Core X Chroma",
                vendor="Razer",
                unique_id=CORE_X_UUID,
                authorized=True,
                generation=3,
                policy="iommu",
                sysfs_name="0-1",
                domain="domain0",
            ),
        ),
    ),
    source="recorded",
)

UBUNTU2404_USB4_5090 = HostFacts(
    os=OsFacts(
        id="ubuntu",
        version_id="24.04",
        kernel="6.8.0-51-generic",
        arch="x86_64",
        session_type="wayland",
        id_like=("debian",),
        codename="noble",
    ),
    gpus=(
        INTERNAL_IGPU,
        _gpu(
            "0000:05:00.0",
            "2b85",
            "usb4",
            removable="removable",
            bridges=("0000:00:0d.2", "0000:03:00.0", "0000:04:01.0"),
        ),
    ),
    nvidia=NvidiaFacts(driver_version="570.133.07", module_loaded=True, module_flavour="open"),
    thunderbolt=ThunderboltFacts(
        domains=(TbDomain("domain0", "secure", False), TbDomain("domain1", "secure", False)),
        devices=(
            TbDevice(
                name="AG02",
                vendor="AOOSTAR",
                unique_id=AG02_UUID,
                authorized=True,
                generation=4,
                policy=None,
                sysfs_name="1-1",
                domain="domain1",
            ),
        ),
    ),
    source="recorded",
)

FEDORA41_OCULINK_3090 = HostFacts(
    os=OsFacts(
        id="fedora",
        version_id="41",
        kernel="6.11.4-301.fc41.x86_64",
        arch="x86_64",
        session_type="x11",
    ),
    gpus=(
        INTERNAL_IGPU,
        _gpu("10000:e1:00.0", "2204", "oculink", removable="fixed", bridges=("10000:e0:06.0",)),
    ),
    nvidia=NvidiaFacts(driver_version=None, module_loaded=False, nouveau_loaded=True),
    source="recorded",
)

# A lab image rendered before the enclosure was ever connected: profile ids only.
DEBIAN12_NO_EGPU = HostFacts(
    os=OsFacts(id="debian", version_id="12", kernel="6.1.0-41-amd64", arch="x86_64"),
    gpus=(INTERNAL_IGPU,),
    thunderbolt=ThunderboltFacts(domains=(TbDomain("domain0", "user", True),)),
    source="recorded",
)


def rendered_files(
    facts: HostFacts, prof: Profile, resolution: object, mode: str, **options: Any
) -> tuple[RenderedFile, ...]:
    """The files render_set renders (the commands and notes left out); `resolution` may be a
    stand-in holding only what render reads (tests/render/test_render.py)."""
    resolved = cast("Resolution | None", resolution)
    return render_set(facts, prof, resolved, mode, **options).files


# name -> (facts, profile, render options, modes)
CASES: dict[str, tuple[HostFacts, Profile, dict[str, Any], tuple[str, ...]]] = {
    "debian12-tb3-rtx4090": (DEBIAN12_TB3_4090, profile(), {}, ("compute", "display")),
    "debian12-tb3-rtx4090-nobolt": (
        DEBIAN12_TB3_4090,
        profile(enclosure_unique_id=CORE_X_UUID),
        {"bolt_available": False, "bar_allocation_failed": True},
        ("compute",),
    ),
    "ubuntu2404-usb4-rtx5090": (
        UBUNTU2404_USB4_5090,
        profile("rtx5090", ("2b85",), connection="usb4", enclosure_unique_id=AG02_UUID),
        {},
        ("compute", "display"),
    ),
    "fedora41-oculink-rtx3090": (
        FEDORA41_OCULINK_3090,
        profile("rtx3090", ("2204",), connection="oculink", persistenced=False),
        {"bar_allocation_failed": True},
        ("compute", "display"),
    ),
    "debian12-lab-image": (
        DEBIAN12_NO_EGPU,
        profile(enclosure_unique_id=CORE_X_UUID),
        {},
        ("compute",),
    ),
}


def with_os(facts: HostFacts, **os_fields: Any) -> HostFacts:
    return replace(facts, os=replace(facts.os, **os_fields))


# -- the hot-plug helper against a fake sysfs (tests/render/test_render.py, tests/render/test_checkers.py) --


def fake_sys(
    tmp: Path, *, authorized: str = "1", driver: bool = True, slot: str = "0000:3c:00"
) -> Path:
    """A sysfs tree with the TB3 RTX 4090 of DEBIAN12_TB3_4090 (VGA + audio) at `slot`."""
    sysfs = tmp / "sys"
    chain = sysfs / "devices/pci0000:00/0000:00:07.0/0000:3a:00.0/0000:3b:01.0"
    for dev in (f"{slot}.0", f"{slot}.1"):
        d = chain / dev
        (d / "power").mkdir(parents=True)
        (d / "power/control").write_text("auto\n")
    for bridge in (chain, chain.parent, chain.parent.parent):
        (bridge / "power").mkdir(parents=True, exist_ok=True)
        (bridge / "power/control").write_text("auto\n")
    gpu = chain / f"{slot}.0"
    for attr, value in {
        "vendor": "0x10de",
        "device": "0x2684",
        "class": "0x030000",
        "current_link_speed": "2.5 GT/s PCIe",
        "current_link_width": "4",
        "max_link_speed": "16.0 GT/s PCIe",
        "max_link_width": "16",
    }.items():
        (gpu / attr).write_text(value + "\n")
    audio = chain / f"{slot}.1"
    for attr, value in {"vendor": "0x10de", "device": "0x22ba", "class": "0x040300"}.items():
        (audio / attr).write_text(value + "\n")
    if driver:
        (sysfs / "bus/pci/drivers/nvidia").mkdir(parents=True)
        (gpu / "driver").symlink_to(sysfs / "bus/pci/drivers/nvidia")
    devices = sysfs / "bus/pci/devices"
    devices.mkdir(parents=True, exist_ok=True)
    for dev in (f"{slot}.0", f"{slot}.1"):
        (devices / dev).symlink_to(chain / dev)
    (sysfs / "bus/pci/rescan").write_text("")
    tb = sysfs / "bus/thunderbolt/devices/0-1"
    tb.mkdir(parents=True)
    (tb / "unique_id").write_text(CORE_X_UUID + "\n")
    (tb / "authorized").write_text(authorized + "\n")
    return sysfs


def run_helper(
    tmp: Path, sysfs: Path, mode: str, timeout: str, slot: str = "0000:3c:00"
) -> subprocess.CompletedProcess[str]:
    """Run the rendered egpu-hotplug `wait` for real against `sysfs`, with modprobe and
    systemctl stubs that record their calls in tmp/calls, /dev and /run under tmp."""
    script = tmp / "egpu-hotplug"
    prof = profile(enclosure_unique_id=CORE_X_UUID)
    files = rendered_files(DEBIAN12_TB3_4090, prof, None, mode, bolt_available=False)
    script.write_text(next(f.content for f in files if f.path == BIN_HOTPLUG))
    script.chmod(0o755)
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("modprobe", "systemctl"):  # record instead of acting on this machine
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{tmp}/calls"\n')
        (stubs / name).chmod(0o755)
    dev = tmp / "dev"
    (dev / "dri/by-path").mkdir(parents=True, exist_ok=True)
    (dev / "nvidiactl").write_text("")
    (dev / "dri/card1").write_text("")
    (dev / "dri/card0").write_text("")
    (dev / f"dri/by-path/pci-{slot}.0-card").symlink_to(dev / "dri/card1")
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "EGPU_SETUP_SYSFS": str(sysfs),
        "EGPU_SETUP_DEV": str(dev),
        "EGPU_SETUP_RUN": str(tmp / "run"),
    }
    return subprocess.run(
        ["sh", str(script), "wait", timeout], capture_output=True, text=True, env=env, timeout=60
    )
