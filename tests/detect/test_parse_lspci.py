"""parse_lspci over lspci text as users paste it: one row per real-world variant."""

from __future__ import annotations

from typing import Any

import pytest

from egpu_setup.detect.lspci import LspciEntry, normalize_pci_address, parse_lspci

T = "\t"

PLAIN_UBUNTU22_TB3_RTX3090 = """\
00:00.0 Host bridge: Intel Corporation 8th Gen Core Processor Host Bridge/DRAM Registers (rev 08)
00:02.0 VGA compatible controller: Intel Corporation UHD Graphics 620 (rev 07)
00:1c.0 PCI bridge: Intel Corporation Sunrise Point-LP PCI Express Root Port #1 (rev f1)
05:00.0 PCI bridge: Intel Corporation JHL7540 Thunderbolt 3 Bridge [Titan Ridge 4C 2018] (rev 06)
3d:00.0 PCI bridge: Intel Corporation JHL7540 Thunderbolt 3 Bridge [Titan Ridge 4C 2018] (rev 06)
3e:00.0 VGA compatible controller: NVIDIA Corporation GA102 [GeForce RTX 3090] (rev a1)
3e:00.1 Audio device: NVIDIA Corporation GA102 High Definition Audio Controller (rev a1)
"""

NNK_UBUNTU24_RTX4090 = f"""\
00:02.0 VGA compatible controller [0300]: Intel Corporation Raptor Lake-P [Iris Xe Graphics] [8086:a7a0] (rev 04)
{T}Subsystem: Lenovo Device [17aa:2316]
{T}Kernel driver in use: i915
{T}Kernel modules: i915, xe
2f:00.0 VGA compatible controller [0300]: NVIDIA Corporation AD102 [GeForce RTX 4090] [10de:2684] (rev a1)
{T}Subsystem: NVIDIA Corporation AD102 [GeForce RTX 4090] [10de:167c]
{T}Kernel driver in use: nvidia
{T}Kernel modules: nvidiafb, nouveau, nvidia_drm, nvidia
2f:00.1 Audio device [0403]: NVIDIA Corporation AD102 High Definition Audio Controller [10de:22ba] (rev a1)
{T}Subsystem: NVIDIA Corporation Device [10de:167c]
{T}Kernel driver in use: snd_hda_intel
{T}Kernel modules: snd_hda_intel
"""

K_FEDORA_NOUVEAU_RTX3080 = f"""\
0000:07:00.0 VGA compatible controller: NVIDIA Corporation GA102 [GeForce RTX 3080 Lite Hash Rate] (rev a1)
{T}Subsystem: eVga.com. Corp. Device 3885
{T}Kernel driver in use: nouveau
{T}Kernel modules: nouveau
"""

OLD_PCIIDS_RTX5090 = """\
01:00.0 VGA compatible controller [0300]: NVIDIA Corporation Device [10de:2b85] (rev a1)
01:00.1 Audio device [0403]: NVIDIA Corporation Device [10de:22e8] (rev a1)
"""

OLD_PCIIDS_PLAIN = "0a:00.0 VGA compatible controller: NVIDIA Corporation Device 2b85 (rev a1)\n"

VVNN_TB_DEGRADED_BARS = f"""\
06:00.0 3D controller [0302]: NVIDIA Corporation TU104GL [Tesla T4] [10de:1eb8] (rev a1)
{T}Subsystem: NVIDIA Corporation Device [10de:12a2]
{T}Physical Slot: 1
{T}Control: I/O- Mem- BusMaster- SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx-
{T}Status: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- INTx-
{T}Interrupt: pin A routed to IRQ 255
{T}Region 0: Memory at 92000000 (32-bit, non-prefetchable) [disabled] [size=16M]
{T}Region 1: Memory at <unassigned> (64-bit, prefetchable) [disabled]
{T}Region 3: Memory at <unassigned> (64-bit, prefetchable) [disabled]
{T}Expansion ROM at 93000000 [virtual] [disabled] [size=512K]
{T}Capabilities: [60] Power Management version 3
{T}{T}Flags: PMEClk- DSI- D1- D2- AuxCurrent=0mA PME(D0-,D1-,D2-,D3hot-,D3cold-)
{T}Capabilities: [78] Express (v2) Endpoint, MSI 00
{T}{T}DevCap:{T}MaxPayload 256 bytes, PhantFunc 0, Latency L0s unlimited, L1 <64us
{T}{T}LnkCap:{T}Port #0, Speed 8GT/s, Width x16, ASPM not supported
{T}{T}{T}ClockPM+ Surprise- LLActRep- BwNot- ASPMOptComp+
{T}{T}LnkCtl:{T}ASPM Disabled; RCB 64 bytes, Disabled- CommClk+
{T}{T}LnkSta:{T}Speed 2.5GT/s (downgraded), Width x4 (downgraded)
{T}{T}{T}TrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-
{T}{T}LnkCap2: Supported Link Speeds: 2.5-8GT/s, Crosslink- Retimer- 2Retimers- DRS-
{T}{T}LnkSta2: Current De-emphasis Level: -3.5dB, EqualizationComplete+ EqualizationPhase1+
{T}Kernel modules: nvidiafb, nouveau

"""

