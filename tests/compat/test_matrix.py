"""The shipped compatibility data: internal consistency, loader errors, value types, `matrix show`."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from importlib import resources
from typing import Any

import pytest
import yaml

from egpu_setup.compat import matrix as mx
from egpu_setup.compat.matrix import load_snapshot
from egpu_setup.compat.versions import (
    ArchList,
    ComputeCapability,
    DriverVersion,
    PythonVersion,
    parse_torch_version,
    parse_variant,
)
from egpu_setup.errors import MatrixError
from helpers.cli_runner import invoke


def raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(
        resources.files("egpu_setup.data").joinpath(name).read_text()
    )
    return data


def _arch(version: str, variant: str) -> ArchList:
    """The arch list of a release row the test expects in the shipped matrix."""
    t = M.torch_version(version)
    row = t.variant(variant) if t is not None else None
    assert row is not None and row.arch is not None, (version, variant)
    return row.arch


M = load_snapshot()


# -- consistency ---------------------------------------------------------------------------------------


def test_every_cuda_variant_has_a_driver_floor_and_every_floor_is_used() -> None:
    floors = {c.variant for c in M.cuda}
    used = {v.name for t in M.torch for v in t.variants if v.name != "cpu"}
    assert used <= floors, used - floors
    assert floors <= used, floors - used
    for c in M.cuda:
        assert c.min_driver_windows >= DriverVersion(450)
        major = int(c.cuda.split(".")[0])
        # NVIDIA minor-version compatibility: one floor per CUDA major.
        assert (
            c.min_driver
            == {
                11: DriverVersion(450, 80, 2),
                12: DriverVersion(525, 60, 13),
                13: DriverVersion(580),
            }[major]
        )


def test_every_arch_list_parses_and_round_trips() -> None:
    for t in M.torch:
        for v in t.variants:
            if v.name == "cpu":
                assert v.arch is None
                continue
            assert ArchList.from_str(str(v.arch)) == v.arch
            # +PTX only on the highest entry (how TORCH_CUDA_ARCH_LIST is written)
            assert all(p == max(v.arch.cubins) for p in v.arch.ptx), (t.version, v.name)


def test_every_row_has_a_source() -> None:
    for name, sections in {
        "cuda.yaml": ["variants", "toolkit_drivers"],
        "torch.yaml": ["releases"],
        "drivers.yaml": ["architectures", "branches"],
        "distros.yaml": ["distros"],
    }.items():
        data = raw(name)
        for section in sections:
            for i, row in enumerate(data[section]):
                assert isinstance(row.get("source"), str) and row["source"].strip(), (
                    f"{name} {section}[{i}]"
                )
    for key in raw("distros.yaml")["nvidia_repo"]["keys"]:
        assert key["source"]
    assert raw("distros.yaml")["nvidia_repo"]["source"]


def test_ids_are_unique() -> None:
    versions = [t.version for t in M.torch]
    assert len(versions) == len(set(versions))
    assert versions == sorted(versions, key=mx.version_key, reverse=True)
    assert len({c.variant for c in M.cuda}) == len(M.cuda)
    assert len({b.branch for b in M.branches}) == len(M.branches)
    assert len({d.label for d in M.distros}) == len(M.distros)
    for t in M.torch:
        names = [v.name for v in t.variants]
        assert len(names) == len(set(names)) and "cpu" in names


def test_architectures_do_not_overlap() -> None:
    archs = sorted(M.architectures, key=lambda a: a.cc_min)
    for a, b in itertools.pairwise(archs):
        assert a.cc_max < b.cc_min, (a.name, b.name)
    for a in archs:
        assert a.cc_min <= a.cc_max
        assert not (a.needs_open and not a.open_modules)
        # Open modules exist only for Turing and newer (NVIDIA 'Kernel Modules' page).
        assert a.open_modules == (a.cc_min >= ComputeCapability(7, 5))


def test_release_rows_are_coherent() -> None:
    for t in M.torch:
        assert t.pypi_default is None or t.variant(t.pypi_default) is not None, t.version
        default = t.variant(t.pypi_default) if t.pypi_default is not None else None
        assert default is not None and default.stable, t.version
        pys = [PythonVersion.from_str(p) for p in t.python]
        assert pys == sorted(pys) and pys[0] >= PythonVersion(3, 8)
        assert not set(t.index_only_python) & set(t.python)
        assert t.released and t.released.startswith("20")


def test_distro_rows_are_coherent() -> None:
    known = {b.branch for b in M.branches}
    repo = M.nvidia_repo
    assert set(repo.branches) <= known and repo.recommended_branch in repo.branches
    for d in M.distros:
        branches = {b.branch for b in d.branches}
        assert d.recommended_branch in branches and branches <= known
        assert d.nvidia_repo in repo.directories
        if d.scheme == "debian":
            assert set(d.components) == {"contrib", "non-free", "non-free-firmware"}
            assert d.headers == ("linux-headers-{debarch}",)  # amd64 / arm64 (resolve/packages.py)
    assert set(repo.arch_dirs) == {"x86_64", "aarch64"}
    for directory in repo.directories:
        assert sum(directory in k.dirs for k in repo.keys) == 1
    assert all(len(k.fingerprint) == 40 for k in repo.keys)
    assert set(repo.packages) == {"open", "proprietary", "open_pinned", "proprietary_pinned"}
    # distro ids listed as unsupported never shadow a supported one
    assert not {d.id for d in M.distros} & set(M.known_unsupported)


def test_arm64_sees_only_the_branches_built_for_arm64() -> None:
    arm = M.for_machine("aarch64")
    for x86, a in zip(M.distros, arm.distros, strict=True):
        assert x86.arm64 is not None, x86.label  # every distribution's arm64 archive was read
        gone = {b for b, _ in x86.arm64.not_built}
        assert {b.branch for b in a.branches} == {b.branch for b in x86.branches} - gone
        assert len(a.unplanned) == len(gone) and x86.unplanned == ()
        assert a.recommended_branch in {b.branch for b in a.branches}
        if x86.scheme == "ubuntu":
            assert x86.arm64.kernel_flavours == ("generic", "generic-64k")
    # a distribution nothing was verified for on arm64 plans no archive branch there
    bare = replace(M.distros[0], arm64=None).on_aarch64()
    assert bare.branches == () and "no driver package of ubuntu-22.04" in bare.unplanned[0]


def test_every_gpu_in_the_table_has_an_architecture_row() -> None:
    from egpu_setup.compat import gpus

    for model in gpus.all_gpus():
        cc = ComputeCapability.from_str(model.compute_capability)
        arch = M.architecture(cc)
        assert arch is not None, model.name
        # Architecture names agree between gpus.yaml and drivers.yaml (GB10 is a Blackwell sub-row).
        assert arch.name.split(" (")[0] == model.architecture, model.name


def test_snapshot_dates_agree() -> None:
    dates = {raw(n)["snapshot"] for n in mx.DATA_FILES}
    assert dates == {M.snapshot}


def test_facts_from_the_reference_are_encoded() -> None:
    """A few rows the resolver's policy rests on (docs/sources.md: NVIDIA driver, torch wheels)."""
    t215 = M.torch_version("2.15.0")
    assert t215 is not None
    assert {v.name for v in t215.variants} == {"cpu", "cu130", "cu132"}  # no cu126 any more
    assert t215.python[0] == "3.11"
    assert _arch("2.14.1", "cu126").runs(ComputeCapability(6, 1)) == "sass"
    assert _arch("2.11.0", "cu128").runs(ComputeCapability(7, 0)) is None  # Volta dropped
    assert _arch("2.10.0", "cu128").runs(ComputeCapability(7, 0)) == "sass"
    assert _arch("2.6.0", "cu126").runs(ComputeCapability(12, 0)) is None
    assert _arch("2.7.0", "cu128").runs(ComputeCapability(12, 0)) == "sass"
    pascal = M.architecture(ComputeCapability(6, 1))
    assert pascal is not None
    assert (pascal.last_branch, pascal.open_modules) == (580, False)
    blackwell = M.architecture(ComputeCapability(12, 0))
    assert blackwell is not None
    assert blackwell.needs_open and blackwell.first_driver == DriverVersion(570, 26)


