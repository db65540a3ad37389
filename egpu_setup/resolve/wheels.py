"""Which torch wheels qualify, best first, and the driver each one needs.

A wheel qualifies when it exists for the Python, matches `--torch`/`--cuda` and has kernels for
the GPU (binary compatible within a major version; PTX JIT as the documented fallback). Order:
newest release, SASS before PTX, stable before experimental, newest CUDA first.
"""

from __future__ import annotations

from dataclasses import dataclass

from egpu_setup.compat.matrix import (
    Architecture,
    Matrix,
    TorchVariant,
    TorchVersion,
)
from egpu_setup.compat.versions import (
    DriverVersion,
    PythonVersion,
    variant_cuda,
)
from egpu_setup.errors import MatrixError, UsageError
from egpu_setup.resolve.constraints import Constraints, spec_filter
from egpu_setup.resolve.resolution import Notes, TorchPlan
from egpu_setup.resolve.target import Target

FALLBACK_PYTHON = "3.12"


@dataclass(frozen=True)
class Candidate:
    release: TorchVersion
    variant: TorchVariant
    how: str  # "sass" / "ptx" / "cpu" / "unknown-gpu"

    @property
    def label(self) -> str:
        return f"{self.release.version}+{self.variant.name}"


def candidate_order(c: Candidate) -> tuple[tuple[int, ...], bool, bool, tuple[int, int]]:
    cuda = variant_cuda(c.variant.name) or (0, 0)
    return (c.release.key, c.how != "ptx", c.variant.stable, cuda)


def candidates(
    matrix: Matrix,
    python: str,
    target: Target | None,
    want_gpu: bool,
    spec: str | None,
    cuda: str | None,
) -> list[Candidate]:
    """Every wheel that satisfies the static facts, best first; MatrixError naming the nearest."""
    matches_spec, spec_variant, spec_text = spec_filter(spec)
    if spec_variant and cuda and spec_variant != cuda:
        raise UsageError(
            f"--torch {spec} asks for {spec_variant} but --cuda asks for {cuda}",
            "drop one of them",
        )
    cuda = cuda or spec_variant
    kind_cpu = cuda == "cpu" or (cuda is None and not want_gpu)
    pairs = [(t, v) for t in matrix.torch for v in t.variants if (v.name == "cpu") == kind_cpu]
    pairs_py = [(t, v) for t, v in pairs if python in t.pythons(v)]
    if not pairs_py:
        every = sorted({p for t, v in pairs for p in t.pythons(v)}, key=PythonVersion.from_str)
        raise MatrixError(
            f"no torch wheel exists for Python {python}",
            f"torch 2.x has wheels for Python {every[0]} to {every[-1]}; "
            f"use e.g. --python {FALLBACK_PYTHON}",
        )
    pairs_spec = [(t, v) for t, v in pairs_py if matches_spec(t.version)]
    if not pairs_spec:
        any_py = [(t, v) for t, v in pairs if matches_spec(t.version)]
        newest = max((t for t, _ in pairs_py), key=lambda t: t.key)
        if any_py:
            t0 = max((t for t, _ in any_py), key=lambda t: t.key)
            pys = t0.pythons(any_py[0][1])
            too_new = PythonVersion.from_str(python) > PythonVersion.from_str(pys[-1])
            nearest_py = pys[-1] if too_new else pys[0]
            raise MatrixError(
                f"torch {spec_text} has no wheel for Python {python} "
                f"(torch {t0.version} supports Python {pys[0]} to {pys[-1]})",
                f"the newest torch for Python {python} is {newest.version}: drop --torch, "
                f"or use --python {nearest_py}",
            )
        raise MatrixError(
            f"no torch release matches --torch {spec}",
            f"known releases are {matrix.torch[-1].version} to {matrix.torch[0].version}; "
            "run `egpu-setup matrix update` if yours is newer",
        )
    if cuda and not kind_cpu:
        with_cuda = [(t, v) for t, v in pairs_spec if v.name == cuda]
        if not with_cuda:
            having = [t.version for t, v in pairs_py if v.name == cuda]
            hint = (
                f"{cuda} wheels exist for torch {having[-1]} to {having[0]}"
                if having
                else f"no torch release in the matrix has {cuda} wheels for Python {python}"
            )
            raise MatrixError(
                f"torch {spec_text} has no {cuda} wheel for Python {python}",
                hint + "; change --torch or --cuda",
            )
        pairs_spec = with_cuda
    if kind_cpu:
        return sorted(
            (Candidate(t, v, "cpu") for t, v in pairs_spec), key=candidate_order, reverse=True
        )
    if target is None or target.cc is None:
        return sorted(
            (Candidate(t, v, "unknown-gpu") for t, v in pairs_spec),
            key=candidate_order,
            reverse=True,
        )
    runs = [(t, v, v.arch.runs(target.cc)) for t, v in pairs_spec if v.arch is not None]
    found = [Candidate(t, v, how) for t, v, how in runs if how]
    if found:
        return sorted(found, key=candidate_order, reverse=True)
    raise no_kernels(matrix, python, target, spec, spec_text, cuda, pairs_py, pairs_spec)


