"""parse_boltctl_list over boltctl output of bolt 0.5-0.8 and 0.9, UTF-8 and ASCII glyphs."""

from __future__ import annotations

import pytest

from egpu_setup.detect.boltctl import BoltDevice, parse_boltctl_list

OLD_08_RAZER_CORE_X = """\
 ● Razer Core X
   ├─ type:          peripheral
   ├─ name:          Core X
   ├─ vendor:        Razer
   ├─ uuid:          00a8a5b4-b4d9-d400-ffff-ffffffffffff
   ├─ status:        authorized
   │  ├─ domain:     domain0
   │  └─ authflags:  none
   ├─ authorized:    Mon 04 Nov 2019 10:33:20 AM UTC
   ├─ connected:     Mon 04 Nov 2019 10:33:19 AM UTC
   └─ stored:        Mon 04 Nov 2019 10:33:21 AM UTC
      ├─ policy:     auto
      └─ key:        no

"""

NEW_09_AKITIO_USB4 = """\
 ● AKiTiO Node Titan
   ├─ type:          peripheral
   ├─ name:          Node Titan
   ├─ vendor:        AKiTiO
   ├─ uuid:          c5010000-0070-740e-0311-9d1c0a80e921
   ├─ generation:    Thunderbolt 3
   ├─ status:        authorized
   │  ├─ domain:     d3e8b1c2-10a4-8f00-ffff-ffffffffffff
   │  ├─ rx speed:   40 Gb/s = 2 lanes * 20 Gb/s
   │  ├─ tx speed:   40 Gb/s = 2 lanes * 20 Gb/s
   │  └─ authflags:  none
   ├─ authorized:    Fri 29 Nov 2024 09:12:45 AM UTC
   ├─ connected:     Fri 29 Nov 2024 09:12:44 AM UTC
   └─ stored:        Fri 29 Nov 2024 09:13:01 AM UTC
      ├─ policy:     iommu
      └─ key:        no

 ● ASUS ROG XG Mobile
   ├─ type:          peripheral
   ├─ name:          ROG XG Mobile
   ├─ vendor:        ASUS
   ├─ uuid:          9b0a8f00-0000-0000-ffff-ffffffffffff
   ├─ generation:    USB4
   ├─ status:        connected
   │  ├─ domain:     d3e8b1c2-10a4-8f00-ffff-ffffffffffff
   │  ├─ rx speed:   20 Gb/s = 1 lanes * 20 Gb/s
   │  ├─ tx speed:   20 Gb/s = 1 lanes * 20 Gb/s
   │  └─ authflags:  none
   ├─ connected:     Fri 29 Nov 2024 09:20:02 AM UTC
   └─ stored:        no

"""

ASCII_COLOUR_LIST_A = (
    " \x1b[32m*\x1b[0m Lenovo ThinkPad X1 Carbon 7th\n"
    "   |- type:          host\n"
    "   |- name:          ThinkPad X1 Carbon 7th\n"
    "   |- vendor:        Lenovo\n"
    "   |- uuid:          d8018780-f0b6-6a00-ffff-ffffffffffff\n"
    "   |- generation:    Thunderbolt 3\n"
    "   |- status:        authorized\n"
    "   |  |- domain:     d8018780-f0b6-6a00-ffff-ffffffffffff\n"
    "   |  |- rx speed:   40 Gb/s = 2 lanes * 20 Gb/s\n"
    "   |  |- tx speed:   40 Gb/s = 2 lanes * 20 Gb/s\n"
    "   |  `- authflags:  none\n"
    "   |- authorized:    Fri 29 Nov 2024 09:00:01 AM UTC\n"
    "   |- connected:     Fri 29 Nov 2024 09:00:01 AM UTC\n"
    "   `- stored:        no\n"
    "\n"
    " \x1b[33m*\x1b[0m Sonnet eGFX Breakaway Box 750ex\n"
    "   |- type:          peripheral\n"
    "   |- name:          eGFX Breakaway Box 750ex\n"
    "   |- vendor:        Sonnet Technologies, Inc.\n"
    "   |- uuid:          00d6c4e0-1a3f-0e00-ffff-ffffffffffff\n"
    "   |- generation:    Thunderbolt 3\n"
    "   |- status:        connected\n"
    "   |  |- domain:     d8018780-f0b6-6a00-ffff-ffffffffffff\n"
    "   |  `- authflags:  none\n"
    "   |- connected:     Fri 29 Nov 2024 09:05:10 AM UTC\n"
    "   `- stored:        Thu 28 Nov 2024 18:00:00 PM UTC\n"
    "      |- policy:     manual\n"
    "      `- key:        no\n"
)

