"""parse_nvidia_smi over the default table (old and new layouts), -q and --query-gpu CSV."""

from __future__ import annotations

from pathlib import Path

import pytest

from egpu_setup.detect.nvidia_smi import SmiGpu, SmiReport, parse_nvidia_smi

DATA = Path(__file__).parents[1] / "data" / "text"


def sample(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "nvidia-smi-table-550-rtx4090.txt",
            SmiReport(
                driver_version="550.120",
                cuda_version="12.4",
                layout="table",
                gpus=(
                    SmiGpu(
                        index=0,
                        name="NVIDIA GeForce RTX 4090",
                        pci_bus_id="0000:2f:00.0",
                        driver_version="550.120",
                        memory_total_mib=24564,
                        memory_used_mib=2,
                        temperature_c=38.0,
                        power_draw_w=22.0,
                        power_limit_w=450.0,
                        persistence_mode=False,
                    ),
                ),
            ),
            id="smi-table-91col-550-rtx4090",
        ),
        pytest.param(
            "nvidia-smi-table-440-gtx1080ti.txt",
            SmiReport(
                driver_version="440.82",
                cuda_version="10.2",
                layout="table",
                gpus=(
                    SmiGpu(
                        index=0,
                        name="GeForce GTX 108...",
                        pci_bus_id="0000:0c:00.0",
                        driver_version="440.82",
                        memory_total_mib=11177,
                        memory_used_mib=432,
                        temperature_c=38.0,
                        power_draw_w=17.0,
                        power_limit_w=250.0,
                        persistence_mode=False,
                    ),
                ),
            ),
            id="smi-table-79col-440-no-mig-row-gtx1080ti",
        ),
        pytest.param(
            "nvidia-smi-table-wsl-rtx3070ti-laptop.txt",
            SmiReport(
                driver_version="566.14",  # the Windows driver, not the NVIDIA-SMI 565.57.02 build
                cuda_version="12.7",
                layout="table",
                gpus=(
                    SmiGpu(
                        index=0,
                        name="NVIDIA GeForce RTX 3070 ...",
                        pci_bus_id="0000:01:00.0",
                        driver_version="566.14",
                        memory_total_mib=8192,
                        memory_used_mib=836,
                        temperature_c=47.0,
                        power_draw_w=14.0,
                        power_limit_w=125.0,
                        persistence_mode=True,
                    ),
                ),
            ),
            id="smi-table-wsl-566-rtx3070ti-laptop",
        ),
    ],
)
def test_table_layouts(name: str, expected: SmiReport) -> None:
    assert parse_nvidia_smi(sample(name)) == expected


def test_table_470_two_gpus_with_na_power() -> None:
    report = parse_nvidia_smi(sample("nvidia-smi-table-470-two-gpus.txt"))
    assert (report.driver_version, report.cuda_version, report.error) == (
        "470.103.01",
        "11.4",
        None,
    )
    laptop, egpu = report.gpus
    assert (laptop.index, laptop.pci_bus_id, laptop.power_draw_w, laptop.power_limit_w) == (
        0,
        "0000:01:00.0",
        None,
        None,
    )
    assert (laptop.temperature_c, laptop.memory_total_mib) == (46.0, 7982)
    assert (egpu.index, egpu.pci_bus_id, egpu.power_limit_w, egpu.memory_total_mib) == (
        1,
        "0000:3c:00.0",
        350.0,
        24268,
    )


def test_query_550_rtx4090_on_thunderbolt() -> None:
    report = parse_nvidia_smi(sample("nvidia-smi-q-550-rtx4090-tb.txt"))
    assert report == SmiReport(
        driver_version="550.120",
        cuda_version="12.4",
        layout="query",
        gpus=(
            SmiGpu(
                index=0,
                name="NVIDIA GeForce RTX 4090",
                pci_bus_id="0000:2f:00.0",
                uuid="GPU-6a1f3c2e-9b7d-4e55-8c21-0f3b2a9d7e41",
                driver_version="550.120",
                memory_total_mib=24564,
                memory_used_mib=2,
                temperature_c=36.0,
                power_draw_w=21.37,
                power_limit_w=450.0,
                link_gen_current=3,
                link_gen_max=3,
                link_width_current=4,
                link_width_max=16,
                persistence_mode=True,
                throttle_reasons=("Idle",),
                pci_bus="0x2F",
                pci_device_id="0x268410DE",
            ),
        ),
    )


