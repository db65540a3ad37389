"""egpu_setup/data/rocm.yaml as compat/rocm.py reads it: every card's gfx target, every wheel's
targets, a source on every row, the firmware package per distribution."""

from __future__ import annotations

from typing import Protocol

import pytest

from egpu_setup.compat.rocm import load_rocm


@pytest.mark.parametrize(
    ("query", "device_id", "gfx", "official"),
    [
        ("RX 7900 XTX", "744c", "gfx1100", True),
        ("7900 XT", "744c", "gfx1100", True),
        ("Radeon PRO W7900", "7448", "gfx1100", True),
        ("W7900", "7448", "gfx1100", True),
        ("RX 9070 XT", "7550", "gfx1201", True),
        ("AMD Radeon RX 6800 XT", "73bf", "gfx1030", False),
        ("RX 7600 XT", "7480", "gfx1102", False),
    ],
)
def test_cards_by_name(query: str, device_id: str, gfx: str, official: bool) -> None:
    g = load_rocm().gpu_named(query)
    assert g is not None and (g.device_id, g.gfx, g.official) == (device_id, gfx, official)


def test_no_nvidia_card_is_taken_for_an_amd_one() -> None:
    assert load_rocm().gpu_named("RTX 4090") is None
    assert load_rocm().gpu("2684") is None


class _Sourced(Protocol):
    """What every row of the ROCm data carries."""

    @property
    def source(self) -> str: ...


def test_every_row_has_a_source_and_every_rdna_family_needs_atomics() -> None:
    d = load_rocm()
    rows: list[_Sourced] = [
        *d.gpus, *d.wheels, *d.overrides, *d.firmware, *d.firmware_gaps, *d.families
    ]  # fmt: skip
    assert all(r.source.strip() for r in rows)
    assert {f.key for f in d.families if f.needs_atomics} == {
        "rdna1",
        "rdna2",
        "rdna3",
        "rdna35",
        "rdna4",
    }


def test_wheel_targets_per_release() -> None:
    d = load_rocm()
    s213 = d.series("2.13")
    assert s213 is not None and [v.name for v in s213.variants] == ["rocm7.1", "rocm7.2"]
    assert "gfx1103" in s213.variants[-1].gfx
    s212 = d.series("2.12")
    assert s212 is not None and "gfx1103" not in s212.variants[-1].gfx
    s25 = d.series("2.5")
    assert s25 is not None and "gfx1101" not in s25.variants[-1].gfx
    s214 = d.series("2.14")
    assert s214 is not None and "gfx906" not in s214.variants[-1].gfx  # rocm7.14 dropped it
    # the override stands in only for targets that no wheel of that era had
    o = d.override("gfx1032")
    assert o is not None and (o.value, o.as_gfx) == ("10.3.0", "gfx1030")
    assert d.override("gfx1100") is None


def test_firmware_per_distribution() -> None:
    d = load_rocm()
    deb = d.firmware_for("debian")
    assert deb is not None and (deb.package, deb.component) == (
        "firmware-amd-graphics",
        "non-free-firmware",
    )
    ubu = d.firmware_for("ubuntu")
    assert ubu is not None and ubu.package == "linux-firmware"
    assert d.firmware_gap("debian", "12", "gfx1201") is not None
    assert d.firmware_gap("debian", "12", "gfx1100") is None
    assert d.firmware_gap("debian", "13", "gfx1201") is None
