"""Checks of the torch installed in the target venv, from the small JSON the verify step writes:
{"torch_version": "2.9.1+cu128", "cuda": "12.8" | null, "arch_list": ["sm_75", ...],
 "cuda_available": bool}.

Arch and driver rules reuse egpu_setup.compat.versions (the resolver's value types).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from egpu_setup.compat.versions import ArchList, ComputeCapability, DriverVersion
from egpu_setup.errors import UsageError

_ARCH_RE = re.compile(r"^(?P<kind>sm|compute)_(?P<num>\d{2,3})[a-z]?$")


@dataclass(frozen=True)
class TorchInfo:
    torch_version: str
    cuda: str | None
    arch_list: tuple[str, ...]
    cuda_available: bool | None


def parse_torch_info(data: Any, where: str) -> TorchInfo:
    """Validate the JSON document; UsageError naming the file and key on anything else."""
    hint = (
        'expected {"torch_version": "2.9.1+cu128", "cuda": "12.8", "arch_list": ["sm_86"], '
        '"cuda_available": true}'
    )
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object", hint)
    version = data.get("torch_version")
    if not isinstance(version, str) or not version:
        raise UsageError(f"{where}: torch_version must be a string", hint)
    cuda = data.get("cuda")
    if cuda is not None and (not isinstance(cuda, str) or not re.match(r"^\d+\.\d+", cuda)):
        raise UsageError(f'{where}: cuda must be a version like "12.8" or null', hint)
    arch = data.get("arch_list", [])
    if not isinstance(arch, list) or not all(isinstance(a, str) for a in arch):
        raise UsageError(f'{where}: arch_list must be a list of strings like "sm_86"', hint)
    available = data.get("cuda_available")
    if available is not None and not isinstance(available, bool):
        raise UsageError(f"{where}: cuda_available must be true or false", hint)
    return TorchInfo(version, cuda, tuple(arch), available)


def is_cpu_only(info: TorchInfo) -> bool:
    return info.cuda is None or info.torch_version.endswith("+cpu")


def arch_list(info: TorchInfo) -> ArchList | None:
    """torch.cuda.get_arch_list() entries as an ArchList: sm_XY = cubin, compute_XY = PTX."""
    cubins, ptx = [], []
    for entry in info.arch_list:
        m = _ARCH_RE.match(entry.strip())
        if not m:
            continue
        num = int(m["num"])
        cc = ComputeCapability(num // 10, num % 10)
        (cubins if m["kind"] == "sm" else ptx).append(cc)
    if not cubins and not ptx:
        return None
    return ArchList(tuple(cubins), tuple(ptx))


def runs_on(info: TorchInfo, compute_capability: str) -> str | None:
    """'sass' / 'ptx' when the build has kernels for this capability, None when it has none.
    Raises ValueError for an unparsable capability; returns 'unknown' for an empty arch list."""
    cc = ComputeCapability.from_str(compute_capability)
    arches = arch_list(info)
    if arches is None:
        return "unknown"
    return arches.runs(cc)


def driver_floor(info: TorchInfo) -> DriverVersion | None:
    """The oldest Linux driver that runs the wheel's CUDA, from the matrix (data/cuda.yaml).

    Wheels rely on minor-version compatibility, so the floor is per CUDA major: a CUDA the
    matrix does not list yet takes the floor of the nearest listed one of the same major."""
    if info.cuda is None:
        return None
    from egpu_setup.compat.matrix import load_snapshot, version_key

    wanted = version_key(info.cuda)
    same_major = [v for v in load_snapshot().cuda if version_key(v.cuda)[0] == wanted[0]]
    if not same_major:
        return None
    nearest = min(same_major, key=lambda v: abs(version_key(v.cuda)[1] - wanted[1]))
    return nearest.min_driver


def driver_too_old(info: TorchInfo, driver_version: str | None) -> DriverVersion | None:
    """The floor the installed driver misses, or None when it is new enough (or unknown)."""
    floor = driver_floor(info)
    if floor is None or not driver_version:
        return None
    try:
        installed = DriverVersion.from_str(driver_version)
    except ValueError:
        return None
    return floor if installed < floor else None