TREE_LOST_IN_PASTE = """\
$ boltctl list
Razer Core X Chroma
type: peripheral
vendor: Razer
uuid: 00c5b1f2-7c4e-0a00-ffff-ffffffffffff
status: authorized
authorized: Tue 01 Oct 2024 08:00:00 AM UTC
stored: no
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            OLD_08_RAZER_CORE_X,
            (
                BoltDevice(
                    label="Razer Core X",
                    name="Core X",
                    vendor="Razer",
                    type="peripheral",
                    uuid="00a8a5b4-b4d9-d400-ffff-ffffffffffff",
                    status="authorized",
                    authorized=True,
                    stored=True,
                    policy="auto",
                    key="no",
                    domain="domain0",
                ),
            ),
            id="boltctl-0.8-razer-core-x-stored-auto",
        ),
        pytest.param(
            NEW_09_AKITIO_USB4,
            (
                BoltDevice(
                    label="AKiTiO Node Titan",
                    name="Node Titan",
                    vendor="AKiTiO",
                    type="peripheral",
                    generation=3,
                    generation_name="Thunderbolt 3",
                    uuid="c5010000-0070-740e-0311-9d1c0a80e921",
                    status="authorized",
                    authorized=True,
                    stored=True,
                    policy="iommu",
                    key="no",
                    domain="d3e8b1c2-10a4-8f00-ffff-ffffffffffff",
                    rx_speed_gbps=40.0,
                    tx_speed_gbps=40.0,
                    rx_lanes=2,
                    tx_lanes=2,
                ),
                BoltDevice(
                    label="ASUS ROG XG Mobile",
                    name="ROG XG Mobile",
                    vendor="ASUS",
                    type="peripheral",
                    generation=4,
                    generation_name="USB4",
                    uuid="9b0a8f00-0000-0000-ffff-ffffffffffff",
                    status="connected",
                    authorized=False,
                    stored=False,
                    domain="d3e8b1c2-10a4-8f00-ffff-ffffffffffff",
                    rx_speed_gbps=20.0,
                    tx_speed_gbps=20.0,
                    rx_lanes=1,
                    tx_lanes=1,
                ),
            ),
            id="boltctl-0.9-tb3-authorized-and-usb4-connected",
        ),
    ],
)
def test_layouts(text: str, expected: tuple[BoltDevice, ...]) -> None:
    assert parse_boltctl_list(text) == expected


def test_ascii_glyphs_colours_and_host_entry() -> None:
    host, box = parse_boltctl_list(ASCII_COLOUR_LIST_A)
    assert (host.label, host.type, host.authorized, host.stored, host.generation) == (
        "Lenovo ThinkPad X1 Carbon 7th",
        "host",
        True,
        False,
        3,
    )
    assert (host.rx_speed_gbps, host.rx_lanes) == (40.0, 2)
    assert (box.vendor, box.status, box.authorized, box.stored, box.policy) == (
        "Sonnet Technologies, Inc.",
        "connected",
        False,
        True,
        "manual",
    )
    assert box.rx_speed_gbps is None


def test_tree_characters_lost_in_paste() -> None:
    (dev,) = parse_boltctl_list(TREE_LOST_IN_PASTE)
    assert (dev.label, dev.name, dev.vendor, dev.status, dev.authorized, dev.stored) == (
        "Razer Core X Chroma",
        "Core X Chroma",
        "Razer",
        "authorized",
        True,
        False,
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("bash: boltctl: command not found\n", id="not-installed"),
        pytest.param("boltctl: error: Could not connect to bolt daemon\n", id="no-daemon"),
        pytest.param(" ● \n", id="bullet-only"),
        pytest.param("\x00\xff ├─ └─ │ ●\n" * 4, id="binary-ish"),
    ],
)
def test_garbage_yields_nothing(text: str) -> None:
    assert parse_boltctl_list(text) == ()


def test_truncated_device_keeps_what_is_there() -> None:
    (dev,) = parse_boltctl_list(
        " ● Razer Core X\n   ├─ type:          peripheral\n   ├─ status:    auth"
    )
    assert (dev.type, dev.status, dev.authorized, dev.uuid) == ("peripheral", "auth", False, None)


def test_hollow_bullet_elision_and_a_disconnected_device() -> None:
    text = (
        "○ Lenovo ThinkPad Thunderbolt 3 Dock\n"
        "   ├─ name:          ThinkPad Thunderbolt 3 Dock\n"
        "   ├─ vendor:        Lenovo\n"
        "[...]\n"
        "   ├─ generation:    Thunderbolt 3\n"
        "   ├─ status:        disconnected\n"
        "   └─ stored:        Wed 08 Sep 2021 07:09:28 AM UTC\n"
        "`● ASMedia 246x`\n"
        "`   ├─ name:          246x`\n"
        "`   ├─ vendor:        ASMedia`\n"
        "`   ├─ generation:    USB4`\n"
        "`   └─ status:        authorized`\n"
    )
    dock, asm = parse_boltctl_list(text)
    assert (dock.label, dock.name, dock.generation, dock.generation_name) == (
        "Lenovo ThinkPad Thunderbolt 3 Dock",
        "ThinkPad Thunderbolt 3 Dock",
        3,
        "Thunderbolt 3",
    )
    assert dock.status == "disconnected" and dock.authorized is None and dock.stored
    assert (asm.name, asm.vendor, asm.generation, asm.authorized) == ("246x", "ASMedia", 4, True)