V_OLD_PCIUTILS_LNKSTA = f"""\
01:00.0 VGA compatible controller: NVIDIA Corporation GP102 [GeForce GTX 1080 Ti] (rev a1) (prog-if 00 [VGA controller])
{T}Subsystem: ASUSTeK Computer Inc. GP102 [GeForce GTX 1080 Ti]
{T}Flags: bus master, fast devsel, latency 0, IRQ 139
{T}Memory at de000000 (32-bit, non-prefetchable) [size=16M]
{T}Memory at c0000000 (64-bit, prefetchable) [size=256M]
{T}I/O ports at e000 [size=128]
{T}[virtual] Expansion ROM at df000000 [disabled] [size=512K]
{T}Capabilities: [68] Express Legacy Endpoint, MSI 00
{T}{T}LnkCap:{T}Port #0, Speed 8GT/s, Width x16, ASPM L0s L1, Exit Latency L0s <512ns, L1 <4us
{T}{T}LnkSta:{T}Speed 2.5GT/s, Width x4, TrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-
{T}Kernel driver in use: nvidia
{T}Kernel modules: nvidiafb, nouveau, nvidia_drm, nvidia

"""

GREP_A_SEPARATORS = f"""\
$ lspci -k | grep -A 2 -E "(VGA|3D)"
00:02.0 VGA compatible controller: Intel Corporation Alder Lake-P Integrated Graphics Controller (rev 0c)
{T}Subsystem: Dell Device 0b19
{T}Kernel driver in use: i915
--
3d:00.0 PCI bridge: Intel Corporation JHL7540 Thunderbolt 3 Bridge [Titan Ridge 4C 2018] (rev 06)
{T}Kernel driver in use: pcieport
--
3f:00.0 VGA compatible controller: NVIDIA Corporation GA104 [GeForce RTX 3070] (rev a1)
{T}Subsystem: Gigabyte Technology Co., Ltd Device 404c
{T}Kernel driver in use: nvidia
"""

GREP_VGA_CUT = "01:00.0 VGA compatible controller: NVIDIA Corporation TU106 [GeForce RTX 2060 Rev. A] (rev a1)\n"

D_NUMERIC_AWE = """\
0000:00:02.0 0300: 8086:3e9b
0000:3c:00.0 0300: 10de:1b06 (rev a1)
0000:3c:00.1 0403: 10de:10ef (rev a1)
"""

VMD_DOMAIN = """\
10000:e0:06.0 PCI bridge [0604]: Intel Corporation 12th Gen Core Processor PCI Express x4 Controller #0 [8086:464d] (rev 02)
10000:e1:00.0 Non-Volatile memory controller [0108]: Samsung Electronics Co Ltd NVMe SSD Controller PM9A1/PM9A3/980PRO [144d:a80a]
"""

NONZERO_DOMAIN_ARM = (
    "0001:01:00.0 3D controller: NVIDIA Corporation GA100 [A100 PCIe 40GB] (rev a1)\n"
)

DISPLAY_CONTROLLER_AMD = "c1:00.0 Display controller [0380]: Advanced Micro Devices, Inc. [AMD/ATI] Navi 21 [Radeon Pro V620] [1002:73a1] (rev c7)\n"

MM_NN = '01:00.0 "VGA compatible controller [0300]" "NVIDIA Corporation [10de]" "GA102 [GeForce RTX 3090] [2204]" -ra1 -p00 "eVga.com. Corp. [3842]" "Device [3987]"\n'