def test_query_470_clocks_throttle_reasons_and_old_power_keys() -> None:
    (gpu,) = parse_nvidia_smi(sample("nvidia-smi-q-470-thermal-throttle.txt")).gpus
    assert gpu.throttle_reasons == (
        "SW Power Cap",
        "HW Slowdown",
        "HW Thermal Slowdown",
        "SW Thermal Slowdown",
    )
    assert (gpu.power_draw_w, gpu.power_limit_w, gpu.temperature_c) == (318.45, 320.0, 91.0)
    assert (gpu.link_gen_current, gpu.link_gen_max, gpu.link_width_current) == (1, 3, 4)
    assert gpu.persistence_mode is False


def test_query_instantaneous_power_draw_of_newer_drivers() -> None:
    text = """\
==============NVSMI LOG==============
Driver Version                            : 570.86.15
CUDA Version                              : 12.8

GPU 00000000:01:00.0
    Product Name                          : NVIDIA GeForce RTX 5090
    GPU Power Readings
        Average Power Draw                : 31.50 W
        Instantaneous Power Draw          : 33.12 W
        Current Power Limit               : 575.00 W
"""
    (gpu,) = parse_nvidia_smi(text).gpus
    assert (gpu.power_draw_w, gpu.power_limit_w) == (33.12, 575.0)


CSV_HEADER = """\
index, name, pci.bus_id, driver_version, memory.total [MiB], memory.used [MiB], temperature.gpu, power.draw [W], power.limit [W], pcie.link.gen.current, pcie.link.gen.max, pcie.link.width.current, pcie.link.width.max, persistence_mode, uuid, clocks_throttle_reasons.active
0, NVIDIA GeForce RTX 3070 Ti Laptop GPU, 00000000:01:00.0, 535.183.01, 8192 MiB, 15 MiB, 44, 12.85 W, [N/A], 4, 4, 16, 16, Disabled, GPU-11111111-2222-3333-4444-555555555555, 0x0000000000000001
1, NVIDIA GeForce RTX 4090, 00000000:3C:00.0, 535.183.01, 24564 MiB, 3 MiB, 35, 27.61 W, 450.00 W, 1, 3, 4, 16, Enabled, GPU-66666666-7777-8888-9999-000000000000, 0x0000000000000044
"""


def test_csv_with_header_two_gpus() -> None:
    report = parse_nvidia_smi(CSV_HEADER)
    assert report.layout == "csv" and report.driver_version == "535.183.01"
    laptop, egpu = report.gpus
    assert laptop == SmiGpu(
        index=0,
        name="NVIDIA GeForce RTX 3070 Ti Laptop GPU",
        pci_bus_id="0000:01:00.0",
        uuid="GPU-11111111-2222-3333-4444-555555555555",
        driver_version="535.183.01",
        memory_total_mib=8192,
        memory_used_mib=15,
        temperature_c=44.0,
        power_draw_w=12.85,
        power_limit_w=None,
        link_gen_current=4,
        link_gen_max=4,
        link_width_current=16,
        link_width_max=16,
        persistence_mode=False,
        throttle_reasons=("Idle",),
    )
    assert egpu.pci_bus_id == "0000:3c:00.0" and egpu.persistence_mode is True
    assert egpu.throttle_reasons == ("SW Power Cap", "HW Thermal Slowdown")


def test_csv_nounits_and_newer_field_names() -> None:
    text = """\
pci.bus_id, name, pcie.link.gen.gpucurrent, pcie.link.gen.max, pcie.link.width.current, memory.total [MiB], clocks_event_reasons.active
00000001:01:00.0, NVIDIA RTX A4000, 3, 4, 8, 16376, 0x0000000000000000
"""
    (gpu,) = parse_nvidia_smi(text).gpus
    assert (gpu.pci_bus_id, gpu.name, gpu.link_gen_current, gpu.link_width_current) == (
        "0001:01:00.0",
        "NVIDIA RTX A4000",
        3,
        8,
    )
    assert gpu.memory_total_mib == 16376 and gpu.throttle_reasons == () and gpu.index == 0


