"""The glibc floor: wheel tags, each torch release's floor, each distro's glibc, the resolver."""

from __future__ import annotations

import pytest
import yaml

from egpu_setup.compat import glibc
from egpu_setup.compat.glibc import (
    distro_glibc,
    glibc_key,
    parse_glibc_report,
    tag_glibc,
    torch_floor,
)
from egpu_setup.errors import MatrixError, UsageError
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolver import resolve
from helpers.cli_runner import invoke


@pytest.mark.parametrize(
    ("tag", "needs"),
    [
        ("manylinux_2_28_x86_64", "2.28"),
        ("manylinux_2_17_x86_64.manylinux2014_x86_64", "2.17"),
        ("manylinux_2_27_x86_64.manylinux_2_28_x86_64", "2.27"),  # a compressed set: its lowest
        ("manylinux1_x86_64", "2.5"),
        ("manylinux2010_x86_64", "2.12"),
        ("linux_x86_64", None),
        ("win_amd64", None),
        ("", None),
        (None, None),
    ],
)
def test_tag_glibc(tag: str | None, needs: str | None) -> None:
    assert tag_glibc(tag) == needs


@pytest.mark.parametrize(
    ("distro", "version", "expected"),
    [
        ("ubuntu", "18.04", "2.27"),
        ("ubuntu", "24.04", "2.39"),
        ("debian", "12", "2.36"),
        ("debian", "13", "2.41"),
        ("centos", "7", "2.17"),
        ("rhel", "8.10", "2.28"),  # a point release: its major's glibc
        ("ubuntu", "26.04", None),
        ("arch", None, None),
        (None, "1", None),
    ],
)
def test_distro_glibc(distro: str | None, version: str | None, expected: str | None) -> None:
    found = distro_glibc(distro, version)
    assert (found[0] if found else None) == expected
    if found:
        assert found[1]  # every row names its source


@pytest.mark.parametrize(
    ("version", "variant", "needs"),
    [
        ("2.0.1", "cu118", "2.17"),
        ("2.5.1", "cpu", "2.17"),
        ("2.6.0", "cu118", "2.17"),
        ("2.6.0", "cu124", "2.17"),
        ("2.6.0", "cu126", "2.28"),
        ("2.7.0", "cu118", "2.28"),
        ("2.7.0", "cpu", "2.28"),
        ("2.16.0", "cu132", "2.28"),  # newer than the data: the open-ended row
    ],
)
def test_torch_floor(version: str, variant: str, needs: str) -> None:
    floor = torch_floor(version, variant)
    assert floor is not None and floor.glibc == needs and floor.source


@pytest.mark.parametrize(
    ("version", "variant", "needs", "tag"),
    [
        ("1.8.0", "cpu", "2.17", "manylinux2014_aarch64"),
        ("2.5.1", "cpu", "2.17", "manylinux2014_aarch64"),
        # x86_64's 2.6.0 cpu wheel is still manylinux1; the aarch64 one is already 2_28
        ("2.6.0", "cpu", "2.28", "manylinux_2_28_aarch64"),
        ("2.7.0", "cu128", "2.28", "manylinux_2_28_aarch64"),
        ("2.16.0", "cu132", "2.28", "manylinux_2_28_aarch64"),
    ],
)
def test_aarch64_floors_are_its_own(version: str, variant: str, needs: str, tag: str) -> None:
    floor = torch_floor(version, variant, "aarch64")
    assert floor is not None and (floor.glibc, floor.tag, floor.machine) == (needs, tag, "aarch64")


def test_every_shipped_wheel_has_a_floor_and_every_packaged_distro_a_glibc() -> None:
    from egpu_setup.compat.matrix import load_snapshot

    m = load_snapshot()
    for release in m.torch:
        for variant in release.variants:
            assert torch_floor(release.version, variant.name), (release.version, variant.name)
    for release in m.for_machine("aarch64").torch:
        for variant in release.variants:
            floor = torch_floor(release.version, variant.name, "aarch64")
            assert floor and floor.tag.endswith("_aarch64"), (release.version, variant.name)
    for d in m.distros:
        assert distro_glibc(d.id, d.version_id), d.label


def test_a_damaged_floor_row_is_a_matrix_error(monkeypatch: pytest.MonkeyPatch) -> None:
    glibc._floors.cache_clear()
    monkeypatch.setattr(glibc, "_read", lambda name: {"manylinux": [{"releases": ">=2.7"}]})
    try:
        with pytest.raises(MatrixError, match=r"torch.yaml: manylinux\[0\]"):
            torch_floor("2.7.0", "cpu")
    finally:
        glibc._floors.cache_clear()