VMMK = f"""\
Slot:{T}01:00.0
Class:{T}VGA compatible controller
Vendor:{T}NVIDIA Corporation
Device:{T}GA104 [GeForce RTX 3070 Ti]
SVendor:{T}Micro-Star International Co., Ltd. [MSI]
SDevice:{T}Device 5051
Rev:{T}a1
Driver:{T}nvidia
Module:{T}nvidiafb
Module:{T}nouveau
Module:{T}nvidia
PhySlot:{T}1
IOMMUGroup:{T}14

"""


def first_nvidia(entries: tuple[LspciEntry, ...]) -> LspciEntry:
    return next(
        e for e in entries if e.vendor_id == "10de" or e.vendor_name == "NVIDIA Corporation"
    )


@pytest.mark.parametrize(
    ("text", "address", "expected"),
    [
        pytest.param(
            PLAIN_UBUNTU22_TB3_RTX3090,
            "0000:3e:00.0",
            dict(
                class_name="VGA compatible controller",
                class_id=None,
                vendor_name="NVIDIA Corporation",
                device_name="GA102 [GeForce RTX 3090]",
                revision="a1",
                driver=None,
            ),
            id="lspci-plain-ubuntu22-tb3-rtx3090",
        ),
        pytest.param(
            NNK_UBUNTU24_RTX4090,
            "0000:2f:00.0",
            dict(
                class_id="0300",
                vendor_id="10de",
                device_id="2684",
                device_name="AD102 [GeForce RTX 4090]",
                subsystem="NVIDIA Corporation AD102 [GeForce RTX 4090]",
                subsystem_vendor_id="10de",
                subsystem_device_id="167c",
                driver="nvidia",
                modules=("nvidiafb", "nouveau", "nvidia_drm", "nvidia"),
            ),
            id="lspci-nnk-ubuntu24-rtx4090",
        ),
        pytest.param(
            K_FEDORA_NOUVEAU_RTX3080,
            "0000:07:00.0",
            dict(
                device_name="GA102 [GeForce RTX 3080 Lite Hash Rate]",
                subsystem="eVga.com. Corp. Device 3885",
                driver="nouveau",
                modules=("nouveau",),
            ),
            id="lspci-Dk-fedora-nouveau-rtx3080lhr",
        ),
        pytest.param(
            OLD_PCIIDS_RTX5090,
            "0000:01:00.0",
            dict(
                vendor_name="NVIDIA Corporation",
                device_name="Device",
                vendor_id="10de",
                device_id="2b85",
            ),
            id="lspci-nn-old-pciids-rtx5090",
        ),
        pytest.param(
            OLD_PCIIDS_PLAIN,
            "0000:0a:00.0",
            dict(
                vendor_name="NVIDIA Corporation",
                device_name="Device 2b85",
                device_id="2b85",
                vendor_id=None,
            ),
            id="lspci-plain-old-pciids-device-2b85",
        ),
        pytest.param(
            VVNN_TB_DEGRADED_BARS,
            "0000:06:00.0",
            dict(
                class_name="3D controller",
                class_id="0302",
                device_id="1eb8",
                link_speed_gts=2.5,
                link_width=4,
                max_link_speed_gts=8.0,
                max_link_width=16,
                modules=("nvidiafb", "nouveau"),
                driver=None,
                unassigned_bars=(
                    "Region 0: Memory at 92000000 (32-bit, non-prefetchable) [disabled] [size=16M]",
                    "Region 1: Memory at <unassigned> (64-bit, prefetchable) [disabled]",
                    "Region 3: Memory at <unassigned> (64-bit, prefetchable) [disabled]",
                ),
            ),
            id="lspci-vvnn-tb-bars-unassigned-link-downgraded",
        ),
        pytest.param(
            V_OLD_PCIUTILS_LNKSTA,
            "0000:01:00.0",
            dict(
                prog_if="00",
                revision="a1",
                device_name="GP102 [GeForce GTX 1080 Ti]",
                subsystem="ASUSTeK Computer Inc. GP102 [GeForce GTX 1080 Ti]",
                link_speed_gts=2.5,
                link_width=4,
                max_link_speed_gts=8.0,
                max_link_width=16,
                unassigned_bars=(),
                driver="nvidia",
            ),
            id="lspci-v-pciutils33-lnksta-one-line-gtx1080ti",
        ),
        pytest.param(
            GREP_A_SEPARATORS,
            "0000:3f:00.0",
            dict(
                device_name="GA104 [GeForce RTX 3070]",
                subsystem="Gigabyte Technology Co., Ltd Device 404c",
                driver="nvidia",
            ),
            id="lspci-k-grep-A2-separators-rtx3070",
        ),
        pytest.param(
            GREP_VGA_CUT,
            "0000:01:00.0",
            dict(device_name="TU106 [GeForce RTX 2060 Rev. A]", revision="a1"),
            id="lspci-grep-vga-cut-line-rtx2060",
        ),
        pytest.param(
            D_NUMERIC_AWE,
            "0000:3c:00.0",
            dict(
                class_id="0300",
                vendor_id="10de",
                device_id="1b06",
                revision="a1",
                class_name=None,
                vendor_name=None,
                device_name=None,
            ),
            id="lspci-Dn-numeric-gtx1080ti",
        ),
        pytest.param(
            NONZERO_DOMAIN_ARM,
            "0001:01:00.0",
            dict(class_name="3D controller", device_name="GA100 [A100 PCIe 40GB]"),
            id="lspci-nonzero-domain-a100",
        ),
        pytest.param(
            MM_NN,
            "0000:01:00.0",
            dict(
                class_name="VGA compatible controller",
                class_id="0300",
                vendor_name="NVIDIA Corporation",
                vendor_id="10de",
                device_name="GA102 [GeForce RTX 3090]",
                device_id="2204",
                revision="a1",
                prog_if="00",
                subsystem="eVga.com. Corp. Device",
                subsystem_vendor_id="3842",
                subsystem_device_id="3987",
            ),
            id="lspci-nnmm-machine-readable-rtx3090",
        ),
        pytest.param(
            VMMK,
            "0000:01:00.0",
            dict(
                class_name="VGA compatible controller",
                vendor_name="NVIDIA Corporation",
                device_name="GA104 [GeForce RTX 3070 Ti]",
                subsystem="Micro-Star International Co., Ltd. [MSI] Device 5051",
                revision="a1",
                driver="nvidia",
                modules=("nvidiafb", "nouveau", "nvidia"),
            ),
            id="lspci-vmmk-rtx3070ti",
        ),
    ],
)
def test_variants(text: str, address: str, expected: dict[str, object]) -> None:
    entries = {e.address: e for e in parse_lspci(text)}
    entry = entries[address]
    got = {key: getattr(entry, key) for key in expected}
    assert got == expected
    assert entry.is_display