def test_csv_noheader_needs_columns() -> None:
    text = "NVIDIA RTX A400\nNVIDIA GeForce RTX 5090\n"
    assert parse_nvidia_smi(text).gpus == ()
    report = parse_nvidia_smi(text, columns="name")
    assert [g.name for g in report.gpus] == ["NVIDIA RTX A400", "NVIDIA GeForce RTX 5090"]
    assert [g.index for g in report.gpus] == [0, 1]
    row = "00000000:3C:00.0, NVIDIA GeForce RTX 4090, 550.120, 4, 16\n"
    (gpu,) = parse_nvidia_smi(
        row,
        columns=[
            "pci.bus_id",
            "name",
            "driver_version",
            "pcie.link.width.current",
            "pcie.link.width.max",
        ],
    ).gpus
    assert (gpu.pci_bus_id, gpu.driver_version, gpu.link_width_current, gpu.link_width_max) == (
        "0000:3c:00.0",
        "550.120",
        4,
        16,
    )


@pytest.mark.parametrize(
    ("text", "error", "nvml"),
    [
        pytest.param(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n\n",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
            None,
            id="smi-no-driver",
        ),
        pytest.param(
            "Failed to initialize NVML: Driver/library version mismatch\n",
            "Failed to initialize NVML: Driver/library version mismatch",
            None,
            id="smi-mismatch-old",
        ),
        pytest.param(
            "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.107\n",
            "Failed to initialize NVML: Driver/library version mismatch",
            "550.107",
            id="smi-mismatch-with-nvml-version",
        ),
        pytest.param("No devices were found\n", "No devices were found", None, id="smi-no-devices"),
        pytest.param(
            "Unable to determine the device handle for GPU0000:3C:00.0: Unknown Error\n",
            "Unable to determine the device handle for GPU0000:3C:00.0: Unknown Error",
            None,
            id="smi-device-handle-unknown-error",
        ),
        pytest.param(
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display Driver is properly installed and present in your system.\nPlease also try adding directory that contains libnvidia-ml.so to your system PATH.\n",
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display Driver is properly installed and present in your system.",
            None,
            id="smi-no-nvml-library",
        ),
        pytest.param(
            "bash: nvidia-smi: command not found\n",
            "bash: nvidia-smi: command not found",
            None,
            id="smi-not-installed",
        ),
        pytest.param(
            "Failed to initialize NVML: GPU access blocked by the operating system\n",
            "Failed to initialize NVML: GPU access blocked by the operating system",
            None,
            id="smi-wsl-blocked",
        ),
    ],
)
def test_failures_set_error_and_no_gpus(text: str, error: str, nvml: str | None) -> None:
    report = parse_nvidia_smi(text)
    assert report.error == error
    assert report.gpus == ()
    assert report.nvml_version == nvml
    assert report.driver_version is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("+------+\n| NVIDIA-SMI 5", id="truncated-header"),
        pytest.param(
            "|   0  NVIDIA GeForce RTX 4090        Off |   00000000:2F", id="truncated-row"
        ),
        pytest.param("GPU 00000000:01:00.0\n    Product Name : \n", id="query-empty-values"),
        pytest.param("index, name\n0\n", id="csv-short-row"),
        pytest.param("\x00\xff\xfe\x01 |||| : : :\n" * 3, id="binary-ish"),
    ],
)
def test_garbage_never_raises(text: str) -> None:
    report = parse_nvidia_smi(text)
    assert report.error is None
    for gpu in report.gpus:
        assert gpu.name is None or isinstance(gpu.name, str)


# -- variants users paste (the real pastes are in tests/data/real/nvidia-smi) ---------------------


