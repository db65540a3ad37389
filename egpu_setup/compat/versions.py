"""Value types for the identifiers the matrix compares: driver versions, CUDA variants, Python
versions, compute capabilities and compiled arch lists. All pure; `from_str` raises ValueError
with a message fit for `error:` (the callers turn it into a UsageError or MatrixError)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DRIVER_RE = re.compile(r"^\s*(\d{3})(?:\.(\d{1,3}))?(?:\.(\d{1,3}))?\s*$")
_VARIANT_RE = re.compile(r"^(?:cpu|cu(\d{2})(\d))$")
_PYTHON_RE = re.compile(r"^\s*(?:python|py|cp)?\s*(\d)\.?(\d{1,2})(?:\.\d+)?\s*$", re.IGNORECASE)
_CC_RE = re.compile(r"^(\d{1,2})\.(\d)$")


@dataclass(frozen=True, order=True)
class DriverVersion:
    """An NVIDIA Linux driver version: 580.95.05, 570.124.06, 570.26, or a bare branch (580).

    A bare branch compares as its first release (580 == 580.0.0), which is how uv encodes the
    CUDA 13 floor (`Version::new([580])` in astral-sh/uv `crates/uv-torch/src/backend.rs`)."""

    major: int
    minor: int = 0
    patch: int = 0

    @classmethod
    def from_str(cls, text: str) -> DriverVersion:
        m = _DRIVER_RE.match(str(text))
        if not m:
            raise ValueError(
                f"{text!r} is not an NVIDIA driver version (expected e.g. 580.95.05, 570.26 or 580)"
            )
        return cls(int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))

    @property
    def branch(self) -> int:
        return self.major

    def __str__(self) -> str:
        if self.minor == 0 and self.patch == 0:
            return str(self.major)
        return f"{self.major}.{self.minor:02d}" + (f".{self.patch:02d}" if self.patch else "")


def latest_of_branch(branch: int) -> DriverVersion:
    """A stand-in for 'the current release of branch N' when a plan installs a branch."""
    return DriverVersion(branch, 999, 999)


@dataclass(frozen=True, order=True)
class PythonVersion:
    """A CPython minor version, the unit torch wheels are tagged by (cp312)."""

    major: int
    minor: int

    @classmethod
    def from_str(cls, text: str) -> PythonVersion:
        m = _PYTHON_RE.match(str(text))
        if not m:
            raise ValueError(f"{text!r} is not a Python version (expected X.Y, e.g. 3.12)")
        return cls(int(m.group(1)), int(m.group(2)))

    @property
    def tag(self) -> str:
        return f"cp{self.major}{self.minor}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def parse_variant(text: str) -> str:
    """Normalise a wheel variant: 'cu128', 'CU128', '12.8', 'cuda12.8' -> 'cu128'; 'cpu'."""
    raw = str(text).strip().lower()
    if raw.startswith("cuda"):
        raw = raw[4:].lstrip("-_ ")
    m = re.match(r"^(\d{2})\.(\d)$", raw)
    if m:
        raw = f"cu{m.group(1)}{m.group(2)}"
    if not _VARIANT_RE.match(raw):
        raise ValueError(f"{text!r} is not a wheel variant (expected cpu or cuXYZ, e.g. cu128)")
    return raw


def variant_cuda(variant: str) -> tuple[int, int] | None:
    """cu128 -> (12, 8); cpu -> None."""
    m = _VARIANT_RE.match(variant)
    if not m or variant == "cpu":
        return None
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True, order=True)
class ComputeCapability:
    major: int
    minor: int

    @classmethod
    def from_str(cls, text: str) -> ComputeCapability:
        m = _CC_RE.match(str(text).strip())
        if not m:
            raise ValueError(f"{text!r} is not a compute capability (expected X.Y, e.g. 8.9)")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class ArchList:
    """A wheel's TORCH_CUDA_ARCH_LIST: a cubin per entry, PTX too for entries marked +PTX."""

    cubins: tuple[ComputeCapability, ...]
    ptx: tuple[ComputeCapability, ...]

    @classmethod
    def from_str(cls, text: str) -> ArchList:
        cubins: list[ComputeCapability] = []
        ptx: list[ComputeCapability] = []
        for part in str(text).replace(" ", ";").split(";"):
            if not part:
                continue
            base, plus, suffix = part.partition("+")
            if plus and suffix != "PTX":
                raise ValueError(f"arch list entry {part!r}: only '+PTX' may follow a capability")
            cc = ComputeCapability.from_str(base)
            cubins.append(cc)
            if plus:
                ptx.append(cc)
        if not cubins:
            raise ValueError(f"{text!r} is an empty arch list")
        return cls(tuple(cubins), tuple(ptx))

    def runs(self, cc: ComputeCapability) -> str | None:
        """How a GPU of capability `cc` runs this build: 'sass' (a binary-compatible cubin), 'ptx'
        (JIT from PTX, slower first start) or None (no kernels: 'no kernel image is available').

        A cubin for X.Y runs on X.Z with Z >= Y, same major (pytorch/pytorch PR #45130, #182250);
        PTX for X.Y JIT-compiles for any capability >= X.Y (CUDA programming guide)."""
        if any(c.major == cc.major and c.minor <= cc.minor for c in self.cubins):
            return "sass"
        if any(p <= cc for p in self.ptx):
            return "ptx"
        return None

    def __str__(self) -> str:
        return ";".join(f"{c}+PTX" if c in self.ptx else str(c) for c in self.cubins)


def parse_torch_version(text: str) -> tuple[str, str | None]:
    """'2.9.1+cu128' -> ('2.9.1', 'cu128'); '2.9.1' -> ('2.9.1', None)."""
    version, _, local = str(text).strip().partition("+")
    if not re.match(r"^\d+\.\d+(\.\d+)?$", version):
        raise ValueError(f"{text!r} is not a torch version (expected e.g. 2.9.1)")
    return version, (parse_variant(local) if local else None)