def test_plain_listing_keeps_every_function_and_classes() -> None:
    entries = parse_lspci(PLAIN_UBUNTU22_TB3_RTX3090)
    assert [e.address for e in entries] == [
        "0000:00:00.0",
        "0000:00:02.0",
        "0000:00:1c.0",
        "0000:05:00.0",
        "0000:3d:00.0",
        "0000:3e:00.0",
        "0000:3e:00.1",
    ]
    assert [e.address for e in entries if e.is_display] == ["0000:00:02.0", "0000:3e:00.0"]


def test_bus_3d_bridge_is_not_a_3d_controller() -> None:
    # `lspci | grep -i 3d` matches this bridge; egpu-switcher's legacy script took it for a GPU.
    (bridge,) = [e for e in parse_lspci(GREP_A_SEPARATORS) if e.address == "0000:3d:00.0"]
    assert bridge.class_name == "PCI bridge"
    assert not bridge.is_display
    assert bridge.driver == "pcieport"


def test_grep_separator_does_not_leak_details_across_entries() -> None:
    entries = {e.address: e for e in parse_lspci(GREP_A_SEPARATORS)}
    assert entries["0000:00:02.0"].driver == "i915"
    assert entries["0000:00:02.0"].subsystem == "Dell Device 0b19"
    assert len(entries) == 3  # the "$ lspci ..." prompt line is ignored


def test_vmd_five_digit_domain_is_kept() -> None:
    entries = parse_lspci(VMD_DOMAIN)
    assert [e.address for e in entries] == ["10000:e0:06.0", "10000:e1:00.0"]
    assert entries[1].vendor_name == "Samsung Electronics Co Ltd"
    assert entries[1].class_id == "0108"
    assert not entries[1].is_display


def test_display_controller_class_and_amd_vendor_split() -> None:
    (e,) = parse_lspci(DISPLAY_CONTROLLER_AMD)
    assert e.class_name == "Display controller" and e.class_id == "0380" and e.is_display
    assert e.vendor_name == "Advanced Micro Devices, Inc. [AMD/ATI]"
    assert e.device_name == "Navi 21 [Radeon Pro V620]"