def test_glibc_key() -> None:
    assert glibc_key("2.28") == (2, 28) > (glibc_key("2.9") or (0, 0))
    assert glibc_key("x") is None and glibc_key(None) is None


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("ldd (GNU libc) 2.36\n", "glibc", "2.36"),
        ("ldd (Ubuntu GLIBC 2.35-0ubuntu3.8) 2.35\n", "distro", "ubuntu-22.04"),
        ('ID="rocky"\nVERSION_ID="9.4"\nldd (GNU libc) 2.34\n', "distro", "rocky-9.4"),
        (
            "pip install torch --index-url https://download.pytorch.org/whl/cu126",
            "variant",
            "cu126",
        ),
        ("torch-2.7.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl is not", "python", "3.12"),
        (
            "version `GLIBC_2.29' not found; version `GLIBC_2.34' not found",
            "required_glibc",
            "2.34",
        ),
    ],
)
def test_parse_glibc_report_fields(text: str, field: str, value: str) -> None:
    assert getattr(parse_glibc_report(text), field) == value


@pytest.mark.parametrize("text", [None, "", "no glibc here\n", "ldd (GNU libc)\n"])
def test_parse_glibc_report_knows_nothing(text: str | None) -> None:
    report = parse_glibc_report(text)
    assert report.glibc is None and report.distro is None and report.wheel_tag is None


# -- the resolver --------------------------------------------------------------------------------


def test_ubuntu_1804_gets_the_newest_torch_its_glibc_loads() -> None:
    res = resolve(None, None, Constraints(distro="ubuntu-18.04", gpu="10de:2204", python="3.10"))
    assert res.torch.version == "2.6.0"
    why = [r for r in res.reasons if r.startswith("glibc 2.27 (ubuntu-18.04)")]
    assert why and "need glibc 2.28 (manylinux_2_28_x86_64)" in why[0]


def test_a_new_enough_glibc_changes_nothing() -> None:
    res = resolve(None, None, Constraints(distro="ubuntu-24.04", gpu="10de:2204"))
    assert not any(r.startswith("glibc") for r in res.reasons)
    assert res.torch.version.split(".")[:2] != ["2", "6"]


def test_the_glibc_what_if_overrides_the_distro() -> None:
    res = resolve(None, None, Constraints(distro="ubuntu-24.04", glibc="2.17", gpu="10de:2204"))
    assert res.torch.version == "2.6.0"
    with pytest.raises(UsageError, match="glibc 'new'"):
        resolve(None, None, Constraints(glibc="new", gpu="10de:2204"))


def test_blackwell_on_glibc_2_27_has_no_wheel() -> None:
    # sm_120 kernels exist only in torch >= 2.7, whose wheels all need glibc 2.28.
    with pytest.raises(MatrixError, match=r"loads on glibc 2\.27 \(ubuntu-18\.04\)") as info:
        resolve(None, None, Constraints(distro="ubuntu-18.04", gpu="10de:2b85"))
    assert "glibc >= 2.28" in (info.value.hint or "")


def test_glibc_227_loads_torch_2_6_on_x86_64_but_not_on_aarch64() -> None:
    ask: tuple[str, ...] = (
        "resolve",
        "--distro",
        "ubuntu-18.04",
        "--gpu",
        "10de:2684",
        "--python",
        "3.10",
    )
    ask += ("--torch", "2.6.0", "--cuda", "cpu")
    r = invoke(*ask, "--arch", "x86_64")
    assert r.returncode == 0, r.stderr
    assert "2.6.0+cpu" in r.stdout
    r = invoke(*ask, "--arch", "aarch64")
    assert r.returncode == 2, r.stdout
    assert r.stderr.startswith(
        "error: no torch wheel matching the request loads on glibc 2.27 (ubuntu-18.04): "
        "torch 2.6.0+cpu needs glibc 2.28 (manylinux_2_28_aarch64)"
    )
    assert "hint: " in r.stderr and "Traceback" not in r.stderr
    # without the pin, the arm64 host gets the last manylinux2014 release
    res = resolve(
        None,
        None,
        Constraints(
            distro="ubuntu-18.04", gpu="10de:2684", python="3.10", cuda="cpu", machine="aarch64"
        ),
    )
    assert res.torch.version == "2.5.1"
    assert any("manylinux_2_28_aarch64" in r for r in res.reasons), res.reasons


def test_cli_refuses_a_torch_the_distro_cannot_load() -> None:
    r = invoke("resolve", "--distro", "ubuntu-18.04", "--gpu", "10de:2204", "--torch", "2.9")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: no torch wheel matching the request loads on glibc 2.27")
    assert "hint: " in r.stderr and "drop --torch" in r.stderr
    assert "Traceback" not in r.stderr
    r = invoke("resolve", "--distro", "centos-6", "--gpu", "10de:2204")
    assert r.returncode == 2 and "glibc >= 2.17" in r.stderr


def test_the_data_files_cite_their_sources() -> None:
    from importlib import resources

    data = resources.files("egpu_setup.data")
    for row in yaml.safe_load(data.joinpath("torch.yaml").read_text())["manylinux"]:
        assert row["source"] and ("github.com" in row["source"] or "pytorch" in row["source"])
    for row in yaml.safe_load(data.joinpath("distros.yaml").read_text())["glibc"]:
        assert row["source"]
