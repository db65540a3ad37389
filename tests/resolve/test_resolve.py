"""The resolver, table-driven: Maxwell to Blackwell, drivers 470-595, Python 3.7-3.15, Ubuntu 22.04
and 24.04, Debian 12 and 13, WSL2, and the failure reports of driver-only resolvers (astral-sh/uv#14742 and friends).

`CASES` is also read by benchmarks/resolve_vs_driver_only.py, which compares it with a
driver-only rule (what uv's `--torch-backend=auto` does)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest

from egpu_setup.compat.matrix import load_snapshot
from egpu_setup.detect.facts import Gpu, HostFacts, NvidiaFacts, OsFacts, PythonFacts
from egpu_setup.errors import EgpuSetupError, MatrixError, UnsupportedHardware, UsageError
from egpu_setup.profile.types import Profile
from egpu_setup.resolve.constraints import Constraints, constraints_from_profile
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.resolve.resolver import resolve
from helpers.cli_runner import invoke

OLD_KEY = "EB693B3035CD5710E231E123A4B469963BF863CC"
TRIXIE_KEY = "02182E60104FCDC26EAE1B8597A5D4CB8793F200"


def gpu(
    device: str, name: str, arch: str, cc: str, *, external: bool = True, addr: str = "0000:3c:00.0"
) -> Gpu:
    return Gpu(
        pci_address=addr,
        vendor="nvidia",
        vendor_id="10de",
        device_id=device,
        name=name,
        architecture=arch,
        compute_capability=cc,
        driver="nvidia",
        external=external,
        connection="thunderbolt" if external else "pcie",
    )


def host(
    distro: str,
    version: str,
    *gpus: Gpu,
    driver: str | None = None,
    flavour: str | None = None,
    python: str = "3.12.3",
    kernel: str = "6.8.0-45-generic",
    wsl: bool = False,
) -> HostFacts:
    return HostFacts(
        os=OsFacts(id=distro, version_id=version, kernel=kernel, arch="x86_64", wsl=wsl),
        python=PythonFacts(version=python, externally_managed=True),
        gpus=gpus,
        nvidia=NvidiaFacts(
            driver_version=driver, module_flavour=flavour, module_loaded=driver is not None
        ),
    )


RTX5090 = gpu("2b85", "GeForce RTX 5090", "Blackwell", "12.0")
RTX4090 = gpu("2684", "GeForce RTX 4090", "Ada Lovelace", "8.9")
GTX1050_INTERNAL = gpu(
    "1c8d", "GeForce GTX 1050 Mobile", "Pascal", "6.1", external=False, addr="0000:01:00.0"
)


@dataclass(frozen=True)
class Case:
    id: str
    c: dict[str, Any]  # Constraints fields (the what-if flags)
    facts: HostFacts | None = None
    # expectations (None: not checked)
    torch: str | None = None  # "2.15.0+cu132"
    action: str | None = None
    branch: int | None = None
    source: str | None = None
    flavour: str | None = None
    packages: tuple[str, ...] | None = None
    error: type[EgpuSetupError] | None = None
    message: str | None = None  # substring of error, or of a reason/warning
    hint: str | None = None
    warning: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


U24: dict[str, Any] = {"distro": "ubuntu-24.04", "python": "3.12"}
U22 = {"distro": "ubuntu-22.04", "python": "3.10"}
D12: dict[str, Any] = {"distro": "debian-12", "python": "3.11"}
D13: dict[str, Any] = {"distro": "debian-13", "python": "3.13"}
WSL: dict[str, Any] = {"platform": "wsl", "distro": "ubuntu-24.04", "python": "3.12"}

CASES: list[Case] = [
    # -- fresh installs: the distro's own branch when it drives the GPU ------------------------
    Case(
        "ada-ubuntu2404-fresh",
        {**U24, "gpu": "10de:2684"},
        torch="2.15.0+cu132",
        action="install",
        branch=580,
        source="distro",
        flavour="open",
        packages=("nvidia-driver-580-open", "linux-modules-nvidia-580-open-generic"),
    ),
    Case(
        "ada-ubuntu2204-py310",
        {**U22, "gpu": "2684"},
        torch="2.14.1+cu130",
        action="install",
        branch=580,
        source="distro",
        flavour="open",
    ),
    Case(
        "ada-debian12-distro-535",
        {**D12, "gpu": "RTX 4090"},
        torch="2.14.1+cu126",
        action="install",
        branch=535,
        source="distro",
        flavour="proprietary",
        packages=(
            "linux-headers-amd64",
            "nvidia-kernel-dkms",
            "nvidia-driver",
            "firmware-nvidia-gsp",
        ),
        message="would need a driver >= 580",
        extra={"apt_components": ("contrib", "non-free", "non-free-firmware")},
    ),
    Case(
        "ada-debian13-distro-550",
        {**D13, "gpu": "2684"},
        torch="2.14.1+cu126",
        action="install",
        branch=550,
        source="distro",
        flavour="proprietary",
    ),
    Case(
        "ampere-ubuntu2204-py39",
        {**U22, "python": "3.9", "gpu": "2503"},
        torch="2.8.0+cu128",
        action="install",
        branch=580,
    ),
    Case(
        "maxwell-gtx980-ubuntu2204",
        {**U22, "gpu": "13c0"},
        torch="2.14.1+cu126",
        branch=580,
        flavour="proprietary",
        packages=("nvidia-driver-580", "linux-modules-nvidia-580-generic"),
    ),
    Case(
        "pascal-debian12-535",
        {**D12, "gpu": "1c81"},
        torch="2.14.1+cu126",
        branch=535,
        flavour="proprietary",
        source="distro",
    ),
    Case(
        "gb10-ubuntu2404", {**U24, "gpu": "2e12"}, torch="2.15.0+cu132", branch=580, flavour="open"
    ),
    # -- Blackwell needs >= 570 and open modules: Debian's branches are too old ------------------
    Case(
        "blackwell-debian12-nvidia-repo",
        {**D12, "gpu": "2b85"},
        torch="2.15.0+cu132",
        action="install",
        branch=580,
        source="nvidia-repo",
        flavour="open",
        packages=("linux-headers-amd64", "nvidia-open-580"),
        message="debian-12's 535 does not drive Blackwell",
        extra={"fingerprint": OLD_KEY},
    ),
    Case(
        "blackwell-debian13-new-key",
        {**D13, "gpu": "2b85"},
        torch="2.15.0+cu132",
        branch=580,
        source="nvidia-repo",
        extra={"fingerprint": TRIXIE_KEY},
    ),
    Case(
        "blackwell-keep-570",
        {**U24, "gpu": "2b85", "driver": "570.133.07"},
        torch="2.11.0+cu128",
        action="keep",
        branch=570,
        message="would need a driver >= 580",
    ),
    Case(
        "blackwell-565-too-old",
        {**U24, "gpu": "2b85", "driver": "565.57.01"},
        torch="2.15.0+cu132",
        action="upgrade",
        branch=580,
        message="older than the first driver for Blackwell",
    ),
    Case(
        "blackwell-proprietary-loaded",
        {},
        facts=host("ubuntu", "24.04", RTX5090, driver="580.95.05", flavour="proprietary"),
        torch="2.15.0+cu132",
        action="install",
        branch=580,
        flavour="open",
        message="needs the open kernel modules",
        warning="will be replaced",
    ),
    Case(
        "blackwell-torch-2.5.1",
        {**U24, "gpu": "2b85", "torch_spec": "2.5.1"},
        error=MatrixError,
        message="GeForce RTX 5090 (compute capability 12.0) has no kernels in any torch 2.5.1 wheel",
        hint='the oldest torch that runs it is 2.7.0 (cu128); drop --torch or use --torch ">=2.7"',
    ),
    Case(
        "blackwell-torch>=2.7-driver-575",
        {**U24, "gpu": "2b85", "driver": "575.64", "torch_spec": ">=2.7"},
        torch="2.11.0+cu128",
        action="keep",
    ),
    Case(
        "blackwell-hwe-kernel",
        {},
        facts=host("ubuntu", "24.04", RTX5090, kernel="6.11.0-29-generic"),
        branch=580,
        packages=("nvidia-driver-580-open", "linux-modules-nvidia-580-open-generic-hwe-24.04"),
    ),
    # -- Pascal/Volta: 580 is their last branch, cu128+/cu130 lack their kernels -----------------
    Case(
        "pascal-1080ti-cu128-uv14742",
        {**U24, "gpu": "1b06", "cuda": "cu128"},
        error=MatrixError,
        message="GeForce GTX 1080 Ti (compute capability 6.1) has no kernels in any cu128 wheel",
        hint="the newest torch that runs it is 2.14.1 (cu126); use --cuda cu126",
    ),
    Case(
        "pascal-1080ti-keep-580",
        {**U24, "gpu": "1b06", "driver": "580.95.05"},
        torch="2.14.1+cu126",
        action="keep",
    ),
    Case(
        "pascal-1080ti-keep-570",
        {**U24, "gpu": "1b06", "driver": "570.86.16"},
        torch="2.14.1+cu126",
        action="keep",
    ),
    Case(
        "pascal-1050-on-595-legacy",
        {**U24, "gpu": "1c81", "driver": "595.71.05"},
        torch="2.14.1+cu126",
        action="install",
        branch=580,
        flavour="proprietary",
        message="support ends with the 580 branch",
        warning="will be replaced by branch 580",
    ),
    Case(
        "pascal-torch-2.15",
        {**U24, "gpu": "1b06", "torch_spec": ">=2.15"},
        error=MatrixError,
        message="has no kernels in any torch >=2.15 wheel",
        hint="the newest torch that runs it is 2.14.1 (cu126)",
    ),
    Case(
        "pascal-branch-595",
        {**U24, "gpu": "1c81", "driver_branch": 595},
        error=MatrixError,
        message="driver branch 595 does not drive GeForce GTX 1050",
        hint="--driver-branch 580",
    ),
    Case(
        "volta-titanv-cu128",
        {**U24, "gpu": "1d81", "driver": "550.163.01", "cuda": "cu128"},
        torch="2.10.0+cu128",
        action="keep",
    ),
    Case(
        "volta-v100-keep-550",
        {**U24, "gpu": "1db4", "driver": "550.163.01"},
        torch="2.14.1+cu126",
        action="keep",
    ),
    # -- drivers that limit CUDA -----------------------------------------------------------------------
    Case(
        "ampere-470-cu118",
        {**U22, "gpu": "2503", "driver": "470.256.02"},
        torch="2.7.1+cu118",
        action="keep",
    ),
    Case(
        "ada-525-floor",
        {**U24, "gpu": "2684", "driver": "525.60.13"},
        torch="2.14.1+cu126",
        action="keep",
    ),
    Case(
        "ada-535-keep",
        {**U24, "gpu": "2684", "driver": "535.261.03"},
        torch="2.14.1+cu126",
        action="keep",
    ),
    Case(
        "ada-590-keep",
        {**U24, "gpu": "2684", "driver": "590.44.01"},
        torch="2.15.0+cu132",
        action="keep",
    ),
    Case(
        "ada-550-with-cu130-upgrades",
        {**U24, "gpu": "2684", "driver": "550.163.01", "cuda": "cu130"},
        torch="2.15.0+cu130",
        action="upgrade",
        branch=580,
        message="runs none of the matching wheels",
    ),
    Case(
        "ada-branch-575-from-nvidia-repo",
        {**U24, "gpu": "2684", "driver_branch": 575},
        torch="2.14.1+cu126",
        branch=575,
        source="nvidia-repo",
        packages=("nvidia-open-575",),
    ),
    Case(
        "ada-debian12-branch-595-pinned",
        {**D12, "gpu": "2684", "driver_branch": 595},
        torch="2.15.0+cu132",
        branch=595,
        source="nvidia-repo",
        packages=("linux-headers-amd64", "nvidia-driver-pinning-595", "nvidia-open"),
        extra={"pin": "nvidia-driver-pinning-595"},
    ),
    Case(
        "ada-debian12-torch-2.15-needs-repo",
        {**D12, "gpu": "2684", "torch_spec": ">=2.15"},
        torch="2.15.0+cu132",
        branch=580,
        source="nvidia-repo",
        message="too old for the requested torch",
    ),
    # -- WSL2: the Windows host owns the driver ------------------------------------------------------
    Case(
        "wsl-ada-572",
        {**WSL, "gpu": "2684", "driver": "572.60"},
        torch="2.14.1+cu126",
        action="host-managed",
        source="host",
        packages=(),
    ),
    Case(
        "wsl-ada-unknown-driver",
        {**WSL, "gpu": "2684"},
        torch="2.15.0+cu132",
        action="host-managed",
        warning="Windows driver version unknown",
    ),
    Case(
        "wsl-550-cu130",
        {**WSL, "gpu": "2684", "driver": "550.54", "cuda": "cu130"},
        error=MatrixError,
        message="the Windows host driver 550.54 is too old for torch 2.15.0+cu130",
        hint=">= 580",
    ),
    Case(
        "wsl-blackwell-550",
        {**WSL, "gpu": "2b85", "driver": "550.54"},
        error=MatrixError,
        message="predates Blackwell support",
    ),
    Case(
        "wsl-facts-first-line",
        {},
        facts=host("ubuntu", "24.04", RTX4090, driver="581.57\n581.57", wsl=True),
        torch="2.15.0+cu132",
        action="host-managed",
    ),
    # -- Python -------------------------------------------------------------------------------------------
    Case("py314-ada", {**U24, "python": "3.14", "gpu": "2684"}, torch="2.15.0+cu132"),
    Case(
        "py315-index-only-2.14",
        {**U24, "python": "3.15", "gpu": "2684", "torch_spec": "2.14"},
        torch="2.14.1+cu130",
    ),
    Case(
        "torch-2.15-on-py310",
        {**U22, "gpu": "2684", "torch_spec": "2.15"},
        error=MatrixError,
        message="torch 2.15.x has no wheel for Python 3.10",
        hint="the newest torch for Python 3.10 is 2.14.1",
    ),
    Case("py27", {**U24, "gpu": "2684", "python": "2.7"}, error=UsageError, message="Python 2.7"),
    Case(
        "py37",
        {**U24, "gpu": "2684", "python": "3.7"},
        error=MatrixError,
        message="no torch wheel exists for Python 3.7",
    ),
    # -- little or nothing known ---------------------------------------------------------------------
    Case(
        "no-gpu-driver-550",
        {**U24, "driver": "550.163.01"},
        torch="2.14.1+cu126",
        action="keep",
        warning="resolved from driver 550.163.01 alone",
    ),
    Case(
        "no-gpu-no-driver-cpu",
        {**U24},
        torch="2.15.0+cpu",
        action="host-managed",
        warning="planning the CPU build",
    ),
    Case("cpu-requested", {**U24, "gpu": "2684", "cuda": "cpu"}, torch="2.15.0+cpu"),
    Case(
        "fedora-unsupported",
        {"distro": "fedora-41", "python": "3.13", "gpu": "2684"},
        torch="2.15.0+cu132",
        action="host-managed",
        branch=580,
        warning="install NVIDIA driver branch 580",
    ),
    # No driver packages for the distribution: a driver that drives the GPU stays, so torch must
    # fit it; --driver-branch cannot be acted on there.
    Case(
        "blackwell-fedora-570-branch-580-not-applicable",
        {
            "distro": "fedora-41",
            "python": "3.11",
            "gpu": "2b85",
            "driver": "570.86.16",
            "driver_branch": 580,
        },
        torch="2.11.0+cu128",
        action="keep",
        branch=570,
        source="host",
        flavour="open",
        message="--driver-branch 580 does not apply: egpu-setup installs no NVIDIA driver on "
        "fedora-41",
        warning="install that branch by hand",
    ),
    Case(
        "blackwell-fedora-570-cu130-impossible",
        {
            "distro": "fedora-41",
            "python": "3.11",
            "gpu": "2b85",
            "driver": "570.86.16",
            "cuda": "cu130",
        },
        error=MatrixError,
        message="driver 570.86.16 cannot run torch 2.15.0+cu130 (needs >= 580), and egpu-setup "
        "installs no NVIDIA driver on fedora-41",
        hint="--torch 2.11.0+cu128",
    ),
    Case(
        "blackwell-fedora-550-must-change-by-hand",
        {"distro": "fedora-41", "python": "3.11", "gpu": "2b85", "driver": "550.54"},
        torch="2.15.0+cu132",
        action="host-managed",
        branch=580,
        message="older than the first driver for Blackwell",
        warning="install NVIDIA driver branch 580",
    ),
    Case(
        "mint-21-uses-jammy-archive",
        {"distro": "linuxmint-21.3", "python": "3.10", "gpu": "2684"},
        torch="2.14.1+cu130",
        branch=580,
        source="distro",
        message="uses the ubuntu-22.04 package archive",
    ),
    # A card older than every wheel gets its last driver and the CPU build, and is told why;
    # only a CUDA variant asked for by name is impossible. The real case: a GTX 760 on Mint
    # 21.3 where only nvidia-driver-470-server drives it (linuxmint/mintdrivers#111).
    Case(
        "kepler-gk110-last-driver-and-cpu",
        {**U24, "gpu": "GK110"},
        torch="2.15.0+cpu",
        branch=470,
        source="distro",
        warning="no torch wheel for Python 3.12 has kernels for GK110 (compute capability 3.5)",
    ),
    Case(
        "kepler-gtx760-mint-21.3-470-server",
        {"distro": "linuxmint-21.3", "python": "3.10", "gpu": "10de:1187"},
        torch="2.14.1+cpu",
        branch=470,
        source="distro",
        packages=("nvidia-driver-470-server", "linux-modules-nvidia-470-server-generic"),
        message="uses the ubuntu-22.04 package archive",
    ),
    Case(
        "kepler-debian-12-tesla-470",
        {**D12, "gpu": "GK110"},
        torch="2.15.0+cpu",
        branch=470,
        packages=("linux-headers-amd64", "nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-driver"),
    ),
    Case(
        "kepler-cuda-asked-for-is-impossible",
        {**U24, "gpu": "GK110", "cuda": "cu118"},
        error=MatrixError,
        message="GK110 (compute capability 3.5) has no kernels in any",
        hint="--cuda cpu",
    ),
    # -- arm64 hosts: only what PyTorch and the archives publish for aarch64 ----------------------
    # 2.7 built cu128 for aarch64 with 9.0;10.0;12.0 only (pytorch/pytorch PR #146378), 2.8 cu129
    # alone with 8.0;9.0;10.0;12.0 (no 2.8.0+cu128 aarch64 wheel: OpenRAL/openral#88), so an Ada
    # card (8.9 runs sm_80 code) needs 2.8; 2.9 brought x86_64's arch lists to aarch64 (PR #162364).
    Case(
        "aarch64-ada-before-2.8-has-no-kernels",
        {**U24, "gpu": "RTX 4090", "machine": "aarch64", "torch_spec": "<2.8"},
        error=MatrixError,
        message="has no kernels in any torch <2.8 wheel",
        hint="the oldest torch that runs it is 2.8.0 (cu129)",
    ),
    Case(
        "aarch64-ada-2.8-runs-the-sm80-code-of-cu129",
        {**U24, "gpu": "RTX 4090", "machine": "aarch64", "torch_spec": "<2.9"},
        torch="2.8.0+cu129",
    ),
    Case(
        "aarch64-blackwell-2.8-cu129",
        {**U24, "gpu": "RTX 5090", "machine": "aarch64", "torch_spec": "2.8"},
        torch="2.8.0+cu129",
        message="aarch64: only the wheels and packages published for aarch64 are planned",
    ),
    Case(
        "aarch64-ampere-2.8-cu129-has-sm80",
        {**U24, "gpu": "10de:20b0", "machine": "aarch64", "torch_spec": "2.8"},
        torch="2.8.0+cu129",
    ),
    Case(
        "aarch64-2.8-has-no-cu128-wheel",
        {**U24, "gpu": "RTX 5090", "machine": "aarch64", "torch_spec": "2.8", "cuda": "cu128"},
        error=MatrixError,
        message="torch 2.8.x has no cu128 wheel",
    ),
    Case(
        "aarch64-debian-12-arm64-headers",
        {**D12, "gpu": "RTX 4090", "machine": "aarch64"},
        branch=535,
        packages=(
            "linux-headers-arm64",
            "nvidia-kernel-dkms",
            "nvidia-driver",
            "firmware-nvidia-gsp",
        ),
    ),
    Case(
        "aarch64-nvidia-repo-sbsa-tree",
        {**D12, "gpu": "RTX 4090", "machine": "aarch64", "torch_spec": "2.15"},
        source="nvidia-repo",
        packages=("linux-headers-arm64", "nvidia-open-580"),
    ),
    # Ubuntu builds nvidia-graphics-drivers-470-server for amd64 only (distros.yaml arm64:)
    Case(
        "aarch64-kepler-ubuntu-has-no-470",
        {**U22, "gpu": "GTX 760", "machine": "aarch64"},
        error=MatrixError,
        message="driver branch 470 is not planned on ubuntu-22.04 arm64: "
        "nvidia-graphics-drivers-470-server is built for amd64 only",
        hint="--distro",
    ),
    Case(
        "aarch64-kepler-debian-12-tesla-470-arm64",
        {**D12, "gpu": "GTX 760", "machine": "aarch64"},
        torch="2.15.0+cpu",
        branch=470,
        packages=("linux-headers-arm64", "nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-driver"),
    ),
    Case(
        "aarch64-ubuntu-64k-kernel-flavour",
        {"gpu": "RTX 4090", "machine": "aarch64"},
        facts=host("ubuntu", "24.04", RTX4090, kernel="6.8.0-45-generic-64k"),
        branch=580,
        packages=("nvidia-driver-580-open", "linux-modules-nvidia-580-open-generic-64k"),
    ),
    Case(
        "aarch64-ubuntu-64k-hwe-kernel",
        {"gpu": "RTX 4090", "machine": "aarch64"},
        facts=host("ubuntu", "22.04", RTX4090, kernel="6.8.0-45-generic-64k"),
        packages=(
            "nvidia-driver-580-open",
            "linux-modules-nvidia-580-open-generic-64k-hwe-22.04",
        ),
    ),
    Case(
        "aarch64-ubuntu-flavour-not-built-for-arm64",
        {"gpu": "RTX 4090", "machine": "aarch64"},
        facts=host("ubuntu", "24.04", RTX4090, kernel="6.8.0-1012-raspi"),
        packages=("nvidia-driver-580-open", "linux-modules-nvidia-580-open-generic"),
        warning="builds no linux-modules-nvidia-* for the 'raspi' kernel flavour on arm64",
    ),
    Case(
        "aarch64-no-rocm-wheels",
        {**U24, "gpu": "RX 7900 XTX", "machine": "aarch64"},
        error=UnsupportedHardware,
        message="ROCm wheels for Linux x86_64 only",
    ),
    # -- mixed machines ------------------------------------------------------------------------------
    Case(
        "mixed-pascal-dgpu-blackwell-egpu",
        {},
        facts=host("ubuntu", "24.04", GTX1050_INTERNAL, RTX5090),
        torch="2.15.0+cu132",
        branch=580,
        flavour="open",
        warning="no single driver branch drives both GeForce GTX 1050 Mobile",
    ),
    Case(
        "mixed-pascal-dgpu-ada-egpu-shares-580",
        {},
        facts=host("ubuntu", "24.04", GTX1050_INTERNAL, RTX4090),
        torch="2.15.0+cu132",
        branch=580,
        flavour="proprietary",
    ),
    # -- bad input -----------------------------------------------------------------------------------
    Case("intel-id", {**U24, "gpu": "8086:56a0"}, error=UsageError, message="is not NVIDIA"),
    Case(
        "unknown-amd-id",
        {**U24, "gpu": "1002:ffff"},
        error=UsageError,
        message="not in egpu-setup's ROCm table",
    ),
    Case(
        "unknown-nvidia-id",
        {**U24, "gpu": "10de:ffff"},
        error=UsageError,
        message="unknown NVIDIA device id",
    ),
    Case("unknown-name", {**U24, "gpu": "Voodoo 5"}, error=UsageError, message="unknown GPU"),
    Case(
        "bad-driver",
        {**U24, "gpu": "2684", "driver": "latest"},
        error=UsageError,
        message="--driver",
    ),
    Case(
        "bad-spec",
        {**U24, "gpu": "2684", "torch_spec": "=>2.7"},
        error=UsageError,
        message="--torch",
    ),
    Case(
        "bad-cuda", {**U24, "gpu": "2684", "cuda": "cuda-new"}, error=UsageError, message="--cuda"
    ),
    Case(
        "unknown-distro",
        {"distro": "plan9-4", "gpu": "2684"},
        error=UsageError,
        message="unknown distribution",
    ),
    Case(
        "unknown-branch",
        {**U24, "gpu": "2684", "driver_branch": 123},
        error=UsageError,
        message="--driver-branch 123",
    ),
]


def run_case(case: Case) -> Resolution:
    return resolve(case.facts, None, Constraints(**case.c))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_resolution(case: Case) -> None:
    if case.error is not None:
        with pytest.raises(case.error) as info:
            run_case(case)
        assert case.message is not None  # an error case names its message
        assert case.message in info.value.message, info.value.message
        if case.hint:
            assert case.hint in (info.value.hint or ""), info.value.hint
        return
    r = run_case(case)
    d = r.driver
    if case.torch:
        assert f"{r.torch.version}+{r.torch.variant}" == case.torch, r.reasons
        assert r.torch.requirements[0] == f"torch=={case.torch}"
        assert r.torch.index_url.endswith("/whl/" + r.torch.variant)
    for key in ("action", "branch", "source", "flavour", "packages"):
        want = getattr(case, key)
        if want is not None:
            assert getattr(d, key) == want, (key, getattr(d, key), r.reasons, r.warnings)
    if case.message:
        assert any(case.message in line for line in r.reasons + r.warnings), r.reasons
    if case.warning:
        assert any(case.warning in w for w in r.warnings), r.warnings
    if "fingerprint" in case.extra:
        assert d.repo is not None and d.repo.fingerprint == case.extra["fingerprint"]
    if "pin" in case.extra:
        assert d.repo is not None and d.repo.pin == case.extra["pin"]
    if "apt_components" in case.extra:
        assert d.apt_components == case.extra["apt_components"]
    # Every choice says why; never a bare answer.
    assert r.reasons
    if d.action in ("install", "upgrade"):
        # a floor comes from a CUDA wheel or the architecture; the CPU build on Kepler has none
        assert d.packages and d.branch and (d.minimum or r.torch.variant == "cpu")
    if d.source == "nvidia-repo":
        assert d.repo is not None and d.repo.keyring_url.startswith(d.repo.url)
        assert len(d.repo.fingerprint) == 40


@pytest.mark.parametrize(
    "c",
    [
        {"platform": "wsl", "python": "3.12"},  # nothing known: the CPU wheel
        {"platform": "wsl", "python": "3.12", "gpu": "2684", "cuda": "cpu"},
    ],
)
def test_wsl_cpu_wheel_names_no_driver_floor(c: dict[str, Any]) -> None:
    r = resolve(None, None, Constraints(**c))
    assert r.torch.variant == "cpu" and r.driver.flavour is None
    assert not any("Windows driver version unknown" in w for w in r.warnings), r.warnings
    assert not any("None" in line for line in r.reasons + r.warnings)


def test_host_managed_plans_name_a_flavour_or_none() -> None:
    """install prints the flavour next to the action: never an empty string."""
    what_ifs: tuple[dict[str, Any], ...] = (
        {"platform": "wsl", "python": "3.12"},
        {"platform": "wsl", "python": "3.12", "gpu": "2684", "driver": "572.60"},
        {"distro": "fedora-41", "python": "3.13", "gpu": "2684"},
        {"distro": "ubuntu-24.04", "python": "3.12"},
    )
    for c in what_ifs:
        d = resolve(None, None, Constraints(**c)).driver
        assert d.action == "host-managed", c
        assert d.flavour in (None, "open", "proprietary"), (c, d.flavour)


def test_cli_unmanaged_driver_conflict_exit_2() -> None:
    done = invoke(
        "resolve",
        "--gpu",
        "2b85",
        "--driver",
        "570.86.16",
        "--distro",
        "fedora-41",
        "--python",
        "3.11",
        "--cuda",
        "cu130",
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: driver 570.86.16 cannot run torch 2.15.0+cu130"), lines
    assert lines[1].startswith("hint: upgrade the NVIDIA driver to >= 580 by hand"), lines
    assert "Traceback" not in done.stderr


def test_case_table_is_broad() -> None:
    ok = [c for c in CASES if c.error is None]
    assert len(CASES) >= 30 and len(ok) >= 30
    drivers = {str(c.c.get("driver", ""))[:3] for c in CASES} | {
        str(c.facts.nvidia.driver_version)[:3] for c in CASES if c.facts
    }
    assert {"470", "525", "535", "550", "570", "575", "580", "590", "595"} <= drivers


def test_json_contract() -> None:
    r = resolve(None, None, Constraints(gpu="2b85", distro="debian-12", python="3.11"))
    data = json.loads(json.dumps(r.to_json()))
    assert data["schema"] == "egpu-setup/resolution/1"
    assert set(data) >= {"schema", "gpu", "driver", "torch", "python", "reasons", "warnings"}
    assert set(data["gpu"]) == {"name", "pci_id", "architecture", "compute_capability"}
    assert set(data["driver"]) >= {
        "installed",
        "action",
        "branch",
        "minimum",
        "flavour",
        "packages",
        "source",
    }
    assert set(data["torch"]) == {"version", "variant", "index_url", "mirror_of", "requirements"}
    assert data["gpu"] == {
        "name": "GeForce RTX 5090",
        "pci_id": "10de:2b85",
        "architecture": "Blackwell",
        "compute_capability": "12.0",
    }
    assert data["driver"]["repo"]["fingerprint"] == OLD_KEY
    assert data["driver"]["minimum"] == "580"
    assert data["python"] == "3.11"


def test_resolution_is_pure_and_repeatable() -> None:
    c = Constraints(gpu="2684", distro="ubuntu-24.04", python="3.12", driver="550.163.01")
    assert resolve(None, None, c) == resolve(None, None, c)


def test_python_from_distro_default() -> None:
    r = resolve(None, None, Constraints(gpu="2684", distro="debian-12"))
    assert r.python == "3.11"
    assert any("default python3 of debian-12" in x for x in r.reasons)


def test_python_and_distro_from_facts() -> None:
    r = resolve(host("debian", "13", RTX4090, python="3.13.5"), None, Constraints())
    assert (r.python, r.distro, r.driver.branch) == ("3.13", "debian-13", 550)


def test_what_if_gpu_overrides_facts_and_keeps_others() -> None:
    facts = host("ubuntu", "24.04", GTX1050_INTERNAL)
    r = resolve(facts, None, Constraints(gpu="2b85"))
    assert r.gpu is not None
    assert r.gpu.name == "GeForce RTX 5090"
    assert any("no single driver branch" in w for w in r.warnings)


def test_several_internal_gpus_picks_newest_with_warning() -> None:
    a = gpu("2684", "GeForce RTX 4090", "Ada Lovelace", "8.9", external=False, addr="0000:02:00.0")
    b = gpu("2503", "GeForce RTX 3060", "Ampere", "8.6", external=False, addr="0000:03:00.0")
    r = resolve(host("ubuntu", "24.04", b, a), None, Constraints())
    assert r.gpu is not None
    assert r.gpu.name == "GeForce RTX 4090"
    assert any("2 NVIDIA GPUs" in w for w in r.warnings)


def test_extras_unpinned_with_reason() -> None:
    r = resolve(
        None,
        None,
        Constraints(gpu="2684", distro="ubuntu-24.04", extras=("torchvision", "torchaudio")),
    )
    assert r.torch.requirements == ("torch==2.15.0+cu132", "torchvision", "torchaudio")


def test_torch_local_label_in_spec() -> None:
    r = resolve(
        None, None, Constraints(gpu="2684", distro="ubuntu-24.04", torch_spec="2.9.1+cu128")
    )
    assert (r.torch.version, r.torch.variant) == ("2.9.1", "cu128")
    with pytest.raises(UsageError):
        resolve(
            None,
            None,
            Constraints(gpu="2684", distro="ubuntu-24.04", torch_spec="2.9.1+cu128", cuda="cu126"),
        )


def test_no_torch_release_matches() -> None:
    with pytest.raises(MatrixError) as info:
        resolve(None, None, Constraints(gpu="2684", distro="ubuntu-24.04", torch_spec="9.0"))
    assert "no torch release matches" in info.value.message
    assert info.value.hint is not None and "matrix update" in info.value.hint


# -- profiles (duck-typed: the resolver never imports egpu_setup.profile.load) --------------------------


@dataclass(frozen=True)
class _Drv:
    min_branch: int | None = None
    preferred_branch: int | None = None
    max_branch: int | None = None
    flavour: str = "auto"
    pin: str | None = None


@dataclass(frozen=True)
class _Torch:
    spec: str | None = None
    cuda: str | None = None
    extras: tuple[str, ...] = ()
    pin: str | None = None


@dataclass(frozen=True)
class _GpuSpec:
    device_ids: tuple[str, ...] = ()
    name: str = "NVIDIA GPU"
    architecture: str = "any"
    compute_capability: str | None = None
    memory_gib: float | None = None
    vendor: str = "nvidia"
    gfx: str | None = None


@dataclass(frozen=True)
class _Profile:
    gpu: _GpuSpec = _GpuSpec()
    driver: _Drv = _Drv()
    torch: _Torch = _Torch()


def _profile(**parts: Any) -> Profile:
    """A _Profile where the resolver takes a Profile: it reads only .gpu, .driver and .torch."""
    return cast(Profile, _Profile(**parts))


def test_constraints_from_profile_cli_wins() -> None:
    p = _profile(
        driver=_Drv(min_branch=570, max_branch=580, flavour="open"),
        torch=_Torch(spec=">=2.7", cuda="cu128", extras=("torchvision",)),
    )
    c = constraints_from_profile(p, cuda="cu130", python="3.12", gpu=None)
    assert c == Constraints(
        torch_spec=">=2.7",
        cuda="cu130",
        min_branch=570,
        max_branch=580,
        flavour="open",
        python="3.12",
        extras=("torchvision",),
    )
    with pytest.raises(TypeError):
        constraints_from_profile(p, nonsense=1)


def test_profile_gpu_used_when_none_detected() -> None:
    p = _profile(gpu=_GpuSpec(("2b85",), "GeForce RTX 5090", "Blackwell", "12.0", 32.0))
    r = resolve(host("ubuntu", "24.04"), p, constraints_from_profile(p))
    assert r.gpu is not None
    assert r.gpu.pci_id == "10de:2b85" and r.driver.flavour == "open"
    assert any("profile's GPU" in x for x in r.reasons)


def test_profile_preferred_branch_and_limits() -> None:
    p = _profile(driver=_Drv(preferred_branch=595))
    r = resolve(None, p, constraints_from_profile(p, gpu="2684", distro="ubuntu-24.04"))
    assert r.driver.branch == 595
    p = _profile(driver=_Drv(max_branch=570))
    r = resolve(None, p, constraints_from_profile(p, gpu="2684", distro="ubuntu-24.04"))
    assert (r.driver.branch, f"{r.torch.version}+{r.torch.variant}") == (570, "2.14.1+cu126")


def test_profile_flavour_conflicts() -> None:
    p = _profile(driver=_Drv(flavour="proprietary"))
    with pytest.raises(MatrixError) as info:
        resolve(None, p, constraints_from_profile(p, gpu="2b85", distro="ubuntu-24.04"))
    assert "proprietary" in info.value.message
    p = _profile(driver=_Drv(min_branch=590))
    with pytest.raises(MatrixError) as info:
        resolve(None, p, constraints_from_profile(p, gpu="1b06", distro="ubuntu-24.04"))
    assert "ends at 580" in info.value.message


def test_generic_profile_names_no_gpu() -> None:
    p = _profile()
    r = resolve(host("ubuntu", "24.04"), p, constraints_from_profile(p))
    assert r.gpu is None and r.torch.variant == "cpu"


def test_shipped_profiles_resolve() -> None:
    """Every shipped profile resolves for its own GPU on Ubuntu 24.04 (real load_profile)."""
    from egpu_setup.profile import load as profiles
    from egpu_setup.profile.search import available

    names = sorted(available())
    assert "rtx5090" in names and "gtx1080ti" in names
    seen: dict[str, tuple[str | None, str]] = {}
    for name in names:
        p = profiles.load_profile(name)
        r = resolve(host("ubuntu", "24.04"), p, constraints_from_profile(p))
        seen[name] = (r.driver.flavour, f"{r.torch.version}+{r.torch.variant}")
    assert seen["rtx5090"][0] == "open"
    assert seen["gtx1080ti"] == ("proprietary", "2.14.1+cu126")


def test_matrix_snapshot_is_the_default() -> None:
    m = load_snapshot()
    r = resolve(None, None, Constraints(gpu="2684", distro="ubuntu-24.04"), matrix=m)
    assert r.torch.index_url == m.index_url_for("cu132")


# -- the command line -------------------------------------------------------------------------------

FIXTURES = __import__("pathlib").Path(__file__).parents[1] / "fixtures" / "hosts"


def test_cli_human_output() -> None:
    done = invoke(
        "resolve",
        "--gpu",
        "2b85",
        "--driver",
        "550.163.01",
        "--distro",
        "ubuntu-24.04",
        "--python",
        "3.12",
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert (
        out.splitlines()[0]
        == "GPU      GeForce RTX 5090 [10de:2b85], Blackwell, compute capability 12.0"
    )
    assert (
        "upgrade branch 580 (open modules) from the ubuntu-24.04 archive, replacing 550.163.01"
        in out
    )
    assert "apt install nvidia-driver-580-open linux-modules-nvidia-580-open-generic" in out
    assert "Torch    2.15.0+cu132 for Python 3.12 (linux)" in out
    assert "\nWhy\n" in out and done.stderr == ""


def test_cli_json() -> None:
    done = invoke(
        "resolve", "--json", "--gpu", "GTX 1080 Ti", "--distro", "debian-12", "--python", "3.11"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["schema"] == "egpu-setup/resolution/1"
    assert data["driver"]["flavour"] == "proprietary" and data["driver"]["branch"] == 535
    assert data["torch"]["requirements"] == ["torch==2.14.1+cu126"]


@pytest.mark.parametrize(
    "args,error,hint",
    [
        (
            ["--gpu", "2b85", "--torch", "2.5.1"],
            "error: GeForce RTX 5090 (compute capability 12.0) has no kernels in any torch 2.5.1 wheel",
            'hint: the oldest torch that runs it is 2.7.0 (cu128); drop --torch or use --torch ">=2.7"',
        ),
        (
            ["--gpu", "10de:ffff"],
            "error: --gpu 10de:ffff: unknown NVIDIA device id",
            "hint: pass the card's name",
        ),
        (
            ["--gpu", "1002:ffff"],
            "error: --gpu 1002:ffff: AMD device ffff is not in egpu-setup's ROCm table",
            "hint: name a card the table knows",
        ),
        (
            ["--gpu", "2684", "--torch", "~=banana"],
            "error: --torch '~=banana' is not a version",
            "hint: use e.g.",
        ),
        (
            ["--gpu", "2684", "--python", "2.7"],
            "error: Python 2.7: no torch 2.x wheel exists",
            "hint: torch 2.x needs",
        ),
        (
            ["--gpu", "2684", "--distro", "beos-5"],
            "error: --distro 'beos-5': unknown distribution",
            "hint: use an os-release",
        ),
        (
            ["--gpu", "2684", "--driver", "five-fifty"],
            "error: --driver: 'five-fifty' is not",
            "hint: use e.g. --driver",
        ),
        (
            ["--gpu", "2684", "--platform", "windows"],
            "error: Invalid value for '--platform'",
            "hint: see",
        ),
    ],
)
def test_cli_bad_input_exit_2(args: list[str], error: str, hint: str) -> None:
    done = invoke("resolve", "--distro", "ubuntu-24.04", "--python", "3.12", *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(error), lines
    assert lines[1].startswith(hint), lines
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_cli_unsupported_distro_still_resolves_torch() -> None:
    done = invoke("resolve", "--json", "--gpu", "2684", "--distro", "arch", "--python", "3.13")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["driver"]["action"] == "host-managed" and data["torch"]["variant"] == "cu132"
    assert any("by hand" in w for w in data["warnings"])


def test_cli_profile() -> None:
    done = invoke(
        "resolve", "--json", "--profile", "rtx5090", "--distro", "debian-12", "--python", "3.11"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["driver"]["source"] == "nvidia-repo" and data["driver"]["flavour"] == "open"


@pytest.mark.parametrize(
    "bundle,expect",
    [
        (
            "tb4-rtx4090-ubuntu2404",
            {"action": "keep", "installed": "560.35.03", "torch": "2.14.1+cu126"},
        ),
        ("laptop-3070ti-plus-egpu-3080", {"gpu": "GeForce RTX 3080", "action": "keep"}),
        ("wsl2", {"action": "host-managed", "source": "host", "platform": "wsl"}),
        ("nouveau-bound", {"action": "install", "archive": "ubuntu-22.04", "branch": 580}),
        ("usb4-rtx5090-fedora", {"action": "keep", "torch": "2.11.0+cu128"}),
        ("intel-igpu-only", {"gpu": None, "torch": "2.15.0+cpu"}),
    ],
)
def test_cli_from_recorded_hosts(bundle: str, expect: dict[str, Any]) -> None:
    done = invoke("resolve", "--json", "--from", str(FIXTURES / bundle))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    got = {
        "action": data["driver"]["action"],
        "installed": data["driver"]["installed"],
        "source": data["driver"]["source"],
        "branch": data["driver"]["branch"],
        "torch": f"{data['torch']['version']}+{data['torch']['variant']}",
        "gpu": data["gpu"]["name"] if data["gpu"] else None,
        "platform": data["platform"],
        "archive": data["archive"],
    }
    assert {k: got[k] for k in expect} == expect, data["reasons"] + data["warnings"]


def test_cli_help_has_examples() -> None:
    assert "Examples:" in invoke("resolve", "--help").stdout


@pytest.mark.parametrize(
    ("typed", "pci_id"),
    [
        ("4090", "10de:2684"),
        ("rtx 4090", "10de:2684"),
        ("RTX4090", "10de:2684"),
        ("3060 ti", "10de:2414"),
        ("a4000", "10de:24b0"),
    ],
)
def test_gpu_accepts_the_short_names_a_person_types(typed: str, pci_id: str) -> None:
    res = invoke("resolve", "--gpu", typed, *WHAT_IF, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["gpu"]["pci_id"] == pci_id


def test_a_short_gpu_name_that_could_mean_several_cards_says_which() -> None:
    res = invoke("resolve", "--gpu", "1060", *WHAT_IF)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith(
        "error: --gpu '1060' could mean GeForce GTX 1060 3GB, GeForce GTX 1060 5GB, "
        "GeForce GTX 1060 6GB\nhint: pass one of them"
    )
    # a bare letter names nothing
    assert invoke("resolve", "--gpu", "x", *WHAT_IF).stderr.startswith(
        "error: --gpu 'x': unknown GPU"
    )


WHAT_IF = ("--driver", "580.95.05", "--distro", "ubuntu-24.04", "--python", "3.12")


def test_aarch64_repo_is_the_sbsa_tree_and_the_json_names_the_machine() -> None:
    r = resolve(
        None, None, Constraints(**D12, gpu="RTX 4090", machine="aarch64", torch_spec="2.15")
    )
    assert r.driver.repo is not None
    assert r.driver.repo.url.endswith("/debian12/sbsa/")
    assert r.to_json()["machine"] == "aarch64"
    x86 = resolve(None, None, Constraints(**D12, gpu="RTX 4090", torch_spec="2.15"))
    assert x86.driver.repo is not None and x86.driver.repo.url.endswith("/debian12/x86_64/")
    assert x86.to_json()["machine"] == "x86_64"


def test_a_machine_pytorch_publishes_no_wheels_for_is_refused() -> None:
    facts = host("ubuntu", "24.04", RTX4090)
    ppc = replace(facts, os=replace(facts.os, arch="ppc64le"))
    with pytest.raises(UnsupportedHardware) as info:
        resolve(ppc, None, Constraints())
    assert "ppc64le" in info.value.message and "--arch" in (info.value.hint or "")
    arm = replace(facts, os=replace(facts.os, arch="arm64"))  # os-release / dpkg spelling
    assert resolve(arm, None, Constraints()).machine == "aarch64"