def test_r610_header_kmd_and_cuda_umd_versions() -> None:
    text = (
        "| NVIDIA-SMI 610.43.02              KMD Version: 610.43.02     CUDA UMD Version: 13.3     |\n"
        "|   0  NVIDIA B200                    On  |   00000000:63:00.0 Off |                    0 |\n"
        "| N/A   26C    P0            139W / 1000W |       0MiB / 183359MiB |      0%      Default |\n"
    )
    r = parse_nvidia_smi(text)
    assert (r.driver_version, r.cuda_version, r.layout) == ("610.43.02", "13.3", "table")
    assert r.gpus[0].memory_total_mib == 183359


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "driver-not-loaded",
        ),
        (
            "NVIDIA-SMI has failed because it couldn’t communicate with the NVIDIA driver.",
            "driver-not-loaded",
        ),
        (
            "> NVIDIA-SMI has failed because it couldn't communicate\n> with the NVIDIA driver. Make sure",
            "driver-not-loaded",
        ),
        (
            "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.144",
            "driver-library-mismatch",
        ),
        ("No devices were found  ", "no-devices"),
        ("$ nvidia-smi\nNo devices found\n", "no-devices"),
        (
            "Unable to determine the device handle for GPU0000:3C:00.0: Unknown Error",
            "device-handle-error",
        ),
        (
            "Unable to determine the device handle for GPU 0000:3C:00.0: GPU is lost.  Reboot the "
            "system to recover this GPU",
            "gpu-lost",
        ),
        ("bash: nvidia-smi: command not found", "not-installed"),
        ("| NVIDIA-SMI 550.40.07   Driver Version: 550.40.07   CUDA Version: 12.4 |", None),
    ],
)
def test_error_kinds(text: str, kind: str | None) -> None:
    r = parse_nvidia_smi(text)
    assert r.error_kind == kind
    assert (r.error is None) == (kind is None)


def test_csv_noheader_reads_its_columns_from_the_pasted_command() -> None:
    text = (
        "$ nvidia-smi --query-gpu=name,memory.total,pci.device_id --format=csv,noheader\n"
        "Tesla PG500-216, 32768 MiB, 0x1DF010DE\n"
    )
    (g,) = parse_nvidia_smi(text).gpus
    assert (g.name, g.memory_total_mib, g.pci_device_id, g.device_id) == (
        "Tesla PG500-216",
        32768,
        "0x1DF010DE",
        "1df0",
    )


def test_csv_noheader_without_its_command_is_read_by_cell_shape() -> None:
    (g,) = parse_nvidia_smi("NVIDIA H100 NVL, 0x232110DE\n").gpus
    assert (g.name, g.device_id) == ("NVIDIA H100 NVL", "2321")
    (g,) = parse_nvidia_smi("NVIDIA GeForce RTX 4090, 00000000:01:00.0, 24564 MiB\n").gpus
    assert (g.name, g.pci_bus_id) == ("NVIDIA GeForce RTX 4090", "0000:01:00.0")
    # Nothing that can only be one field: not guessed.
    assert parse_nvidia_smi("8.9, Default\n").gpus == ()


def test_query_excerpt_without_its_gpu_header() -> None:
    text = (
        "    PCI\n"
        "        Bus                               : 0x01\n"
        "        Device Id                         : 0x140110DE\n"
        "        Bus Id                            : 00000000:01:00.0\n"
    )
    (g,) = parse_nvidia_smi(text).gpus
    assert (g.pci_bus, g.device_id, g.pci_bus_id) == ("0x01", "1401", "0000:01:00.0")


def test_r610_query_version_notes_are_kept_apart_from_the_numbers() -> None:
    """R610 `-q` appends "[Deprecated; ...]" to the old version lines: the number is the version,
    the note is kept beside it; the new KMD / CUDA UMD lines win where both are printed."""
    text = (
        "==============NVSMI LOG==============\n\n"
        "Driver Version      : 610.47 [Deprecated; will be removed in CUDA 14.0. Use KMD Version "
        "instead]\n"
        "CUDA Version        : 13.3 [Deprecated; will be removed in CUDA 14.0. Use CUDA UMD "
        "Version instead]\n"
        "KMD Version         : 610.47\n"
        "CUDA UMD Version    : 13.3\n\n"
        "Attached GPUs       : 1\n"
    )
    r = parse_nvidia_smi(text)
    assert (r.driver_version, r.cuda_version) == ("610.47", "13.3")
    assert r.version_notes == (
        "Deprecated; will be removed in CUDA 14.0. Use KMD Version instead",
        "Deprecated; will be removed in CUDA 14.0. Use CUDA UMD Version instead",
    )
    only_old = parse_nvidia_smi(text.replace("KMD Version   ", "Other   ").replace("UMD", "X"))
    assert only_old.driver_version == "610.47"
    assert parse_nvidia_smi("Driver Version : 550.54.15\nProduct Name : X\n").version_notes == ()