def test_expansion_rom_disabled_is_not_a_failed_bar() -> None:
    # Every healthy GPU shows its ROM "[disabled]" after POST; only BARs count.
    e = first_nvidia(parse_lspci(VVNN_TB_DEGRADED_BARS))
    assert not any("Expansion ROM" in line for line in e.unassigned_bars)


def test_lnkcap2_and_lnksta2_are_not_read_as_lnkcap() -> None:
    text = f"01:00.0 VGA compatible controller: NVIDIA Corporation Device 2684\n{T}{T}LnkCap2: Supported Link Speeds: 2.5-16GT/s\n{T}{T}LnkSta2: Current De-emphasis Level: -6dB\n"
    (e,) = parse_lspci(text)
    assert e.max_link_speed_gts is None and e.link_speed_gts is None


def test_indentation_lost_in_paste_still_attaches_known_details() -> None:
    text = "01:00.0 VGA compatible controller: NVIDIA Corporation GA102 [GeForce RTX 3090] (rev a1)\nSubsystem: NVIDIA Corporation Device 147d\nKernel driver in use: nvidia\n"
    (e,) = parse_lspci(text)
    assert e.driver == "nvidia" and e.subsystem == "NVIDIA Corporation Device 147d"


def test_windows_line_endings_and_colours() -> None:
    text = "\x1b[1m01:00.0\x1b[0m VGA compatible controller: NVIDIA Corporation AD102 [GeForce RTX 4090] (rev a1)\r\n\tKernel driver in use: nvidia\r\n"
    (e,) = parse_lspci(text)
    assert e.device_name == "AD102 [GeForce RTX 4090]" and e.driver == "nvidia"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("bash: lspci: command not found\n", id="command-not-found"),
        pytest.param(
            "pcilib: Cannot open /proc/bus/pci\nlspci: Cannot find any working access method.\n",
            id="no-access",
        ),
        pytest.param("01:00.0\n", id="address-only"),
        pytest.param("01:00.0 VGA compatible contr", id="truncated-header"),
        pytest.param(
            "\tKernel driver in use: nvidia\n\tLnkSta: Speed 8GT/s, Width x16\n",
            id="details-without-header",
        ),
        pytest.param("\x00\x01\xff\xfe garbage \x7f\n" * 5, id="binary-ish"),
        pytest.param("zz:00.0 VGA compatible controller: Foo\n", id="bad-hex-bus"),
    ],
)
def test_garbage_yields_nothing(text: str) -> None:
    assert parse_lspci(text) == ()


def test_truncated_bracket_keeps_what_is_there() -> None:
    (e,) = parse_lspci(
        "01:00.0 VGA compatible controller [0300]: NVIDIA Corporation AD102 [GeForce RTX 40"
    )
    assert e.class_id == "0300" and e.vendor_name == "NVIDIA Corporation" and e.device_id is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("01:00.0", "0000:01:00.0", id="no-domain"),
        pytest.param("0000:3C:00.0", "0000:3c:00.0", id="upper-hex"),
        pytest.param("00000000:01:00.0", "0000:01:00.0", id="nvidia-smi-8-digit"),
        pytest.param("00000001:00:00.0", "0001:00:00.0", id="nvidia-smi-nonzero-domain"),
        pytest.param("10000:e1:00.0", "10000:e1:00.0", id="vmd"),
        pytest.param("1:00.0", None, id="short-bus"),
        pytest.param("01:00.8", None, id="bad-function"),
        pytest.param("", None, id="empty"),
    ],
)
def test_normalize_pci_address(raw: str, expected: str | None) -> None:
    assert normalize_pci_address(raw) == expected


# -- what pasting does to lspci (the real pastes are in tests/data/real/lspci-*) ------------------

