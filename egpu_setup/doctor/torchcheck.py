"""Checks of the torch installed in the target venv.

The facts come in one of two JSON documents:
- the small form that `record --venv` stores as commands/torch.json and `probe_venv_torch` prints:
  {"torch_version": "2.9.1+cu128", "cuda": "12.8" | null, "arch_list": ["sm_75", ...],
   "cuda_available": bool};
- a report of `egpu-setup verify` (schema egpu-setup/verify/1, <state>/reports/verify-*.json),
  whose `device` and checks carry the same facts (egpu_setup/verify/_child.py).

Arch and driver rules reuse egpu_setup.compat.versions (the resolver's value types).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from egpu_setup.compat.versions import ArchList, ComputeCapability, DriverVersion
from egpu_setup.errors import UsageError

if TYPE_CHECKING:
    from egpu_setup.host.machine import Host

_ARCH_RE = re.compile(r"^(?P<kind>sm|compute)_(?P<num>\d{2,3})[a-z]?$")
SCHEMA_VERIFY = "egpu-setup/verify/1"  # egpu_setup/verify/report.py (not imported: it pulls more)
_HINT = (
    "pass a report of `egpu-setup verify` (<state>/reports/verify-*.json) or "
    '{"torch_version": "2.9.1+cu128", "cuda": "12.8", "arch_list": ["sm_86"], '
    '"cuda_available": true}'
)


@dataclass(frozen=True)
class TorchInfo:
    torch_version: str
    cuda: str | None
    arch_list: tuple[str, ...]
    cuda_available: bool | None

    def to_json(self) -> dict[str, Any]:
        """The small form, as parse_torch_info reads it back."""
        return {
            "torch_version": self.torch_version,
            "cuda": self.cuda,
            "arch_list": list(self.arch_list),
            "cuda_available": self.cuda_available,
        }


def parse_torch_info(data: Any, where: str) -> TorchInfo:
    """Validate the JSON document (small form or verify report); UsageError naming the file and
    key on anything else."""
    hint = _HINT
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object", hint)
    schema = data.get("schema")
    if schema == SCHEMA_VERIFY:
        data = _from_verify_report(data, where)
    elif isinstance(schema, str):
        raise UsageError(f"{where}: schema {schema} is not a verify report", hint)
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


def _from_verify_report(report: dict[str, Any], where: str) -> dict[str, Any]:
    """The small form from a verify report: `device` is written once torch chose a device; when
    the run stopped earlier (CPU build, CUDA unavailable) the checks still say what was seen."""
    device = report.get("device")
    device = device if isinstance(device, dict) else {}
    checks: dict[str, dict[str, Any]] = {}
    for check in report.get("checks") or ():
        if isinstance(check, dict) and isinstance(check.get("id"), str):
            checks.setdefault(check["id"], check)

    def passed(check_id: str) -> dict[str, Any] | None:
        check = checks.get(check_id)
        return check if check is not None and check.get("status") == "pass" else None

    version = device.get("torch") or (passed("torch-import") or {}).get("value")
    if not version:
        why = (
            "torch did not import in the verified venv"
            if checks.get("torch-import", {}).get("status") == "fail"
            else "it names no torch version"
        )
        raise UsageError(
            f"{where}: this verify report has no torch facts ({why})",
            "install torch there and rerun `egpu-setup verify`, "
            "or use `egpu-setup doctor --venv PATH`",
        )
    if "torch_cuda" in device:
        cuda = device["torch_cuda"]  # torch.version.cuda; None is a CPU-only build
    elif passed("torch-cuda-build"):
        cuda = checks["torch-cuda-build"].get("value")
    elif checks.get("torch-cuda-build", {}).get("status") == "fail":
        cuda = None  # the child's verdict: "torch X is a CPU-only build"
    else:
        cuda = _cuda_from_label(str(version), where)
    arch = checks.get("arch-list", {}).get("value")  # torch.cuda.get_arch_list()
    available: bool | None = None
    if "cuda-available" in checks and checks["cuda-available"].get("status") in ("pass", "fail"):
        available = checks["cuda-available"]["status"] == "pass"
    elif device.get("type") == "cuda":
        available = True
    return {
        "torch_version": version,
        "cuda": cuda,
        "arch_list": arch if isinstance(arch, list) else [],
        "cuda_available": available,
    }


def _cuda_from_label(version: str, where: str) -> str | None:
    """'2.9.1+cu128' -> '12.8', '2.9.1+cpu' -> None (PyTorch's local version labels)."""
    label = version.partition("+")[2]
    if label == "cpu":
        return None
    m = re.fullmatch(r"cu(\d+)(\d)", label)
    if m:
        return f"{int(m[1])}.{m[2]}"
    raise UsageError(
        f"{where}: the verify report does not say which CUDA torch {version} was built for",
        "rerun `egpu-setup verify` with this version of egpu-setup, or use `doctor --venv PATH`",
    )


# Run in the target venv's Python (isolated: -I) to learn what its torch was built for. The
# compiled arch flags come from the build itself, so this works without a working GPU, where
# torch.cuda.get_arch_list() would return [].
_TORCH_PROBE = """
import json, torch
flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)() or ""
try:
    available = bool(torch.cuda.is_available())
except Exception:
    available = False
print(json.dumps({"torch_version": torch.__version__, "cuda": torch.version.cuda,
                  "arch_list": flags.split(), "cuda_available": available}))
"""


def probe_venv_torch(host: Host, venv: Path) -> TorchInfo:
    """The torch facts of a venv, by running its own Python through the Host gateway
    (doctor --venv and record --venv)."""
    from egpu_setup.errors import ExecutionError
    from egpu_setup.host.trust import run_as

    python = Path(os.path.abspath(venv)) / "bin" / "python"
    if not host.exists(str(python)):
        raise UsageError(f"{python} does not exist", "pass the venv that holds torch (--venv PATH)")
    # Root never runs a Python another user can change: as its owner, or not at all.
    owner = run_as(str(python)) if host.kind == "live" else None
    try:
        res = host.run([str(python), "-I", "-c", _TORCH_PROBE], timeout=120, run_as=owner, cwd="/")
    except ExecutionError as exc:
        raise UsageError(
            f"{python}: {exc.message}", "run `egpu-setup verify` to see where it hangs"
        ) from None
    if not res.ok:
        tail = (res.err.strip().splitlines() or ["no output"])[-1]
        raise UsageError(
            f"cannot import torch in {venv}: {tail}",
            "install torch there: egpu-setup install --only torch --venv " + str(venv),
        )
    try:
        data = json.loads(res.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UsageError(f"{python} printed no torch facts", "run `egpu-setup verify`") from None
    return parse_torch_info(data, f"torch in {venv}")


def is_cpu_only(info: TorchInfo) -> bool:
    return info.cuda is None or info.torch_version.endswith("+cpu")


def arch_list(info: TorchInfo) -> ArchList | None:
    """torch.cuda.get_arch_list() entries as an ArchList: sm_XY = cubin, compute_XY = PTX."""
    cubins: list[ComputeCapability] = []
    ptx: list[ComputeCapability] = []
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
