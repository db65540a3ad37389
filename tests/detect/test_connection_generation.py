"""The connection's generation (TB3 / TB4 / TB5 / USB4): from the tunnel parts' PCI ids, bolt's
or sysfs' generation, the Thunderbolt link speed; in `detect --json` and the table."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import FIXTURES
from egpu_setup.detect.facts import TbDevice
from egpu_setup.detect.pci import (
    connection_in_text,
    generation_from_devices,
    generation_from_name,
    oldest_generation,
)
from helpers.cli_runner import invoke


@pytest.mark.parametrize(
    ("name", "generation"),
    [
        ("JHL7540 Thunderbolt 3 Bridge [Titan Ridge 2C 2018]", "TB3"),
        ("Tiger Lake-H Thunderbolt 4 PCI Express Root Port #0", "TB4"),
        ("JHL9480 Thunderbolt 5 80/120G Bridge [Barlow Ridge Hub 80G 2023]", "TB5"),
        ("JHL9440 Thunderbolt 4 Bridge [Barlow Ridge Hub 40G 2023]", "TB4"),  # Barlow Ridge, 40G
        ("Strix/Strix Halo PCIe USB4 Bridge", "USB4"),
        ("ASM4242 USB 4 / Thunderbolt 3 Host Router", "USB4"),
        ("Thunderbolt@3,0,0", None),  # macOS slot name: a port number, not a generation
        ("DSL4410 Thunderbolt Bridge [Redwood Ridge 2C 2013]", None),
    ],
)
def test_generation_from_name(name: str, generation: str | None) -> None:
    assert generation_from_name(name) == generation


def test_a_chain_runs_at_its_oldest_generation() -> None:
    assert oldest_generation(["TB4", "TB4", "TB3", "TB3"]) == "TB3"  # TB3 enclosure, TB4 host
    assert oldest_generation(["TB5", "TB5"]) == "TB5"
    assert oldest_generation(["USB4", "TB4"]) == "TB4"  # one step: the part nearer the GPU
    assert oldest_generation([None, "USB4"]) == "USB4"
    assert oldest_generation([None]) is None


def _dev(gen: int | None, speed: float | None = None, lanes: int | None = None) -> TbDevice:
    return TbDevice("box", "vendor", "u", True, gen, None, rx_speed_gbps=speed, rx_lanes=lanes)


def test_generation_from_devices() -> None:
    # rx_speed is per lane (sysfs-bus-thunderbolt)
    assert generation_from_devices([_dev(3, 20.0, 2)]) == "TB3"  # 2 x 20 Gb/s
    assert generation_from_devices([_dev(4, 20.0, 2)]) == "USB4"  # TB4 / USB4: 2 x 20 Gb/s
    assert generation_from_devices([_dev(4, 40.0, 2)]) == "TB5"  # 2 x 40 Gb/s: TB5 / USB4 v2
    assert generation_from_devices([_dev(4)]) == "USB4"  # sysfs 4 is USB4 (a TB4 device, too)
    assert generation_from_devices([_dev(3), _dev(4)]) is None  # two links: not decided
    unauthorized = TbDevice("box", "v", "u", False, 3)
    assert generation_from_devices([unauthorized]) is None


def test_every_tunnel_id_has_a_generation_and_a_source() -> None:
    from importlib import resources

    data = yaml.safe_load(
        resources.files("egpu_setup.data").joinpath("pcie_tunnels.yaml").read_text()
    )
    for row in data["bridges"]:
        assert row["generation"] in ("TB1", "TB2", "TB3", "TB4", "TB5", "USB4"), row
        assert row["source"] in data["sources"], row
        named = generation_from_name(row["name"])
        assert named in (None, row["generation"]), row  # the data agrees with its own name


def test_connection_in_text_by_id_where_the_name_says_nothing() -> None:
    info = connection_in_text("Thunderbolt controller: Intel JHL9480 (8086:5786)\n")
    assert (info.connection, info.generation) == ("thunderbolt", "TB5")
    info = connection_in_text("05:00.0 PCI bridge [0604]: ASMedia Device [1b21:2463]\n")
    assert (info.connection, info.generation) == ("usb4", "USB4")
    assert connection_in_text("LnkSta: Speed 8GT/s, Width x4\n").connection is None


@pytest.mark.parametrize(
    ("host", "address", "generation"),
    [
        ("tb3-rtx3090-ubuntu2204", "0000:0a:00.0", "TB3"),
        ("tb4-rtx4090-ubuntu2404", "0000:0a:00.0", "TB3"),  # a Titan Ridge box on Maple Ridge
        ("usb4-rtx5090-fedora", "0000:65:00.0", "USB4"),
        ("oculink-rtx4090-debian12", "0000:01:00.0", None),
    ],
)
def test_detect_json_carries_the_generation(
    host: str, address: str, generation: str | None
) -> None:
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.host.machine import RecordedHost

    data = json.loads(json.dumps(detect_host(RecordedHost(FIXTURES / host)).to_json()))
    (gpu,) = [g for g in data["gpus"] if g["pci_address"] == address]
    assert gpu["connection_generation"] == generation
    assert {"connection", "link", "external"} <= set(gpu)  # the contract's keys stay


def test_detect_table_shows_generation_and_codename() -> None:
    r = invoke("detect", "--from", str(FIXTURES / "tb3-rtx3090-ubuntu2204"))
    assert r.returncode == 0, r.stderr
    assert "EXTERNAL via thunderbolt (TB3)" in r.stdout
    assert "Ampere (GA102), compute capability 8.6" in r.stdout


@pytest.mark.parametrize(
    ("host", "generation"),
    [("tb5-rtx5090-ubuntu2404", "TB5"), ("tb4-unauthorized-fresh-ubuntu2404", None)],
)
def test_generation_from_the_recorded_sysfs_routers(host: str, generation: str | None) -> None:
    """sysfs's rx_speed is one lane's: the Thunderbolt 5 enclosure's 40.0 Gb/s lane is TB5 (it
    was divided by its 2 lanes once and read as 20); the TB4 box, not authorized, decides
    nothing."""
    from egpu_setup.detect.thunderbolt import probe_thunderbolt
    from egpu_setup.host.machine import RecordedHost

    facts = probe_thunderbolt(RecordedHost(FIXTURES / host))
    assert generation_from_devices(facts.devices) == generation