# -- loader errors name the file and key ---------------------------------------------------------------


def test_loader_errors_name_file_and_key() -> None:
    bad = raw("torch.yaml")
    bad["releases"][3]["variants"]["cu121"]["arch"] = "5.0;sm_60"
    with pytest.raises(MatrixError) as info:
        mx._load_torch(bad)
    assert "torch.yaml: releases[3].variants.cu121.arch" in info.value.message
    bad = raw("torch.yaml")
    del bad["releases"][0]["source"]
    with pytest.raises(MatrixError) as info:
        mx._load_torch(bad)
    assert "releases[0].source: every row needs a source" in info.value.message
    bad = raw("cuda.yaml")
    bad["variants"][0]["min_driver"] = "new"
    with pytest.raises(MatrixError) as info:
        mx._load_cuda(bad)
    assert "cuda.yaml: variants[0].min_driver" in info.value.message
    bad = raw("distros.yaml")
    bad["nvidia_repo"]["keys"][0]["fingerprint"] = "3BF863CC"
    with pytest.raises(MatrixError) as info:
        mx._load_distros(bad)
    assert "40-hex-digit" in info.value.message
    bad = raw("distros.yaml")
    bad["distros"][0]["arm64"]["not_built"][0]["branch"] = 390
    with pytest.raises(MatrixError) as info:
        mx._load_distros(bad)
    assert "distros[0].arm64.not_built[0].branch: branch 390 is not one of" in info.value.message
    bad = raw("distros.yaml")
    del bad["distros"][2]["arm64"]["source"]
    with pytest.raises(MatrixError, match=r"distros\[2\]\.arm64\.source"):
        mx._load_distros(bad)
    bad = raw("torch.yaml")
    bad["releases"][0]["variants"]["cu130"] = {"status": "stable"}
    with pytest.raises(MatrixError, match="needs its compiled arch list"):
        mx._load_torch(bad)