NN = "01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA102 [GeForce RTX 3080]"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"{NN} [10de:2206] (rev a1)", id="one-line"),
        pytest.param(f"{NN}\n[10de:2206] (rev a1)", id="ids-on-the-next-line"),
        pytest.param(f"{NN} [10de:22\n06] (rev a1)", id="wrapped-inside-the-id"),
        pytest.param(f"{NN} [10\nde:2206] (rev a1)", id="wrapped-inside-the-vendor"),
        pytest.param(
            "01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA102 [GeForce\n"
            "RTX 3080] [10de:2206] (rev a1)",
            id="wrapped-inside-the-name",
        ),
        pytest.param(
            "> 01:00.0 VGA compatible controller [0300]: NVIDIA Corporation\n"
            "> GA102 [GeForce RTX 3080]\n> [10de:2206] (rev a1)",
            id="email-quoted-three-pieces",
        ),
        pytest.param(f"`{NN} [10de:2206] (rev a1)`", id="markdown-backticks"),
        pytest.param(f"  > {NN}\n  > [10de:2206] (rev a1)", id="indented-quote"),
    ],
)
def test_wrapped_nn_lines_are_joined(text: str) -> None:
    (e,) = parse_lspci(text + "\n\tKernel driver in use: nvidia\n")
    assert (e.vendor_id, e.device_id, e.device_name, e.revision) == (
        "10de",
        "2206",
        "GA102 [GeForce RTX 3080]",
        "a1",
    )
    assert e.driver == "nvidia"


def test_a_complete_header_is_never_joined_with_what_follows() -> None:
    text = f"{NN} [10de:2206] (rev a1)\nSubsystem: foo\n$ lspci -k\n02:00.0 USB controller: x"
    entries = parse_lspci(text)
    assert [e.address for e in entries] == ["0000:01:00.0", "0000:02:00.0"]
    assert entries[0].device_name == "GA102 [GeForce RTX 3080]"


def test_a_detail_wrapped_to_column_0_keeps_the_entry() -> None:
    text = (
        "01:00.0 VGA compatible controller: NVIDIA Corporation GT218M [NVS 3100M] (rev a2)\n"
        "        Capabilities: [600] Vendor Specific Information: ID=0001 Rev=1\n"
        "Len=024 <?>\n"
        "        Kernel driver in use: nouveau\n"
    )
    assert parse_lspci(text)[0].driver == "nouveau"
    # ... but a prompt between two entries still ends the first one.
    after_prompt = "01:00.0 VGA compatible controller: NVIDIA Corporation X\n$ true\n\tKernel driver in use: y\n"
    assert parse_lspci(after_prompt)[0].driver is None


def test_nvidia_by_vendor_name_and_bar_problems() -> None:
    (e,) = parse_lspci(
        "01:00.0 VGA compatible controller: NVIDIA Corporation TU102GL [Quadro RTX 6000/8000]\n"
        "\tRegion 0: Memory at 618000000 (32-bit, non-prefetchable) [disabled] [size=16M]\n"
        "\tRegion 1: Memory at <unassigned> (64-bit, prefetchable)\n"
        "\tRegion 5: I/O ports at <unassigned> [disabled]\n"
    )
    assert e.vendor_id is None and e.is_nvidia
    assert e.bar_problems == ("Region 1: Memory at <unassigned> (64-bit, prefetchable)",)
    assert len(e.unassigned_bars) == 3  # what lspci printed, as before
    (amd,) = parse_lspci(
        "06:00.0 VGA compatible controller: Advanced Micro Devices, Inc. [AMD/ATI] X"
    )
    assert not amd.is_nvidia


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "[ 1.0] NVRM: The NVIDIA GPU 0000:b3:00.0\n        NVRM: (PCI ID: 10de:26b5) installed",
            [("0000:b3:00.0", "10de", "26b5", None)],
            id="nvrm-over-two-lines",
        ),
        pytest.param(
            "NVIDIA GeForce RTX 4090   PCI\\VEN_10DE&DEV_2684&SUBSYS_16F310DE&REV_A1\\4&1",
            [(None, "10de", "2684", "NVIDIA GeForce RTX 4090")],
            id="windows-pnp",
        ),
        pytest.param(
            "the card (`3D controller: NVIDIA Corporation GA100 [A100 PCIe 40GB] [10de:20f1]`)",
            [(None, "10de", "20f1", "GA100 [A100 PCIe 40GB]")],
            id="inline-lspci",
        ),
        pytest.param("nothing about GPUs\n", [], id="nothing"),
    ],
)
def test_parse_gpu_mentions(text: str, expected: list[Any]) -> None:
    from egpu_setup.detect.lspci import parse_gpu_mentions

    got = [(m.address, m.vendor_id, m.device_id, m.device_name) for m in parse_gpu_mentions(text)]
    assert got == expected
