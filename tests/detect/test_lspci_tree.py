"""lspci trees beyond the real pastes in tests/data/real/lspci-tree: a quoted paste, ids only."""

from __future__ import annotations

from egpu_setup.detect.lspci_tree import looks_like_tree, parse_lspci_tree
from egpu_setup.detect.probe import gpus_in_text

# The laptop tree of tests/data/real/lspci-tree, quoted as a mail reply quotes it, with the
# 940MX's name cut to what an old pci.ids prints (the id only) and an eGPU's chain added.
QUOTED = """\
> -[0000:00]-+-00.0  Intel Corporation Host Bridge/DRAM Registers
>            +-02.0  Intel Corporation Skylake GT2 [HD Graphics 520]
>            +-1c.0-[01]----00.0  NVIDIA Corporation Device 134d
>            +-1d.0-[02-3a]----00.0-[03-3a]--+-00.0-[04]--
>            |                               \\-01.0-[05-3a]----00.0-[06-3a]----01.0-[07]--+-00.0  NVIDIA Corporation Device 2204
>            |                                                                            \\-00.1  NVIDIA Corporation GA102 High Definition Audio Controller
>            \\-1f.4  Intel Corporation Sunrise Point-LP SMBus
"""


def test_a_quoted_tree_places_every_device_on_its_bus() -> None:
    assert looks_like_tree(QUOTED)
    devices = {d.address: d for d in parse_lspci_tree(QUOTED)}
    assert devices["0000:07:00.0"].bridges == (
        "0000:00:1d.0",
        "0000:02:00.0",
        "0000:03:01.0",
        "0000:05:00.0",
        "0000:06:01.0",
    )
    assert devices["0000:00:1f.4"].bridges == ()
    assert devices["0000:02:00.0"].is_bridge and not devices["0000:07:00.1"].is_bridge
    assert devices["0000:07:00.1"].device_name == "GA102 High Definition Audio Controller"


def test_tree_gpus_named_by_id_count_only_where_the_gpu_table_knows_the_id() -> None:
    gpus = {g.pci_address: g for g in gpus_in_text(QUOTED)}
    # 2204 is the RTX 3090 (GA102); 134d is a GM108M the table knows too; the audio function and
    # the bridges are not GPUs.
    assert set(gpus) == {"0000:00:02.0", "0000:01:00.0", "0000:07:00.0"}
    assert gpus["0000:07:00.0"].device_id == "2204"
    assert gpus["0000:07:00.0"].architecture == "Ampere"
    assert len(gpus["0000:07:00.0"].bridges) == 5


def test_plain_lspci_output_is_no_tree() -> None:
    assert not looks_like_tree("01:00.0 VGA compatible controller: NVIDIA Corporation GA102\n")
    assert parse_lspci_tree("no tree here\n[broken\n") == ()
