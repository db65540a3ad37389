"""The driver hold's two drop-ins: golden renders from a recorded dpkg status, the escaping the
unattended-upgrades patterns need, and every value checked before a template sees it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from egpu_setup.detect.dpkg_status import (
    HOLD_PIN,
    HOLD_UNATTENDED,
    driver_packages,
    parse_dpkg_status,
    parse_pins,
)
from egpu_setup.errors import EgpuSetupError
from egpu_setup.render.headers import classify_generated
from egpu_setup.render.hold import hold_files

DATA = Path(__file__).parents[1] / "data" / "doctor"
GOLDEN = Path(__file__).parents[1] / "golden" / "hold"
UPDATE = os.environ.get("EGPU_SETUP_UPDATE_GOLDEN") == "1"


def _held() -> dict[str, str]:
    """The driver packages of the status dpkg wrote in the Debian 12 test root."""
    entries = parse_dpkg_status([(DATA / "dpkg-status-held.txt").read_text()])
    return driver_packages(entries, ("nvidia-driver",))


def test_golden() -> None:
    """tests/golden/hold/debian12-driver-550/ (EGPU_SETUP_UPDATE_GOLDEN=1 rewrites it)."""
    tree = {p.lstrip("/"): c for p, c, _ in hold_files(_held(), "lab-rtx3080", "compute")}
    base = GOLDEN / "debian12-driver-550"
    if UPDATE:
        for rel, content in tree.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(content)
    on_disk = {str(p.relative_to(base)): p.read_text() for p in base.rglob("*") if p.is_file()}
    assert on_disk == tree


def test_the_pin_reads_back_as_what_it_holds_and_carries_our_header() -> None:
    held = _held()
    assert held == {
        "libcuda1": "550.127-1",
        "libnvidia-ml1": "550.127-1",
        "nvidia-driver": "550.127-1",
        "nvidia-kernel-dkms": "550.127-1",
    }
    files = {p: c for p, c, _ in hold_files(held, "lab", "compute")}
    assert set(files) == {HOLD_PIN, HOLD_UNATTENDED}
    assert all(classify_generated(c) == "ours" for c in files.values())
    assert parse_pins(files[HOLD_PIN]) == held


def test_blacklist_patterns_match_their_package_only() -> None:
    held = {"libnvidia-gl-550": "550.127.05-0ubuntu1", "nvidia-g++-tool": "1:2.0+dfsg-1"}
    text = dict((p, c) for p, c, _ in hold_files(held, "lab", "compute"))[HOLD_UNATTENDED]
    patterns = re.findall(r'^    "(.*)";$', text, re.M)
    assert patterns == [r"^libnvidia-gl-550$", r"^nvidia-g\+\+-tool$"]
    # unattended-upgrades matches from the start of the name (re.match)
    for name in held:
        assert [p for p in patterns if re.match(p, name)] == [patterns[sorted(held).index(name)]]
    assert not [p for p in patterns if re.match(p, "libnvidia-gl-550-extra")]


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("libcuda1", '550.127-1";\nPin-Priority: -1'),  # a version that would end the stanza
        ("libcuda1", "*"),  # a glob: would hold nothing in particular
        ('libcuda1"; "^.*', "550.127-1"),  # a name that would widen the blacklist
        ("Libcuda1", "550.127-1"),  # not a Debian package name
    ],
)
def test_a_value_dpkg_would_never_write_is_refused(name: str, version: str) -> None:
    with pytest.raises(EgpuSetupError) as info:
        hold_files({name: version}, "lab", "compute")
    assert "nothing is held" in info.value.message and info.value.hint


def test_nothing_to_hold_is_an_error_with_a_hint() -> None:
    with pytest.raises(EgpuSetupError) as info:
        hold_files({}, "lab", "compute")
    assert "no NVIDIA driver package is installed" in info.value.message
    assert "--hold-driver" in (info.value.hint or "")


def test_driver_packages_follow_the_named_sources_and_installed_state() -> None:
    status = (
        "Package: nvidia-driver\nStatus: install ok installed\nSource: nvidia-graphics-drivers\n"
        "Version: 550.127-1\n\n"
        "Package: libcuda1\nStatus: hold ok installed\n"
        "Source: nvidia-graphics-drivers (550.127-1)\nVersion: 550.127-1\n\n"
        "Package: libnvidia-ml1\nStatus: deinstall ok config-files\n"
        "Source: nvidia-graphics-drivers\nVersion: 550.127-1\n\n"
        "Package: nvidia-settings\nStatus: install ok installed\nVersion: 550.127-1\n"
    )
    entries = parse_dpkg_status([status])
    # an admin's `apt-mark hold` counts as installed; config-files and another source do not
    assert driver_packages(entries, ("nvidia-driver",)) == {
        "libcuda1": "550.127-1",
        "nvidia-driver": "550.127-1",
    }
    # none named: the NVIDIA driver's source packages by name
    assert driver_packages(entries) == driver_packages(entries, ("nvidia-driver",))
