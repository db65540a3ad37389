"""Pure pieces of detection, one row per real-world variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from egpu_setup.detect.facts import Link
from egpu_setup.detect.nvidia import loaded_modules, parse_proc_version
from egpu_setup.detect.pci import PciFunction, Tunnel, decide_placement, tunnel_of
from egpu_setup.detect.sysfs import parse_gbps, parse_hex_id, parse_link_speed, pcie_generation
from egpu_setup.detect.system import (
    is_wsl,
    parse_mokutil_state,
    parse_secure_boot_var,
    parse_session_type,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("8.0 GT/s PCIe\n", 8.0, id="linux-5.x"),
        pytest.param("8 GT/s\n", 8.0, id="linux-4.x"),
        pytest.param("2.5 GT/s PCIe", 2.5, id="degraded-gen1"),
        pytest.param("32.0 GT/s PCIe", 32.0, id="gen5"),
        pytest.param("Unknown", None, id="unknown-speed"),
        pytest.param("\x00\x17garbage", None, id="garbage"),
        pytest.param(None, None, id="missing"),
    ],
)
def test_link_speed(text: str | None, expected: float | None) -> None:
    assert parse_link_speed(text) == expected


@pytest.mark.parametrize(
    ("text", "digits", "expected"),
    [
        ("0x10de\n", 4, "10de"),
        ("0x030000\n", 6, "030000"),
        ("0xa1", 2, "a1"),
        ("10de", 4, None),
        ("0x1234567", 4, None),
        ("", 4, None),
    ],
)
def test_hex_ids(text: str, digits: int, expected: str | None) -> None:
    assert parse_hex_id(text, digits) == expected


def test_gbps_and_generation() -> None:
    assert parse_gbps("20.0 Gb/s\n") == 20.0
    assert parse_gbps("40 Gb/s = 2 lanes * 20 Gb/s") == 40.0
    assert parse_gbps("fast") is None
    assert [pcie_generation(s) for s in (2.5, 8.0, 16.0, 3.0, None)] == [1, 3, 4, None, None]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build"
            "  (dvs-builder@U16-I3-B03-4-3)  Fri Aug 16 21:42:42 UTC 2024\n"
            "GCC version:  gcc version 13.2.0 (Ubuntu 13.2.0-23ubuntu4)\n",
            ("560.35.03", "open"),
            id="open-560",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n",
            ("535.183.01", "proprietary"),
            id="proprietary-535",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  Thu May  2 14:37:44 UTC 2024",
            ("470.256.02", "proprietary"),
            id="legacy-470",
        ),
        pytest.param("", (None, None), id="empty"),
        pytest.param("nonsense", (None, None), id="garbage"),
    ],
)
def test_proc_driver_version(text: str, expected: tuple[Any, ...]) -> None:
    assert parse_proc_version(text) == expected


def test_proc_modules() -> None:
    text = (
        "nvidia_drm 122880 4 - Live 0x0000000000000000 (POE)\n"
        "nvidia 54919168 62 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n"
    )
    assert loaded_modules(text) == frozenset({"nvidia_drm", "nvidia"})
    assert loaded_modules(None) is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x06\x00\x00\x00\x01", True),
        (b"\x06\x00\x00\x00\x00", False),
        (b"\x06\x00\x00", None),
        (None, None),
    ],
)
def test_secure_boot_variable(data: bytes | None, expected: bool | None) -> None:
    assert parse_secure_boot_var(data) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SecureBoot enabled\n", True),
        ("SecureBoot disabled\nPlatform is in Setup Mode\n", False),
        ("EFI variables are not supported on this system\n", None),
    ],
)
def test_mokutil(text: str, expected: bool | None) -> None:
    assert parse_mokutil_state(text) is expected


def test_session_type_and_wsl() -> None:
    assert parse_session_type("Type=wayland\n") == "wayland"
    assert parse_session_type("x11\n") == "x11"
    assert parse_session_type("Type=\n") is None
    assert is_wsl("5.15.153.1-microsoft-standard-WSL2", None) is True
    assert is_wsl("6.8.0-45-generic", "Linux version 6.8.0-45-generic (buildd@lcy02)") is False
    assert is_wsl(None, None) is None


def fn(address: str = "0000:3c:00.0", removable: str | None = None) -> PciFunction:
    return PciFunction(
        address=address,
        path=f"/sys/devices/pci0000:00/0000:00:1c.4/{address}",
        class_id="030000",
        vendor_id="10de",
        device_id="2684",
        subsystem_vendor_id=None,
        subsystem_device_id=None,
        revision="a1",
        driver="nvidia",
        link=Link(),
        removable=removable,
        boot_vga=False,
        bridges=("0000:00:1c.4",),
    )


TB3 = Tunnel("thunderbolt", "JHL7540 Thunderbolt 3 Bridge [Titan Ridge 4C 2018]")
USB4 = Tunnel("usb4", "Family 19h USB4/Thunderbolt PCIe tunnel")


@pytest.mark.parametrize(
    ("gpu", "name", "tunnels", "chassis", "slots", "expected"),
    [
        pytest.param(
            fn(),
            "GeForce RTX 4090",
            [("0000:05:01.0", TB3)],
            "10",
            frozenset(),
            (True, "thunderbolt"),
            id="tb3-bridge",
        ),
        pytest.param(
            fn(),
            "GeForce RTX 4090",
            [("0000:00:03.1", USB4)],
            "10",
            frozenset(),
            (True, "usb4"),
            id="amd-usb4",
        ),
        pytest.param(
            fn(),
            "GeForce RTX 4090",
            [("0000:00:03.1", USB4), ("0000:05:01.0", TB3)],
            "10",
            frozenset(),
            (True, "thunderbolt"),
            id="tb3-enclosure-on-usb4-host",
        ),
        pytest.param(
            fn(),
            "GeForce RTX 3070 Ti Laptop GPU",
            [],
            "10",
            frozenset(),
            (False, "pcie"),
            id="laptop-dgpu",
        ),
        pytest.param(
            fn(),
            "TU106M [GeForce RTX 2070 Max Q]",  # the spelling the GPU table's rule knows too
            [],
            "10",
            frozenset(),
            (False, "pcie"),
            id="laptop-dgpu-max-q-without-hyphen",
        ),
        pytest.param(
            fn(removable="removable"),
            "GeForce RTX 3090",
            [],
            "10",
            frozenset(),
            (True, "unknown"),
            id="removable-only",
        ),
        pytest.param(
            fn(),
            "GeForce RTX 4090",
            [],
            "10",
            frozenset({"0000:3c:00"}),
            (True, "oculink"),
            id="oculink-hotplug-laptop",
        ),
        pytest.param(
            fn(),
            "GeForce RTX 4090",
            [],
            "3",
            frozenset({"0000:3c:00"}),
            (None, "unknown"),
            id="desktop-slot-decides-nothing",
        ),
        pytest.param(
            PciFunction(**{**fn().__dict__, "boot_vga": True, "vendor_id": "1002"}),
            "Rembrandt [Radeon 680M]",
            [],
            "10",
            frozenset(),
            (False, "pcie"),
            id="apu-boot-vga-behind-internal-bridge",
        ),
        pytest.param(
            PciFunction(**{**fn().__dict__, "bridges": ()}),
            "Alder Lake-P Integrated Graphics Controller",
            [],
            None,
            frozenset(),
            (False, "pcie"),
            id="igpu-on-root-bus",
        ),
        pytest.param(
            fn(removable="fixed"),
            "GeForce RTX 4090",
            [],
            "10",
            frozenset(),
            (False, "pcie"),
            id="fixed",
        ),
        pytest.param(
            fn(), "GeForce RTX 4090", [], None, frozenset(), (None, "unknown"), id="no-evidence"
        ),
    ],
)
def test_placement(
    gpu: PciFunction,
    name: str,
    tunnels: list[tuple[str, Tunnel]],
    chassis: str | None,
    slots: frozenset[str],
    expected: tuple[bool | None, str],
) -> None:
    placed = decide_placement(
        gpu, name, tunnels, chassis_type=chassis, hotplug_buses=slots, tb_authorized=1
    )
    assert (placed.external, placed.connection) == expected
    assert bool(placed.evidence) == (placed.external is not None)


def test_tunnel_by_id_and_by_name() -> None:
    bridge = fn()
    titan = PciFunction(
        **{**bridge.__dict__, "vendor_id": "8086", "device_id": "15ea", "class_id": "060400"}
    )
    tunnel = tunnel_of(titan, None)
    assert tunnel is not None
    assert tunnel.connection == "thunderbolt"
    assert tunnel.generation == "TB3"  # JHL7540 Thunderbolt 3 Bridge
    other = PciFunction(
        **{**bridge.__dict__, "vendor_id": "1b21", "device_id": "9999", "class_id": "060400"}
    )
    assert tunnel_of(other, "ASM4242 USB4 PCIe Downstream Port") == Tunnel(
        "usb4", "ASM4242 USB4 PCIe Downstream Port", "USB4"
    )
    new_intel = PciFunction(
        **{**bridge.__dict__, "vendor_id": "8086", "device_id": "f000", "class_id": "060400"}
    )
    assert tunnel_of(new_intel, "Panther Lake Thunderbolt 5 PCI Express Root Port #0") == Tunnel(
        "thunderbolt", "Panther Lake Thunderbolt 5 PCI Express Root Port #0", "TB5"
    )
    assert tunnel_of(other, "ASM1182e 2-Port PCIe x1 Gen2 Packet Switch") is None


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        pytest.param("535.183.01", "12.2", id="535-as-nvidia-smi-prints"),
        pytest.param("560.35.03", "12.6", id="560"),
        pytest.param("570.86.16", "12.8", id="570"),
        pytest.param("580.95.05", "13.0", id="580"),
        pytest.param("470.256.02", None, id="below-the-table"),
        pytest.param("not-a-version", None, id="garbage"),
    ],
)
def test_cuda_version_a_driver_supports(driver: str, cuda: str | None) -> None:
    from egpu_setup.detect.nvidia import max_cuda_for_driver

    assert max_cuda_for_driver(driver) == cuda


def test_without_os_release_the_distro_package_reads_release_files(tmp_path: Path) -> None:
    from egpu_setup.detect.system import probe_os
    from egpu_setup.host.machine import RootHost

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/centos-release").write_text("CentOS release 6.10 (Final)\n")
    facts = probe_os(RootHost(tmp_path))
    assert (facts.id, facts.version_id) == ("centos", "6.10")
    (tmp_path / "etc/os-release").write_text('ID=rocky\nVERSION_ID="9.4"\n')
    assert probe_os(RootHost(tmp_path)).id == "rocky"  # os-release wins when present


def test_firmware_strings_cannot_drive_the_terminal() -> None:
    from egpu_setup.commands.detect import format_facts
    from egpu_setup.detect.facts import HostFacts, TbDevice, ThunderboltFacts

    evil = "Core X\x1b]0;pwned\x07\x1b[2J"
    facts = HostFacts(thunderbolt=ThunderboltFacts(devices=(TbDevice(name=evil, vendor="Razer"),)))
    out = format_facts(facts)
    assert "\x1b" not in out and "\x07" not in out and "Core X\\x1b]0;pwned\\x07\\x1b[2J" in out