# -- value types --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("580.95.05", DriverVersion(580, 95, 5)),
        ("570.26", DriverVersion(570, 26, 0)),
        ("580", DriverVersion(580)),
        (" 550.163.01\n", DriverVersion(550, 163, 1)),
    ],
)
def test_driver_version(text: str, expected: DriverVersion) -> None:
    assert DriverVersion.from_str(text) == expected


@pytest.mark.parametrize("text", ["", "latest", "58", "580.x", "12.8", "5800.1"])
def test_driver_version_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        DriverVersion.from_str(text)


def test_driver_version_order_and_text() -> None:
    assert (
        DriverVersion.from_str("525.60.13")
        < DriverVersion.from_str("525.85.12")
        < DriverVersion(580)
    )
    assert str(DriverVersion.from_str("580.95.05")) == "580.95.05"
    assert str(DriverVersion.from_str("570.26")) == "570.26"
    assert str(DriverVersion(580)) == "580"


@pytest.mark.parametrize(
    "arch,cc,how",
    [
        ("5.0;6.0;7.0;7.5;8.0;8.6;9.0", "8.9", "sass"),  # Ada runs the sm_86 cubin
        ("5.0;6.0;7.0;7.5;8.0;8.6;9.0", "6.1", "sass"),  # GTX 10xx runs sm_60
        ("5.0;6.0;7.0;7.5;8.0;8.6;9.0", "12.0", None),  # RTX 50 before cu128
        ("7.5;8.0;8.6;9.0;10.0;12.0+PTX", "12.1", "sass"),  # GB10 on sm_120
        ("7.5;8.0;8.6;9.0;10.0;12.0+PTX", "13.0", "ptx"),  # a future GPU: JIT from PTX
        ("7.5;8.0;8.6;9.0;10.0;12.0+PTX", "6.1", None),  # Pascal on cu130
        ("7.0;7.5;8.0;8.6;9.0;10.0;12.0", "10.3", "sass"),  # B300 on sm_100
        ("3.7;5.0;6.0;7.0;7.5;8.0;8.6;9.0", "3.5", None),  # Kepler GK110 below sm_37
    ],
)
def test_arch_list_runs(arch: str, cc: str, how: str | None) -> None:
    assert ArchList.from_str(arch).runs(ComputeCapability.from_str(cc)) == how


@pytest.mark.parametrize("text", ["", "8.6+SASS", "sm_86", "8"])
def test_arch_list_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        ArchList.from_str(text)


def test_variant_and_python_parsing() -> None:
    assert parse_variant("CU128") == parse_variant("12.8") == parse_variant("cuda12.8") == "cu128"
    assert parse_variant("cpu") == "cpu"
    for bad in ("rocm6.2", "cu12", "gpu"):
        with pytest.raises(ValueError):
            parse_variant(bad)
    assert str(PythonVersion.from_str("3.12.3")) == "3.12"
    assert PythonVersion.from_str("cp314").tag == "cp314"
    assert parse_torch_version("2.9.1+cu128") == ("2.9.1", "cu128")
    with pytest.raises(ValueError):
        parse_torch_version("two")


# -- matrix show -------------------------------------------------------------------------------------------


def test_matrix_show_json() -> None:
    done = invoke("matrix", "show", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["schema"] == "egpu-setup/matrix/1"
    assert data["snapshot"] == M.snapshot and isinstance(data["snapshot_age_days"], int)
    assert data["overlay"] is None
    assert [t["version"] for t in data["torch"]][:2] == ["2.15.0", "2.14.1"]
    assert all(v["source"] for t in data["torch"] for v in t["variants"])


def test_matrix_show_text() -> None:
    done = invoke("matrix", "show")
    assert done.returncode == 0
    assert "never updated here" in done.stdout
    assert "Pascal" in done.stdout and "<= 580" in done.stdout
    assert "cu130  580" in done.stdout


def test_matrix_help_has_examples() -> None:
    for args in (
        ["matrix", "--help"],
        ["matrix", "show", "--help"],
        ["matrix", "update", "--help"],
    ):
        assert "Examples:" in invoke(*args).stdout
