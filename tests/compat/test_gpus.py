"""The GPU table: ids, names, codenames, series and id ranges resolve to the right architecture."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from egpu_setup.compat import gpus
from egpu_setup.compat.gpus import (
    GpuModel,
    all_gpus,
    arch_from_device_id,
    arch_from_text,
    gpu_by_id,
    gpu_by_name,
    is_mobile_name,
)


@pytest.mark.parametrize(
    ("device_id", "name", "arch", "cc", "mobile"),
    [
        pytest.param("2b85", "GeForce RTX 5090", "Blackwell", "12.0", False, id="id-rtx5090"),
        pytest.param("2c02", "GeForce RTX 5080", "Blackwell", "12.0", False, id="id-rtx5080"),
        pytest.param("2684", "GeForce RTX 4090", "Ada Lovelace", "8.9", False, id="id-rtx4090"),
        pytest.param("2704", "GeForce RTX 4080", "Ada Lovelace", "8.9", False, id="id-rtx4080"),
        pytest.param("2786", "GeForce RTX 4070", "Ada Lovelace", "8.9", False, id="id-rtx4070"),
        pytest.param("2204", "GeForce RTX 3090", "Ampere", "8.6", False, id="id-rtx3090"),
        pytest.param("2206", "GeForce RTX 3080", "Ampere", "8.6", False, id="id-rtx3080"),
        pytest.param(
            "2216", "GeForce RTX 3080 Lite Hash Rate", "Ampere", "8.6", False, id="id-rtx3080-lhr"
        ),
        pytest.param("2503", "GeForce RTX 3060", "Ampere", "8.6", False, id="id-rtx3060"),
        pytest.param(
            "24a0",
            "GeForce RTX 3070 Ti Laptop GPU",
            "Ampere",
            "8.6",
            True,
            id="id-rtx3070ti-laptop",
        ),
        pytest.param("24b0", "RTX A4000", "Ampere", "8.6", False, id="id-rtx-a4000"),
        pytest.param("1b06", "GeForce GTX 1080 Ti", "Pascal", "6.1", False, id="id-gtx1080ti"),
        pytest.param("1c81", "GeForce GTX 1050", "Pascal", "6.1", False, id="id-gtx1050"),
        pytest.param("20b5", "A100 PCIe 80GB", "Ampere", "8.0", False, id="id-a100"),
        pytest.param("2330", "H100 SXM5 80GB", "Hopper", "9.0", False, id="id-h100"),
        pytest.param("2e12", "GB10", "Blackwell", "12.1", False, id="id-gb10"),
        pytest.param(
            "10DE:2B85",
            "GeForce RTX 5090",
            "Blackwell",
            "12.0",
            False,
            id="id-vendor-prefixed-upper",
        ),
        pytest.param("0x2684", "GeForce RTX 4090", "Ada Lovelace", "8.9", False, id="id-sysfs-0x"),
    ],
)
def test_gpu_by_id(device_id: str, name: str, arch: str, cc: str, mobile: bool) -> None:
    model = gpu_by_id(device_id)
    assert model is not None
    assert (model.name, model.architecture, model.compute_capability, model.mobile) == (
        name,
        arch,
        cc,
        mobile,
    )
    assert model.source


def test_rtx4090_row_is_complete() -> None:
    row = gpu_by_id("2684")
    assert row is not None
    assert row == GpuModel(
        device_id="2684",
        name="GeForce RTX 4090",
        architecture="Ada Lovelace",
        compute_capability="8.9",
        codename="AD102",
        memory_gib=24,
        fp32_tflops=82.6,
        fp16_tflops=82.6,
        mobile=False,
        source=row.source,
    )


@pytest.mark.parametrize("device_id", ["9999", "1002:744c", "", "zz", "26841", None])
def test_gpu_by_id_unknown(device_id: str | None) -> None:
    assert gpu_by_id(device_id) is None  # type: ignore[arg-type]  # None too: what a caller may pass


@pytest.mark.parametrize(
    ("text", "device_id"),
    [
        pytest.param("AD102 [GeForce RTX 4090]", "2684", id="name-pciids-rtx4090"),
        pytest.param("NVIDIA GeForce RTX 4090", "2684", id="name-smi-rtx4090"),
        pytest.param("GeForce RTX 5090", "2b85", id="name-marketing-rtx5090"),
        pytest.param("GB202 [GeForce RTX 5090]", "2b85", id="name-pciids-rtx5090"),
        pytest.param("NVIDIA GeForce RTX 4090 D", "2685", id="name-4090d-not-4090"),
        pytest.param("RTX A4000", "24b0", id="name-rtx-a4000"),
        pytest.param("NVIDIA RTX A4000", "24b0", id="name-smi-rtx-a4000"),
        pytest.param("GA104GL [RTX A4000]", "24b0", id="name-pciids-rtx-a4000"),
        pytest.param("NVIDIA GeForce RTX 3070 Ti Laptop GPU", "24a0", id="name-smi-3070ti-laptop"),
        pytest.param(
            "GA104 [Geforce RTX 3070 Ti Laptop GPU]", "24a0", id="name-pciids-lowercase-f"
        ),
        pytest.param("GA104M [GeForce RTX 3070 Mobile / Max-Q]", "249d", id="name-mobile-maxq"),
        pytest.param("GA102 [GeForce RTX 3080 Lite Hash Rate]", "2216", id="name-lhr-own-id"),
        pytest.param("GeForce RTX 3080 Lite Hash Rate Edition", "2216", id="name-lhr-suffix"),
        pytest.param("TU106 [GeForce RTX 2060 Rev. A]", "1f08", id="name-rev-a-suffix"),
        pytest.param("GP102 [GeForce GTX 1080 Ti 10GB]", "1b01", id="name-10gb-own-id"),
        pytest.param("GeForce GTX 1080 Ti 11GB", "1b06", id="name-memory-suffix"),
        pytest.param("GeForce GTX 1080 Ti", "1b06", id="name-old-driver-no-nvidia"),
        pytest.param("GH100[H100 SXM5 80GB]", "2330", id="name-pciids-no-space-before-bracket"),
        pytest.param("NVIDIA A100-PCIE-40GB", "20f1", id="name-smi-a100-alias"),
        pytest.param(
            "AD102GL [L6000 / RTX 6000 Ada Generation]", "26b1", id="name-slash-alternatives"
        ),
        pytest.param(
            "GB203M / GN22 [GeForce RTX 5090 Max-Q / Mobile]", "2c18", id="name-5090-laptop"
        ),
    ],
)
def test_gpu_by_name(text: str, device_id: str) -> None:
    model = gpu_by_name(text)
    assert model is not None and model.device_id == device_id


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("NVIDIA GeForce ...", id="truncated-by-old-table"),
        pytest.param("GeForce RTX 4090 Ti", id="ti-is-another-card"),
        pytest.param("Device 2b85", id="old-pciids-placeholder"),
        pytest.param("Navi 31 [Radeon RX 7900 XT/7900 XTX]", id="amd"),
        pytest.param("", id="empty"),
    ],
)
def test_gpu_by_name_unknown(text: str) -> None:
    assert gpu_by_name(text) is None


def test_a_laptop_name_is_never_the_desktop_card() -> None:
    laptop = gpu_by_name("GeForce RTX 4080 Laptop GPU")
    assert laptop is not None and laptop.mobile and laptop.device_id != "2704"
    desktop = gpu_by_name("NVIDIA GeForce RTX 4080")
    assert desktop is not None and desktop.device_id == "2704"


def test_a_name_shared_by_two_architectures_names_neither() -> None:
    # pci.ids has "GeForce GT 730" for a GK107 (3.0) and a GK208B (3.5) board, "GeForce GT 1030"
    # for a GK107 and a GP108: only the id (or the codename printed with the name) tells them apart.
    boards = [gpu_by_id(i) for i in ("0fc9", "1287")]
    assert {b.compute_capability if b else None for b in boards} == {"3.0", "3.5"}
    assert gpu_by_name("GeForce GT 730") is None and gpu_by_name("GeForce GT 1030") is None
    assert arch_from_text("GK208B [GeForce GT 730]") == ("Kepler", "3.5")
    assert arch_from_text("GP108 [GeForce GT 1030]") == ("Pascal", "6.1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("GB202", ("Blackwell", "12.0"), id="arch-codename-gb202"),
        pytest.param("GB20B", ("Blackwell", "12.1"), id="arch-codename-gb10-die"),
        pytest.param("GB100", ("Blackwell", "10.0"), id="arch-codename-gb100"),
        pytest.param("AD102 [GeForce RTX 4090]", ("Ada Lovelace", "8.9"), id="arch-pciids-rtx4090"),
        pytest.param(
            "AD104GLM [RTX 3500 Ada Generation Laptop GPU]",
            ("Ada Lovelace", "8.9"),
            id="arch-codename-suffix",
        ),
        pytest.param("GA100 [A100 SXM4 40GB]", ("Ampere", "8.0"), id="arch-ga100-not-ga10x"),
        pytest.param("GA107 [GeForce RTX 3050]", ("Ampere", "8.6"), id="arch-ga107"),
        pytest.param("GP100GL [Tesla P100 PCIe 16GB]", ("Pascal", "6.0"), id="arch-gp100"),
        pytest.param("GM206 [GeForce GTX 960]", ("Maxwell", "5.2"), id="arch-gm206"),
        pytest.param("GM107 [GeForce GTX 750 Ti]", ("Maxwell", "5.0"), id="arch-gm107"),
        pytest.param("GV100GL [Tesla V100 SXM2 16GB]", ("Volta", "7.0"), id="arch-gv100"),
        pytest.param("TU116 [GeForce GTX 1660 SUPER]", ("Turing", "7.5"), id="arch-tu116"),
        pytest.param(
            "GN21-X11 [GeForce RTX 4090 Laptop GPU]",
            ("Ada Lovelace", "8.9"),
            id="arch-laptop-board-code",
        ),
        pytest.param("GeForce RTX 5090", ("Blackwell", "12.0"), id="arch-marketing-rtx5090"),
        pytest.param(
            "NVIDIA GeForce RTX 5070 Ti Laptop GPU",
            ("Blackwell", "12.0"),
            id="arch-series-rtx50-laptop",
        ),
        pytest.param(
            "NVIDIA GeForce RTX 4050 Laptop GPU", ("Ada Lovelace", "8.9"), id="arch-series-rtx40"
        ),
        pytest.param(
            "NVIDIA RTX 5000 Ada Generation",
            ("Ada Lovelace", "8.9"),
            id="arch-rtx5000-ada-not-rtx50",
        ),
        pytest.param("Quadro RTX 8000", ("Turing", "7.5"), id="arch-quadro-rtx"),
        pytest.param("NVIDIA RTX A500 Laptop GPU", ("Ampere", "8.6"), id="arch-rtx-a-series"),
        pytest.param(
            "NVIDIA RTX PRO 4000 Blackwell", ("Blackwell", "12.0"), id="arch-rtx-pro-blackwell"
        ),
        pytest.param("NVIDIA GeForce GTX 1660 Ti", ("Turing", "7.5"), id="arch-gtx16"),
        pytest.param("NVIDIA H200 NVL", ("Hopper", "9.0"), id="arch-h200"),
        pytest.param("NVIDIA B300 SXM6", ("Blackwell", "10.3"), id="arch-b300"),
        pytest.param("RTX A4000", ("Ampere", "8.6"), id="arch-table-a4000"),
    ],
)
def test_arch_from_text(text: str, expected: tuple[str, str]) -> None:
    assert arch_from_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "NVIDIA GeForce ...",
        "Intel Corporation Iris Xe",
        "Navi 31 [Radeon RX 7900 XTX]",
        "3d controller",
    ],
)
def test_arch_from_text_unknown(text: str) -> None:
    assert arch_from_text(text) is None


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        pytest.param("2b85", ("Blackwell", "12.0"), id="range-table-row"),
        pytest.param("2b89", ("Blackwell", "12.0"), id="range-gb202-unknown-id"),
        pytest.param("2f38", ("Blackwell", "12.0"), id="range-gb205"),
        pytest.param("2e2a", ("Blackwell", "12.1"), id="range-gb20b"),
        pytest.param("2901", ("Blackwell", "10.0"), id="range-gb100"),
        pytest.param("28a1", ("Ada Lovelace", "8.9"), id="range-ad107"),
        pytest.param("2324", ("Hopper", "9.0"), id="range-gh100"),
        pytest.param("25a2", ("Ampere", "8.6"), id="range-ga107m"),
        pytest.param("20b7", ("Ampere", "8.0"), id="range-ga100"),
        pytest.param("2191", ("Turing", "7.5"), id="range-tu116m"),
        pytest.param("1f95", ("Turing", "7.5"), id="range-tu117m"),
        pytest.param("1d01", ("Pascal", "6.1"), id="range-gp108"),
        pytest.param("139b", ("Maxwell", "5.0"), id="range-gm107m"),
        pytest.param("1401", ("Maxwell", "5.2"), id="range-gm206"),
        pytest.param("1287", ("Kepler", "3.5"), id="row-kepler-gk208b"),
        pytest.param("1001", ("Kepler", "3.5"), id="row-kepler-gk110b"),
        pytest.param("0fc6", ("Kepler", "3.0"), id="row-kepler-gk107"),
        pytest.param("0400", None, id="tesla-architecture-by-codename-only"),
        pytest.param("0dfc", None, id="fermi-by-codename-only"),
        pytest.param("0100", None, id="nv10-no-cuda"),
        pytest.param("3201", None, id="gb112-compute-capability-unknown"),
        pytest.param("1002:73bf", None, id="range-not-nvidia"),
    ],
)
def test_arch_from_device_id(device_id: str, expected: tuple[str, str] | None) -> None:
    assert arch_from_device_id(device_id) == expected


def test_every_table_row_agrees_with_its_codename_and_id_range() -> None:
    # The three sources of truth must not contradict each other.
    for model in all_gpus():
        assert model.source, model
        if model.codename:
            assert arch_from_text(model.codename) in (
                None,
                (model.architecture, model.compute_capability),
            ), model
        ranged = gpus._table().ranges  # the data itself, not an API
        value = int(model.device_id, 16)
        for r in ranged:
            if r.first <= value <= r.last:
                assert (r.architecture, r.cc) == (model.architecture, model.compute_capability), (
                    model
                )


def test_every_model_resolves_by_its_own_name() -> None:
    for model in all_gpus():
        found = gpu_by_name(model.name)
        if found is None:  # only names that boards of two compute capabilities share
            assert gpus._canonical(model.name) in gpus._names().ambiguous, model
            continue
        assert found.compute_capability == model.compute_capability, (model, found)
        if is_mobile_name(model.name):  # a laptop name is a laptop row (not always vice versa:
            assert model.mobile, model  # pci.ids marks "GM107GLM [Quadro M2000M]" by codename)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NVIDIA GeForce RTX 3070 Ti Laptop GPU", True),
        ("GA104M [GeForce RTX 3070 Mobile / Max-Q]", True),
        ("GeForce RTX 2080 with Max-Q Design", True),
        ("NVIDIA GeForce RTX 4090", False),
        ("", False),
        (None, False),
    ],
)
def test_is_mobile_name(text: str | None, expected: bool) -> None:
    assert is_mobile_name(text) is expected


def test_yaml_rows_all_carry_a_source() -> None:
    from importlib import resources

    data = yaml.safe_load(
        resources.files("egpu_setup.data").joinpath("gpus.yaml").read_text(encoding="utf-8")
    )
    for line in data["models"].splitlines():
        keys = line.split("|")[8].strip().split(",")
        assert keys and all(k in data["sources"] for k in keys), line
        assert "pciids" in keys or "overlay" in line, line
    for section in ("codenames", "series", "id_ranges"):
        assert data[section], section
        for row in data[section]:
            assert row.get("source"), (section, row)


def test_import_does_not_load_the_table() -> None:
    code = (
        "import sys, egpu_setup.compat.gpus as g\n"
        "assert g._table.cache_info().currsize == 0\n"
        "assert 'yaml' not in sys.modules, 'yaml imported at module import'\n"
        "g.gpu_by_id('2684'); assert g._table.cache_info().currsize == 1\n"
        "g.gpu_by_id('2b85'); assert g._table.cache_info().hits >= 1\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_damaged_table_raises_matrix_error() -> None:
    from egpu_setup.errors import MatrixError

    columns = ["id", "codename", "architecture", "cc", "mobile", "memory_gib", "fp32", "fp16"]
    columns += ["src", "name", "aliases"]
    row = "1234 | AD102 | Ada Lovelace | 8.9 | - | - | - | - | s | n"
    assert gpus._build({"columns": columns, "sources": {"s": "x"}, "models": row}).by_id
    with pytest.raises(MatrixError, match=r"models line 1: bad row 'xyz"):
        gpus._build({"columns": columns, "sources": {"s": "x"}, "models": "xyz" + row[4:]})
    with pytest.raises(MatrixError, match=r"models line 1: bad row"):
        gpus._build({"columns": columns, "sources": {}, "models": row})
    with pytest.raises(MatrixError, match=r"listed twice"):
        gpus._build({"columns": columns, "sources": {"s": "x"}, "models": f"{row}\n{row}"})
    with pytest.raises(MatrixError, match=r"'big' is not a number"):
        gpus._build(
            {
                "columns": columns,
                "sources": {"s": "x"},
                "models": "1234 | AD102 | Ada Lovelace | 8.9 | - | big | - | - | s | n",
            }
        )
    with pytest.raises(MatrixError, match=r"bad row"):  # the mobile column is y or -
        gpus._build(
            {"columns": columns, "sources": {"s": "x"}, "models": row.replace("| - |", "| no |", 1)}
        )
    with pytest.raises(MatrixError, match=r"columns"):
        gpus._build({"columns": ["id"], "models": row})
    with pytest.raises(MatrixError, match=r"codenames\[0\].pattern"):
        gpus._build(
            {
                "columns": columns,
                "codenames": [{"pattern": "(", "architecture": "a", "cc": "1", "source": "s"}],
            }
        )


# -- the generated table ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
TABLE_INPUTS = ROOT / "scripts" / "gpu_table"


def _generator() -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen_gpu_table", ROOT / "scripts" / "gen_gpu_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_gpu_table", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_generator_reproduces_the_committed_table() -> None:
    gen = _generator()
    committed = (ROOT / "egpu_setup" / "data" / "gpus.yaml").read_text(encoding="utf-8")
    assert gen.generate() == committed, "run python scripts/gen_gpu_table.py"


def test_every_maxwell_and_newer_gpu_id_in_pciids_resolves() -> None:
    gen = _generator()
    arch = yaml.safe_load((TABLE_INPUTS / "architectures.yaml").read_text(encoding="utf-8"))
    section = (TABLE_INPUTS / "pci.ids-nvidia.txt").read_text(encoding="utf-8")
    not_gpu = re.compile(arch["not_gpu"])
    checked = unresolved = 0
    for device_id, full in gen.pciids_devices(section):
        codename, _ = gen.split_name(full)
        if not gen.MAXWELL_AND_NEWER.match(codename.upper()) or not_gpu.search(full):
            continue
        if any(re.match(u["pattern"], codename.upper()) for u in arch["unresolved"]):
            assert gpu_by_id(device_id) is None, (device_id, full)
            unresolved += 1
            continue
        model = gpu_by_id(device_id)
        assert model is not None and model.architecture and model.compute_capability, full
        assert arch_from_device_id(device_id) == (model.architecture, model.compute_capability)
        checked += 1
    # Every reason-less gap would fail above; the unresolved ones are few and listed with reasons.
    assert checked > 600 and unresolved < 20, (checked, unresolved)
    assert all(u.get("reason") for u in arch["unresolved"])


def test_tesla_and_fermi_are_known_by_codename_not_listed() -> None:
    # No driver branch egpu-setup plans drives them (drivers.yaml starts at Kepler).
    assert arch_from_text("GF108GLM [NVS 5200M]") == ("Fermi", "2.1")
    assert arch_from_text("GT218M [NVS 3100M]") == ("Tesla", "1.2")
    assert {m.architecture for m in all_gpus()}.isdisjoint({"Fermi", "Tesla"})


def test_the_pciids_section_keeps_its_licence_and_source() -> None:
    head = (TABLE_INPUTS / "pci.ids-nvidia.txt").read_text(encoding="utf-8")[:2500]
    assert "GNU General Public License" in head and "3-clause BSD License" in head
    assert re.search(r"Debian package pci\.ids\s+#?\s*0\.0~2026\.10\.24-1", head)
    assert "\n10de  NVIDIA Corporation\n" in (TABLE_INPUTS / "pci.ids-nvidia.txt").read_text()


@pytest.mark.parametrize(
    ("device_id", "name", "arch", "cc", "mobile"),
    [
        ("139b", "GeForce GTX 960M", "Maxwell", "5.0", True),
        ("134d", "GeForce 940MX", "Maxwell", "5.0", True),
        ("1d10", "GeForce MX150", "Pascal", "6.1", True),
        ("1f91", "GeForce GTX 1650 Mobile / Max-Q", "Turing", "7.5", True),
        ("2520", "GeForce RTX 3060 Laptop GPU", "Ampere", "8.6", True),
        ("28a0", "GeForce RTX 4060 Max-Q / Mobile", "Ada Lovelace", "8.9", True),
        ("1bb3", "Tesla P4", "Pascal", "6.1", False),
        ("15f8", "Tesla P100 PCIe 16GB", "Pascal", "6.0", False),
        ("17fd", "Tesla M40", "Maxwell", "5.2", False),
        ("1eb8", "Tesla T4", "Turing", "7.5", False),
        ("1c03", "GeForce GTX 1060 6GB", "Pascal", "6.1", False),
        ("2335", "H200 SXM 141GB", "Hopper", "9.0", False),
        ("3182", "B300 SXM6 AC", "Blackwell", "10.3", False),
        ("2b00", "Jetson AGX Thor", "Blackwell", "11.0", False),
    ],
)
def test_parts_the_hand_written_table_lacked(
    device_id: str, name: str, arch: str, cc: str, mobile: bool
) -> None:
    model = gpu_by_id(device_id)
    assert model is not None
    assert (model.name, model.architecture, model.compute_capability, model.mobile) == (
        name,
        arch,
        cc,
        mobile,
    )
    assert arch_from_text(name) == (arch, cc)


def test_the_generator_refuses_an_unmapped_codename(tmp_path: Path) -> None:
    gen = _generator()
    arch = yaml.safe_load((TABLE_INPUTS / "architectures.yaml").read_text(encoding="utf-8"))
    section = "10de  NVIDIA Corporation\n\t9999  GZ999 [GeForce Future]\n\t9998  GB112\n"
    ok = gen.build(section, arch, {"rows": []})
    assert ok["models"] == []  # GZ is no GPU family; GB112 is listed as unresolved, with a reason
    arch["codenames"] = [c for c in arch["codenames"] if c["pattern"] != "^GB20[2-7]"]
    with pytest.raises(ValueError, match="no codename rule maps GB202"):
        gen.build(
            "10de  NVIDIA Corporation\n\t2b85  GB202 [GeForce RTX 5090]\n", arch, {"rows": []}
        )
    with pytest.raises(ValueError, match="overlay 2b85 says Ampere"):
        gen.build(
            "\t2b85  GB202 [GeForce RTX 5090]\n",
            yaml.safe_load((TABLE_INPUTS / "architectures.yaml").read_text(encoding="utf-8")),
            {
                "sources": {"s": "x"},
                "rows": [{"ids": ["2b85"], "architecture": "Ampere", "cc": "8.6", "source": "s"}],
            },
        )