def runs_in_no_wheel(matrix: Matrix, python: str, target: Target) -> bool:
    """True when no CUDA wheel of any torch release for `python` has kernels for the GPU (a
    Kepler card, compute capability 3.x): only the CPU build can run torch there."""
    cc = target.cc
    if cc is None:
        return False
    return not any(
        v.arch is not None and v.arch.runs(cc) and python in t.pythons(v)
        for t in matrix.torch
        for v in t.variants
        if v.name != "cpu"
    )


def no_kernels(
    matrix: Matrix,
    python: str,
    target: Target,
    spec: str | None,
    spec_text: str,
    cuda: str | None,
    pairs_py: list[tuple[TorchVersion, TorchVariant]],
    pairs_spec: list[tuple[TorchVersion, TorchVariant]],
) -> MatrixError:
    cc = target.cc
    assert cc is not None  # no_kernels is asked only for a GPU whose capability is known
    gpu = f"{target.gpu.name} (compute capability {cc})"
    working = [(t, v) for t, v in pairs_py if v.arch is not None and v.arch.runs(cc)]
    what = " ".join(p for p in ("torch " + spec_text if spec else "", cuda, "wheel") if p)
    if not working:
        return MatrixError(
            f"{gpu} has no kernels in any torch wheel for Python {python}",
            "use the CPU build (--cuda cpu); PyTorch 2.x wheels start at sm_37/sm_50",
        )
    same_cuda = [(t, v) for t, v in working if cuda is None or v.name == cuda]
    pool = same_cuda or working
    asked = [t.key for t, _ in pairs_spec]

    def best_of(key: tuple[int, ...]) -> tuple[TorchVersion, TorchVariant]:
        rows = [(t, v) for t, v in pool if t.key == key]
        return max(rows, key=lambda p: (p[1].stable, variant_cuda(p[1].name) or (0, 0)))

    if min(t.key for t, _ in pool) > max(asked):  # everything that works is newer
        t, v = best_of(min(t.key for t, _ in pool))
        nearest, bound = (
            f"the oldest torch that runs it is {t.version} ({v.name})",
            f'">={t.series}"',
        )
    else:
        t, v = best_of(max(t.key for t, _ in pool))
        nearest, bound = (
            f"the newest torch that runs it is {t.version} ({v.name})",
            f'"=={t.version}"',
        )
    if cuda and not same_cuda:
        return MatrixError(
            f"{gpu} has no kernels in any {what}",
            f"{nearest}; use --cuda {v.name}" + (f" --torch {bound}" if spec else ""),
        )
    flag = "drop --torch or use --torch " + bound if spec else "drop --cuda"
    return MatrixError(f"{gpu} has no kernels in any {what}", f"{nearest}; {flag}")


def allows(c: Candidate, driver: DriverVersion, matrix: Matrix, windows: bool = False) -> bool:
    if c.variant.name == "cpu":
        return True
    floor = matrix.cuda_variant(c.variant.name)
    if floor is None:
        return False
    return driver >= (floor.min_driver_windows if windows else floor.min_driver)


def driver_floor(
    c: Candidate, arch: Architecture | None, matrix: Matrix, windows: bool = False
) -> DriverVersion | None:
    floors = []
    cv = matrix.cuda_variant(c.variant.name)
    if cv is not None:
        floors.append(cv.min_driver_windows if windows else cv.min_driver)
    if arch is not None and arch.first_driver is not None:
        floors.append(arch.first_driver)
    return max(floors) if floors else None


def torch_plan(m: Matrix, chosen: Candidate, c: Constraints, n: Notes) -> TorchPlan:
    release, variant = chosen.release, chosen.variant
    label = f"{release.version}+{variant.name}"
    why = f"torch {label}: the newest release"
    if c.torch_pin:
        why = f"torch {label}: the pinned release"
    elif c.torch_spec:
        why += f" matching --torch {c.torch_spec}"
    if chosen.how == "sass":
        why += f" with kernels for the GPU (arch list {variant.arch})"
    elif chosen.how == "ptx":
        why += f" whose PTX ({variant.arch}) JIT-compiles for the GPU"
    n.reasons.append(f"{why}; {variant.status} variant")
    requirements = (f"torch=={label}",) + tuple(
        e for e in c.extras if e in ("torchvision", "torchaudio")
    )
    if len(requirements) > 1:
        n.reasons.append(
            "torchvision/torchaudio are left unpinned: each of their wheels requires one exact "
            "torch, so pip picks the build that matches from the same index"
        )
    return TorchPlan(release.version, variant.name, m.index_url_for(variant.name), requirements)
