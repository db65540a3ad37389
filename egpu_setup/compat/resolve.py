"""The resolver: (host facts or what-if inputs, profile, constraints, matrix) -> Resolution.

Pure: no I/O beyond reading our own package data. It keys on the GPU's compute capability AND the
driver AND the distro AND the target Python (uv's `--torch-backend=auto` and light-the-torch look
only at the driver version, matrix-facts §5). Policy, in order:

1. Target: the eGPU (or the one NVIDIA GPU, or `--gpu`, or the profile's GPU).
2. Torch candidates: every (release, variant) with a wheel for the Python, matching `--torch` and
   `--cuda`, whose arch list has cubins for the GPU (binary compatible within a major version; PTX
   JIT as the documented fallback). Order: newest release, SASS before PTX, stable before
   experimental, newest CUDA first.
3. Driver: keep the installed one when it drives the GPU and runs some candidate; otherwise the
   least risky branch that does: the distro's own package, else NVIDIA's CUDA repo; never a
   branch that dropped the GPU. WSL2: the Windows host owns the driver (pip side only). Where we
   know no driver packages (Fedora, Arch), a driver that drives the GPU stays whatever branch
   was asked for, so torch must fit it or the request is refused.
4. Torch: the first candidate the chosen driver runs.
An impossible request raises MatrixError naming the conflicting facts and the nearest thing that
works.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from egpu_setup.compat.matrix import (
    Architecture,
    Distro,
    Matrix,
    TorchVariant,
    TorchVersion,
    load_matrix,
)
from egpu_setup.compat.versions import (
    ComputeCapability,
    DriverVersion,
    PythonVersion,
    latest_of_branch,
    parse_torch_version,
    parse_variant,
    variant_cuda,
)
from egpu_setup.errors import MatrixError, UsageError

SCHEMA_RESOLUTION = "egpu-setup/resolution/1"
NVIDIA_VENDOR = "10de"
FALLBACK_PYTHON = "3.12"


# -- the result (pinned interface: docs in /tmp/brief.md "Resolution") -----------------------------


@dataclass(frozen=True)
class ResolvedGpu:
    name: str
    pci_id: str | None  # "10de:2684"
    architecture: str | None
    compute_capability: str | None


@dataclass(frozen=True)
class NvidiaRepo:
    """NVIDIA's CUDA apt repository, added with Signed-By and a pinned key fingerprint."""

    url: str  # the `deb [signed-by=…] URL /` line's URL
    keyring_url: str  # the armored public key to download
    fingerprint: str  # the key must have exactly this fingerprint before it is trusted
    pin: str | None  # the branch-pinning package (branches >= 590), None when the name carries it


@dataclass(frozen=True)
class DriverPlan:
    installed: str | None
    action: Literal["keep", "install", "upgrade", "host-managed"]
    branch: int | None
    minimum: str | None
    flavour: Literal["open", "proprietary"] | None
    packages: tuple[str, ...]
    source: Literal["distro", "nvidia-repo", "host"]
    apt_components: tuple[str, ...] = ()
    repo: NvidiaRepo | None = None


@dataclass(frozen=True)
class TorchPlan:
    version: str
    variant: str
    index_url: str
    requirements: tuple[str, ...]


@dataclass(frozen=True)
class Resolution:
    gpu: ResolvedGpu | None
    driver: DriverPlan
    torch: TorchPlan
    python: str
    platform: Literal["linux", "wsl"]
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    distro: str | None = None  # the host's distribution, "linuxmint-21.3"
    archive: str | None = None  # whose packages the plan uses, "ubuntu-22.04"

    def to_json(self) -> dict[str, Any]:
        """The `resolve --json` contract (DESIGN.md, schema egpu-setup/resolution/1)."""
        d = self.driver
        repo = None
        if d.repo is not None:
            repo = {
                "url": d.repo.url,
                "keyring_url": d.repo.keyring_url,
                "fingerprint": d.repo.fingerprint,
                "pin": d.repo.pin,
            }
        return {
            "schema": SCHEMA_RESOLUTION,
            "gpu": None
            if self.gpu is None
            else {
                "name": self.gpu.name,
                "pci_id": self.gpu.pci_id,
                "architecture": self.gpu.architecture,
                "compute_capability": self.gpu.compute_capability,
            },
            "driver": {
                "installed": d.installed,
                "action": d.action,
                "branch": d.branch,
                "minimum": d.minimum,
                "flavour": d.flavour,
                "packages": list(d.packages),
                "source": d.source,
                "apt_components": list(d.apt_components),
                "repo": repo,
            },
            "torch": {
                "version": self.torch.version,
                "variant": self.torch.variant,
                "index_url": self.torch.index_url,
                "requirements": list(self.torch.requirements),
            },
            "python": self.python,
            "platform": self.platform,
            "distro": self.distro,
            "archive": self.archive,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
        }


# -- inputs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Constraints:
    """What the user asked for (CLI flags, profile): what-if inputs override detected facts."""

    torch_spec: str | None = None  # "2.9.1", "2.9", ">=2.7", "==2.5.1", "2.9.1+cu128"
    cuda: str | None = None  # "cu128" / "cpu"
    driver_branch: int | None = None  # --driver-branch N: exactly this branch
    min_branch: int | None = None
    preferred_branch: int | None = None
    max_branch: int | None = None
    flavour: Literal["open", "proprietary", "auto"] = "auto"
    python: str | None = None  # "3.12"
    platform: Literal["linux", "wsl"] | None = None
    distro: str | None = None  # "ubuntu-24.04"
    gpu: str | None = None  # "10de:2b85", "2b85", "RTX 5090"
    driver: str | None = None  # the installed driver, what-if: "550.163.01"
    extras: tuple[str, ...] = ()  # "torchvision", "torchaudio"
    glibc: str | None = None  # the host's glibc, what-if: "2.27" (else the distro's, distros.yaml)


def constraints_from_profile(profile: Any | None, **cli: Any) -> Constraints:
    """Merge a profile's DriverConstraints/TorchConstraints with CLI values (CLI wins; None: unset).

    Duck-typed on the Profile attributes (egpu_setup/profiles.py); this module never imports it."""
    values: dict[str, Any] = {}
    if profile is not None:
        drv = getattr(profile, "driver", None)
        tor = getattr(profile, "torch", None)
        if drv is not None:
            values["min_branch"] = getattr(drv, "min_branch", None)
            values["preferred_branch"] = getattr(drv, "preferred_branch", None)
            values["max_branch"] = getattr(drv, "max_branch", None)
            values["flavour"] = getattr(drv, "flavour", None) or "auto"
        if tor is not None:
            values["torch_spec"] = getattr(tor, "spec", None)
            values["cuda"] = getattr(tor, "cuda", None)
            values["extras"] = tuple(getattr(tor, "extras", ()) or ())
    known = set(Constraints.__dataclass_fields__)
    for key, value in cli.items():
        if key not in known:
            raise TypeError(f"constraints_from_profile: unknown field {key!r}")
        if value is not None and value != ():
            values[key] = value
    return Constraints(**{k: v for k, v in values.items() if v is not None})


# -- internal values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    gpu: ResolvedGpu
    cc: ComputeCapability | None
    arch: Architecture | None


@dataclass(frozen=True)
class _Candidate:
    release: TorchVersion
    variant: TorchVariant
    how: str  # "sass" / "ptx" / "cpu" / "unknown-gpu"

    @property
    def label(self) -> str:
        return f"{self.release.version}+{self.variant.name}"


@dataclass
class _Notes:
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# -- parsing what-if inputs ------------------------------------------------------------------------


def _spec_filter(spec: str | None) -> tuple[Callable[[str], bool], str | None, str]:
    """A predicate over torch versions, the variant a local label pins ('2.9.1+cu128'), and text."""
    if not spec:
        return (lambda _v: True), None, "any"
    text = spec.strip()
    if text.lower().startswith("torch"):
        text = text[5:].strip()
    variant = None
    if re.fullmatch(r"\d+\.\d+(\.\d+)?(\+\w+)?", text):
        try:
            version, variant = parse_torch_version(text)
        except ValueError as exc:
            raise UsageError(
                f"--torch {spec!r}: {exc}", "use e.g. --torch 2.9.1 or '>=2.7'"
            ) from exc
        if version.count(".") == 1:  # "2.9": any 2.9.x
            return (lambda v: v.startswith(version + ".")), variant, f"{version}.x"
        return (lambda v: v == version), variant, version
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        specifier = SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise UsageError(
            f"--torch {spec!r} is not a version or a version specifier",
            "use e.g. --torch 2.9.1, --torch 2.9 or --torch '>=2.7,<2.12'",
        ) from exc
    if any("+" in s.version for s in specifier):
        raise UsageError(
            f"--torch {spec!r}: put the variant in --cuda", "e.g. --torch 2.9.1 --cuda cu128"
        )
    return (lambda v: specifier.contains(v, prereleases=False)), None, str(specifier)


def _parse_python(text: str) -> str:
    try:
        py = PythonVersion.from_str(text)
    except ValueError as exc:
        raise UsageError(f"--python: {exc}", "use e.g. --python 3.12") from exc
    if py.major != 3:
        raise UsageError(
            f"Python {py}: no torch 2.x wheel exists for Python {py.major}",
            "torch 2.x needs Python 3.8 or newer; use e.g. --python 3.12",
        )
    return str(py)


def parse_distro(text: str, matrix: Matrix) -> tuple[str, str | None]:
    """'ubuntu-24.04' -> ('ubuntu', '24.04'); 'arch' -> ('arch', None)."""
    raw = text.strip().lower()
    m = re.fullmatch(r"([a-z][a-z0-9._-]*?)(?:[-: ]([0-9][0-9a-z.]*))?", raw)
    if not m or not matrix.knows_distro_id(m.group(1)):
        supported = ", ".join(d.label for d in matrix.distros)
        raise UsageError(
            f"--distro {text!r}: unknown distribution",
            f"use an os-release ID and VERSION_ID such as {supported}",
        )
    return m.group(1), m.group(2)


def identify_gpu(text: str, matrix: Matrix, notes: _Notes) -> _Target:
    """`--gpu 10de:2b85`, `--gpu 2b85` or `--gpu "RTX 5090"` -> the target GPU."""
    from egpu_setup.compat import gpus  # the GPU table (parsers helper); loaded only when needed

    raw = text.strip()
    m = re.fullmatch(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{4})", raw)
    if m:
        vendor = (m.group(1) or NVIDIA_VENDOR).lower()
        device = m.group(2).lower()
        if vendor != NVIDIA_VENDOR:
            raise UsageError(
                f"--gpu {raw}: vendor {vendor} is not NVIDIA",
                "egpu-setup plans CUDA for NVIDIA GPUs (vendor id 10de); see `lspci -nn`",
            )
        model = gpus.gpu_by_id(device)
        if model is not None:
            return _target(
                matrix, model.name, f"10de:{device}", model.architecture, model.compute_capability
            )
        arch = gpus.arch_from_device_id(device)
        if arch is not None:
            notes.warnings.append(
                f"10de:{device} is not in the GPU table; {arch[0]} (compute capability {arch[1]}) "
                "inferred from its device-id range"
            )
            return _target(matrix, f"NVIDIA device {device}", f"10de:{device}", arch[0], arch[1])
        if m.group(1) is not None:
            raise UsageError(
                f"--gpu {raw}: unknown NVIDIA device id",
                "pass the card's name instead, e.g. --gpu 'RTX 4090', or update egpu-setup",
            )
    model = gpus.gpu_by_name(raw)
    if model is not None:
        return _target(
            matrix,
            model.name,
            f"10de:{model.device_id}",
            model.architecture,
            model.compute_capability,
        )
    arch = gpus.arch_from_text(raw)
    if arch is not None:
        return _target(matrix, raw, None, arch[0], arch[1])
    raise UsageError(
        f"--gpu {raw!r}: unknown GPU",
        "use the PCI id from `lspci -nn` (e.g. --gpu 10de:2684) or a model name such as 'RTX 4090'",
    )


def _target(
    matrix: Matrix, name: str, pci_id: str | None, arch_name: str | None, cc: str | None
) -> _Target:
    capability = ComputeCapability.from_str(cc) if cc else None
    arch = matrix.architecture(capability) if capability else None
    if arch is None and arch_name:
        arch = matrix.architecture_named(arch_name)
    return _Target(
        ResolvedGpu(name, pci_id, arch_name or (arch.name if arch else None), cc), capability, arch
    )


def _target_from_fact(gpu: Any, matrix: Matrix) -> _Target:
    cc = gpu.compute_capability
    arch_name = gpu.architecture
    name = gpu.name or f"NVIDIA device {gpu.device_id}"
    if cc is None and gpu.device_id:
        from egpu_setup.compat import gpus

        model = gpus.gpu_by_id(gpu.device_id)
        found = (model.architecture, model.compute_capability) if model else None
        found = found or gpus.arch_from_device_id(gpu.device_id)
        if found is None and gpu.name:
            found = gpus.arch_from_text(gpu.name)
        if found:
            arch_name, cc = found
    pci_id = f"{gpu.vendor_id or NVIDIA_VENDOR}:{gpu.device_id}" if gpu.device_id else None
    return _target(matrix, name, pci_id, arch_name, cc)


def _target_from_profile(profile: Any, matrix: Matrix) -> _Target | None:
    spec = getattr(profile, "gpu", None)
    if spec is None:
        return None
    cc = getattr(spec, "compute_capability", None)
    arch_name = getattr(spec, "architecture", None)
    ids = tuple(getattr(spec, "device_ids", ()) or ())
    name = getattr(spec, "name", None) or "profile GPU"
    if cc is None and (arch_name or "any") == "any" and not ids:
        return None  # a generic profile names no GPU
    if cc is None:
        from egpu_setup.compat import gpus

        found = gpus.arch_from_text(arch_name or name)
        if found:
            arch_name, cc = found
    return _target(matrix, name, f"10de:{ids[0]}" if ids else None, arch_name, cc)


# -- candidate torch wheels ------------------------------------------------------------------------


def _order(c: _Candidate) -> tuple[Any, ...]:
    cuda = variant_cuda(c.variant.name) or (0, 0)
    return (c.release.key, c.how != "ptx", c.variant.stable, cuda)


def _candidates(
    matrix: Matrix,
    python: str,
    target: _Target | None,
    want_gpu: bool,
    spec: str | None,
    cuda: str | None,
) -> list[_Candidate]:
    """Every wheel that satisfies the static facts, best first; MatrixError naming the nearest."""
    matches_spec, spec_variant, spec_text = _spec_filter(spec)
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
        pys = sorted({p for t, v in pairs for p in t.pythons(v)}, key=PythonVersion.from_str)
        raise MatrixError(
            f"no torch wheel exists for Python {python}",
            f"torch 2.x has wheels for Python {pys[0]} to {pys[-1]}; "
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
        return sorted((_Candidate(t, v, "cpu") for t, v in pairs_spec), key=_order, reverse=True)
    if target is None or target.cc is None:
        return sorted(
            (_Candidate(t, v, "unknown-gpu") for t, v in pairs_spec), key=_order, reverse=True
        )
    runs = [(t, v, v.arch.runs(target.cc)) for t, v in pairs_spec if v.arch is not None]
    found = [_Candidate(t, v, how) for t, v, how in runs if how]
    if found:
        return sorted(found, key=_order, reverse=True)
    raise _no_kernels(matrix, python, target, spec, spec_text, cuda, pairs_py, pairs_spec)


def _no_kernels(
    matrix: Matrix,
    python: str,
    target: _Target,
    spec: str | None,
    spec_text: str,
    cuda: str | None,
    pairs_py: list[tuple[TorchVersion, TorchVariant]],
    pairs_spec: list[tuple[TorchVersion, TorchVariant]],
) -> MatrixError:
    gpu = f"{target.gpu.name} (compute capability {target.cc})"
    working = [(t, v) for t, v in pairs_py if v.arch is not None and v.arch.runs(target.cc)]  # type: ignore[arg-type]
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


# -- driver decisions ------------------------------------------------------------------------------


def _flavour_for(
    arch: Architecture | None, branch: int, wanted: str, matrix: Matrix
) -> Literal["open", "proprietary"] | None:
    """The kernel-module flavour for `branch` on this architecture, or None if none works."""
    proprietary_ok = branch < matrix.open_only_from_branch
    if arch is not None and arch.needs_open:
        return None if wanted == "proprietary" else "open"
    if arch is not None and not arch.open_modules:
        return None if wanted == "open" or not proprietary_ok else "proprietary"
    if wanted == "open":
        return "open"
    if wanted == "proprietary":
        return "proprietary" if proprietary_ok else None
    return "open" if branch >= matrix.open_default_from_branch else "proprietary"


def _common_flavour(
    archs: Iterable[Architecture], branch: int, wanted: str, matrix: Matrix
) -> str | None:
    """A flavour that drives every architecture in `archs` on `branch`, or None."""
    archs = list(archs)
    if not all(a.drives(branch) for a in archs):
        return None
    for flavour in ["open", "proprietary"] if wanted == "auto" else [wanted]:
        if all(_flavour_for(a, branch, flavour, matrix) == flavour for a in archs):
            return flavour
    return None


def _branch_ok(branch: int, c: Constraints) -> bool:
    if c.driver_branch is not None and branch != c.driver_branch:
        return False
    if c.min_branch is not None and branch < c.min_branch:
        return False
    return not (c.max_branch is not None and branch > c.max_branch)


def _allows(c: _Candidate, driver: DriverVersion, matrix: Matrix, windows: bool = False) -> bool:
    if c.variant.name == "cpu":
        return True
    floor = matrix.cuda_variant(c.variant.name)
    if floor is None:
        return False
    return driver >= (floor.min_driver_windows if windows else floor.min_driver)


def _floor(
    c: _Candidate, arch: Architecture | None, matrix: Matrix, windows: bool = False
) -> DriverVersion | None:
    floors = []
    cv = matrix.cuda_variant(c.variant.name)
    if cv is not None:
        floors.append(cv.min_driver_windows if windows else cv.min_driver)
    if arch is not None and arch.first_driver is not None:
        floors.append(arch.first_driver)
    return max(floors) if floors else None


@dataclass(frozen=True)
class _Option:
    source: Literal["distro", "nvidia-repo"]
    branch: int
    version: DriverVersion  # what the plan would install (a branch's newest when not known)
    flavour: Literal["open", "proprietary"]
    shared: bool  # also drives the machine's other NVIDIA GPUs


def _options(
    matrix: Matrix,
    distro: Distro | None,
    target: _Target,
    others: list[_Target],
    c: Constraints,
) -> list[_Option]:
    arch = target.arch
    other_archs = [o.arch for o in others if o.arch is not None]
    out: list[_Option] = []

    def add(source: Literal["distro", "nvidia-repo"], branch: int, version: str | None) -> None:
        if arch is not None and not arch.drives(branch):
            return
        if not _branch_ok(branch, c):
            return
        flavour = _flavour_for(arch, branch, c.flavour, matrix)
        if flavour is None:
            return
        shared_flavour = _common_flavour(
            [a for a in [arch, *other_archs] if a], branch, c.flavour, matrix
        )
        if other_archs and shared_flavour is not None:
            flavour = shared_flavour  # type: ignore[assignment]
        dv = DriverVersion.from_str(version) if version else latest_of_branch(branch)
        out.append(
            _Option(source, branch, dv, flavour, not other_archs or shared_flavour is not None)
        )

    if distro is not None:
        ordered = sorted(
            distro.branches,
            key=lambda b: (
                b.branch != (c.preferred_branch or distro.recommended_branch),
                -b.branch,
            ),
        )
        for b in ordered:
            add("distro", b.branch, b.version)
        if distro.nvidia_repo:
            repo = matrix.nvidia_repo
            preferred = c.preferred_branch or repo.recommended_branch
            for branch in sorted(repo.branches, key=lambda b: (b != preferred, -b)):
                add("nvidia-repo", branch, None)
    # Shared options first (a mixed machine keeps every GPU driven when it can); stable otherwise.
    return sorted(out, key=lambda o: not o.shared)


def _packages(
    matrix: Matrix, distro: Distro, option: _Option, kernel: str | None, notes: _Notes
) -> tuple[tuple[str, ...], tuple[str, ...], NvidiaRepo | None]:
    """(packages, apt components, repo) that install `option` on `distro`."""
    branch, flavour = option.branch, option.flavour
    if option.source == "nvidia-repo":
        repo = matrix.nvidia_repo
        directory = distro.nvidia_repo or ""
        pinned = branch >= repo.pinning_from_branch
        key = ("open" if flavour == "open" else "proprietary") + ("_pinned" if pinned else "")
        pkgs = tuple(p.format(branch=branch) for p in repo.packages[key])
        url = repo.url.format(dir=directory)
        rk = repo.key_for(directory)
        nrepo = NvidiaRepo(url, url + rk.file, rk.fingerprint, pkgs[0] if pinned else None)
        headers = distro.headers if distro.scheme == "debian" else ()
        return headers + pkgs, (), nrepo
    if distro.scheme == "debian":
        if flavour == "open":
            pkgs = ("nvidia-open-kernel-dkms", "nvidia-driver", "firmware-nvidia-gsp")
        else:
            pkgs = ("nvidia-kernel-dkms", "nvidia-driver", "firmware-nvidia-gsp")
        return distro.headers + pkgs, distro.components, None
    suffix = "-open" if flavour == "open" else ""
    kflavour = _ubuntu_kernel_flavour(kernel, distro, notes)
    return (
        (f"nvidia-driver-{branch}{suffix}", f"linux-modules-nvidia-{branch}{suffix}-{kflavour}"),
        distro.components,
        None,
    )


def _ubuntu_kernel_flavour(kernel: str | None, distro: Distro, notes: _Notes) -> str:
    """'6.8.0-45-generic' on noble -> 'generic'; '6.11.0-29-generic' -> 'generic-hwe-24.04'.

    Canonical's signed prebuilt modules come per kernel flavour (linux-modules-nvidia-580-open-
    generic); an HWE kernel needs the -hwe-<release> meta package, else the modules miss the
    running kernel."""
    if not kernel:
        notes.reasons.append("kernel unknown: the 'generic' Ubuntu kernel flavour is assumed")
        return "generic"
    m = re.match(r"^(\d+\.\d+)\.\d+-\d+-([a-z0-9-]+)$", kernel)
    if not m:
        notes.warnings.append(
            f"kernel {kernel} is not an Ubuntu archive kernel: assuming 'generic' "
            "(DKMS may be needed)"
        )
        return "generic"
    series, flavour = m.groups()
    if distro.ga_kernel and series != distro.ga_kernel and flavour in ("generic", "lowlatency"):
        return f"{flavour}-hwe-{distro.version_id}"
    return flavour


# -- the resolver ----------------------------------------------------------------------------------


def resolve(
    facts: Any | None,
    profile: Any | None,
    constraints: Constraints,
    matrix: Matrix | None = None,
) -> Resolution:
    """Choose the driver, CUDA variant and torch wheel, with a reason for every choice."""
    m = matrix or load_matrix()
    c = constraints
    n = _Notes()
    if c.cuda is not None:
        try:
            c = _replace(c, cuda=parse_variant(c.cuda))
        except ValueError as exc:
            raise UsageError(f"--cuda: {exc}", "use e.g. --cuda cu128 or --cuda cpu") from exc
    if c.flavour not in ("open", "proprietary", "auto"):
        raise UsageError(f"driver flavour {c.flavour!r} is not open, proprietary or auto")
    if c.driver_branch is not None and m.branch(c.driver_branch) is None:
        known = ", ".join(str(b.branch) for b in m.branches)
        raise UsageError(
            f"--driver-branch {c.driver_branch}: not an NVIDIA driver branch we know",
            f"known branches: {known}",
        )
    installed = _installed_driver(facts, c)
    os_facts = getattr(facts, "os", None)

    # Platform
    platform: Literal["linux", "wsl"] = c.platform or (
        "wsl" if getattr(os_facts, "wsl", None) else "linux"
    )

    # Distro
    distro_id, distro_ver = (getattr(os_facts, "id", None), getattr(os_facts, "version_id", None))
    if c.distro:
        distro_id, distro_ver = parse_distro(c.distro, m)
    distro = m.distro(distro_id, distro_ver)
    distro_label = f"{distro_id}-{distro_ver}" if distro_id and distro_ver else distro_id
    base = m.base_of(distro_id, distro_ver) if distro is None else None
    if base is not None:
        distro = next(d for d in m.distros if d.label == base.base)
        n.reasons.append(
            f"{distro_label} uses the {base.base} package archive: planned as {base.base}"
        )

    # Python
    python = _python(facts, c, distro, n)

    # GPU
    target, others = _pick_target(facts, profile, c, m, n)
    want_gpu = target is not None or installed is not None
    if target is not None:
        gpu = target.gpu
        if target.cc is None:
            n.warnings.append(
                f"compute capability of {gpu.name} unknown: wheels are not checked for its kernels"
            )
        else:
            n.reasons.append(
                f"{gpu.name}{' (' + gpu.pci_id + ')' if gpu.pci_id else ''} is {gpu.architecture}, "
                f"compute capability {target.cc}"
            )
    elif installed is not None:
        n.warnings.append(
            f"no NVIDIA GPU known: resolved from driver {installed} alone, so the wheel is not "
            "checked for your GPU's kernels (pass --gpu)"
        )
    elif c.cuda not in (None, "cpu"):
        want_gpu = True
        n.warnings.append(
            "no NVIDIA GPU and no driver known: the CUDA wheel is not checked against either"
        )
    else:
        n.warnings.append(
            "no NVIDIA GPU found: planning the CPU build (plug in the eGPU or pass --gpu)"
        )

    cands = _candidates(m, python, target, want_gpu, c.torch_spec, c.cuda)
    cands = _within_glibc(cands, c, distro_id, distro_ver, distro_label, base, n)

    if platform == "wsl":
        driver, chosen = _wsl_driver(m, cands, installed, target, n)
    elif target is None:
        driver, chosen = _driver_unknown_gpu(m, cands, installed, n)
    else:
        driver, chosen = _linux_driver(
            m, cands, installed, facts, target, others, distro, distro_label, python, c, n
        )

    torch = _torch_plan(m, chosen, c, n)
    if chosen.how == "ptx":
        n.warnings.append(
            f"torch {chosen.label} has no SASS for compute capability "
            f"{target.cc if target else '?'}: kernels are JIT-compiled from PTX on first use "
            "(slow first start)"
        )
    return Resolution(
        gpu=target.gpu if target else None,
        driver=driver,
        torch=torch,
        python=python,
        platform=platform,
        reasons=tuple(n.reasons),
        warnings=tuple(n.warnings),
        distro=distro_label,
        archive=distro.label if distro is not None else None,
    )


def _within_glibc(
    cands: list[_Candidate],
    c: Constraints,
    distro_id: str | None,
    distro_ver: str | None,
    distro_label: str | None,
    base: Any,
    n: _Notes,
) -> list[_Candidate]:
    """The candidates whose Linux wheels load on the host's glibc (torch.yaml `manylinux`, the
    distro's glibc from distros.yaml or `c.glibc`); MatrixError when none does."""
    from egpu_setup.compat.glibc import distro_glibc, glibc_key, torch_floor

    if c.glibc is not None:
        if glibc_key(c.glibc) is None:
            raise UsageError(f"glibc {c.glibc!r} is not a version", "use e.g. 2.27")
        glibc, where = c.glibc, "this host"
    else:
        found = distro_glibc(distro_id, distro_ver)
        if found is None and base is not None:
            found = distro_glibc(*base.base.rsplit("-", 1))
        if found is None:
            return cands  # an unknown glibc floors nothing (a Python's own check still applies)
        glibc, where = found[0], distro_label or "this distribution"
    have = glibc_key(glibc)
    keep, dropped = [], []
    for cand in cands:
        floor = torch_floor(cand.release.version, cand.variant.name)
        needs = glibc_key(floor.glibc) if floor else None
        (dropped if needs is not None and have is not None and needs > have else keep).append(
            (cand, floor)
        )
    if not dropped:
        return cands
    newest_refused, floor = max(dropped, key=lambda x: _order(x[0]))
    if not keep:
        lowest = min(glibc_key(f.glibc) for _, f in dropped if f)  # type: ignore[type-var]
        need = f"{lowest[0]}.{lowest[1]}"
        hint = (
            f"use a distribution with glibc >= {need} (Ubuntu 20.04, Debian 10, RHEL 8 or newer "
            f"have 2.28+), or run torch in a container that has one"
        )
        if c.torch_spec:
            hint += "; or drop --torch so that the newest torch that loads here is chosen"
        raise MatrixError(
            f"no torch wheel matching the request loads on glibc {glibc} ({where}): "
            f"torch {newest_refused.label} needs glibc {floor.glibc} ({floor.tag})",
            hint,
        )
    best = keep[0][0]
    newer = [(cand, f) for cand, f in dropped if _order(cand) > _order(best)]
    if newer:
        first, first_floor = min(newer, key=lambda x: _order(x[0]))
        n.reasons.append(
            f"glibc {glibc} ({where}): the wheels from torch {first.label} on need glibc "
            f"{first_floor.glibc} ({first_floor.tag}), so the newest that loads is {best.label}"
        )
    return [cand for cand, _ in keep]


def _replace(c: Constraints, **kw: Any) -> Constraints:
    from dataclasses import replace

    return replace(c, **kw)


def _installed_driver(facts: Any | None, c: Constraints) -> DriverVersion | None:
    text = c.driver
    if text is None and facts is not None:
        text = getattr(getattr(facts, "nvidia", None), "driver_version", None)
        if text:
            text = str(text).splitlines()[0].strip()  # WSL nvidia-smi: first line only (uv#14647)
    if not text:
        return None
    try:
        return DriverVersion.from_str(text)
    except ValueError as exc:
        if c.driver is not None:
            raise UsageError(f"--driver: {exc}", "use e.g. --driver 550.163.01") from exc
        return None


def _python(facts: Any | None, c: Constraints, distro: Distro | None, n: _Notes) -> str:
    if c.python:
        return _parse_python(c.python)
    detected = getattr(getattr(facts, "python", None), "version", None)
    if detected:
        try:
            return str(PythonVersion.from_str(detected))
        except ValueError:
            pass
    if distro is not None:
        n.reasons.append(f"Python {distro.python}: the default python3 of {distro.label}")
        return distro.python
    n.warnings.append(f"target Python unknown: assuming {FALLBACK_PYTHON} (pass --python)")
    return FALLBACK_PYTHON


def _pick_target(
    facts: Any | None, profile: Any | None, c: Constraints, m: Matrix, n: _Notes
) -> tuple[_Target | None, list[_Target]]:
    nvidia = [
        g for g in (getattr(facts, "gpus", ()) or ()) if getattr(g, "vendor", None) == "nvidia"
    ]
    if c.gpu:
        target = identify_gpu(c.gpu, m, n)
        others = [
            _target_from_fact(g, m) for g in nvidia if f"10de:{g.device_id}" != target.gpu.pci_id
        ]
        return target, others
    if nvidia:
        egpu = getattr(facts, "egpu", None)
        chosen = egpu
        if chosen is None and profile is not None:
            ids = set(getattr(getattr(profile, "gpu", None), "device_ids", ()) or ())
            chosen = next((g for g in nvidia if g.device_id in ids), None)
        if chosen is None and len(nvidia) == 1:
            chosen = nvidia[0]
        if chosen is None:
            targets = [_target_from_fact(g, m) for g in nvidia]
            best = max(range(len(nvidia)), key=lambda i: targets[i].cc or ComputeCapability(0, 0))
            chosen = nvidia[best]
            n.warnings.append(
                f"{len(nvidia)} NVIDIA GPUs and none known to be external: planning for "
                f"{targets[best].gpu.name} at {chosen.pci_address} (pass --gpu to choose)"
            )
        others = [_target_from_fact(g, m) for g in nvidia if g is not chosen]
        target = _target_from_fact(chosen, m)
        if getattr(chosen, "external", None):
            n.reasons.append(f"planning for the external GPU at {chosen.pci_address}")
        return target, others
    if profile is not None:
        target = _target_from_profile(profile, m)
        if target is not None:
            n.reasons.append(
                f"no NVIDIA GPU detected: planning for the profile's GPU, {target.gpu.name}"
            )
        return target, []
    return None, []


def _wsl_driver(
    m: Matrix,
    cands: list[_Candidate],
    installed: DriverVersion | None,
    target: _Target | None,
    n: _Notes,
) -> tuple[DriverPlan, _Candidate]:
    n.reasons.append("WSL2: the Windows host owns the NVIDIA driver; only the pip side is planned")
    arch = target.arch if target else None
    if installed is None:
        chosen = cands[0]
        floor = _floor(chosen, arch, m, windows=True)
        # A CPU wheel needs no driver at all, and with no GPU known there is no floor to name.
        if floor is not None and chosen.variant.name != "cpu":
            n.warnings.append(
                "Windows driver version unknown (nvidia-smi in the guest gave none): torch "
                f"{chosen.label} needs a Windows NVIDIA driver >= {floor}"
            )
    else:
        if arch is not None and arch.first_driver is not None and installed < arch.first_driver:
            raise MatrixError(
                f"the Windows host driver {installed} predates {arch.name} support "
                f"(needs >= {arch.first_driver})",
                f"update the NVIDIA driver on Windows to >= {arch.first_driver}, then rerun",
            )
        if (
            arch is not None
            and arch.last_branch is not None
            and installed.branch > arch.last_branch
        ):
            n.warnings.append(
                f"the Windows host driver {installed} is newer than the last branch for "
                f"{arch.name} ({arch.last_branch}); if the GPU is missing in WSL, install a "
                f"{arch.last_branch} driver on Windows"
            )
        fitting = [x for x in cands if _allows(x, installed, m, windows=True)]
        if not fitting:
            best = cands[0]
            floor = _floor(best, arch, m, windows=True)
            raise MatrixError(
                f"the Windows host driver {installed} is too old for torch {best.label} "
                f"(needs >= {floor})",
                f"update the NVIDIA driver on Windows to >= {floor}, "
                "or choose an older --torch/--cuda",
            )
        chosen = fitting[0]
        _explain_newer(m, cands, chosen, installed, n, "the Windows host driver", windows=True)
    floor = _floor(chosen, arch, m, windows=True)
    plan = DriverPlan(
        installed=str(installed) if installed else None,
        action="host-managed",
        branch=installed.branch if installed else None,
        minimum=str(floor) if floor else None,
        flavour=None,
        packages=(),
        source="host",
    )
    return plan, chosen


def _driver_unknown_gpu(
    m: Matrix, cands: list[_Candidate], installed: DriverVersion | None, n: _Notes
) -> tuple[DriverPlan, _Candidate]:
    if installed is not None:
        fitting = [x for x in cands if _allows(x, installed, m)]
        if not fitting:
            raise MatrixError(
                f"driver {installed} is too old for every matching torch wheel",
                f"torch {cands[0].label} needs >= {_floor(cands[0], None, m)}",
            )
        chosen = fitting[0]
        _explain_newer(m, cands, chosen, installed, n, "the installed driver")
        action: Literal["keep", "host-managed"] = "keep"
        n.reasons.append(f"keeping driver {installed}: it runs torch {chosen.label}")
    else:
        chosen = cands[0]
        action = "host-managed"
        n.reasons.append("no NVIDIA GPU known: no driver is planned")
    floor = _floor(chosen, None, m)
    return (
        DriverPlan(
            installed=str(installed) if installed else None,
            action=action,
            branch=installed.branch if installed else None,
            minimum=str(floor) if floor else None,
            flavour=None,
            packages=(),
            source="host",
        ),
        chosen,
    )


def _keep_blocker(
    m: Matrix,
    installed: DriverVersion,
    facts: Any | None,
    target: _Target,
    c: Constraints,
    *,
    branch_range: bool = True,
) -> str | None:
    """Why the installed driver cannot stay for this GPU, or None when it can.

    `branch_range=False` leaves out the requested branch range: a wish we cannot act on where
    egpu-setup installs no driver (see _keep_unmanaged)."""
    arch = target.arch
    name = target.gpu.name
    if arch is not None:
        if arch.last_branch is not None and installed.branch > arch.last_branch:
            return (
                f"driver {installed} no longer drives {name}: {arch.name} support ends with the "
                f"{arch.last_branch} branch (newer drivers ignore the GPU)"
            )
        if arch.first_driver is not None and installed < arch.first_driver:
            return (
                f"driver {installed} is older than the first driver for {arch.name} "
                f"({arch.first_driver})"
            )
    flavour = (
        getattr(getattr(facts, "nvidia", None), "module_flavour", None)
        if c.driver is None
        else None
    )
    if arch is not None and flavour:
        if arch.needs_open and flavour == "proprietary":
            return f"{name} needs the open kernel modules; the proprietary ones are loaded"
        if not arch.open_modules and flavour == "open":
            return f"{name} needs the proprietary kernel modules; the open ones are loaded"
    if flavour and c.flavour in ("open", "proprietary") and flavour != c.flavour:
        return f"the profile asks for {c.flavour} kernel modules; {flavour} are loaded"
    if branch_range and not _branch_ok(installed.branch, c):
        return f"driver branch {installed.branch} is outside the requested branch range"
    return None


def _linux_driver(
    m: Matrix,
    cands: list[_Candidate],
    installed: DriverVersion | None,
    facts: Any | None,
    target: _Target,
    others: list[_Target],
    distro: Distro | None,
    distro_label: str | None,
    python: str,
    c: Constraints,
    n: _Notes,
) -> tuple[DriverPlan, _Candidate]:
    arch = target.arch
    _explain_mixed(m, target, others, c, n)

    if (
        installed is not None
        and distro is None
        and _keep_blocker(m, installed, facts, target, c, branch_range=False) is None
    ):
        # No driver packages known here, so the plan cannot change a driver that drives the GPU:
        # torch must fit it (or the request is impossible), whatever branch was asked for.
        return _keep_unmanaged(m, cands, installed, facts, target, distro_label, python, c, n)

    if installed is not None:
        blocker = _keep_blocker(m, installed, facts, target, c)
        fitting = [x for x in cands if _allows(x, installed, m)]
        if blocker is None and fitting:
            chosen = fitting[0]
            n.reasons.append(
                f"keeping driver {installed}: it drives {target.gpu.name} "
                f"and runs torch {chosen.label}"
            )
            _explain_newer(
                m, cands, chosen, installed, n, "the installed driver", upgrade_hint=True
            )
            flavour = (
                getattr(getattr(facts, "nvidia", None), "module_flavour", None)
                if c.driver is None
                else None
            )
            floor = _floor(chosen, arch, m)
            return (
                DriverPlan(
                    installed=str(installed),
                    action="keep",
                    branch=installed.branch,
                    minimum=str(floor) if floor else None,
                    flavour=flavour or (_flavour_for(arch, installed.branch, c.flavour, m)),
                    packages=(),
                    source="host",
                ),
                chosen,
            )
        if blocker:
            n.reasons.append(blocker)
        elif not fitting:
            n.reasons.append(
                f"driver {installed} runs none of the matching wheels "
                f"(torch {cands[0].label} needs >= {_floor(cands[0], arch, m)})"
            )

    if distro is None:
        return _unsupported_distro(m, cands, installed, target, distro_label, c, n)

    options = _options(m, distro, target, others, c)
    for option in options:
        fitting = [x for x in cands if _allows(x, option.version, m)]
        if not fitting:
            continue
        chosen = fitting[0]
        # A what-if distro is not this machine: its kernel says nothing about that one's flavour.
        kernel = None if c.distro else getattr(getattr(facts, "os", None), "kernel", None)
        pkgs, components, repo = _packages(m, distro, option, kernel, n)
        where = (
            f"{distro.label}'s archive" if option.source == "distro" else "NVIDIA's CUDA repository"
        )
        why = (
            f"driver branch {option.branch} ({option.flavour} modules) from {where}: it drives "
            f"{target.gpu.name} and runs torch {chosen.label}"
        )
        if option.source == "nvidia-repo":
            skipped = _why_not_distro(m, distro, target, cands, c)
            if skipped:
                why += f"; {skipped}"
        n.reasons.append(why)
        if option.flavour == "open" and arch is not None and arch.needs_open:
            n.reasons.append(f"{arch.name} needs the open kernel modules")
        elif option.flavour == "proprietary" and arch is not None and not arch.open_modules:
            n.reasons.append(f"{arch.name} is supported by the proprietary kernel modules only")
        _explain_newer(
            m,
            cands,
            chosen,
            option.version,
            n,
            f"branch {option.branch}",
            upgrade_hint=option.source == "distro",
        )
        if installed is None:
            action: Literal["install", "upgrade"] = "install"
        elif option.branch > installed.branch:
            action = "upgrade"
        else:
            action = "install"
            n.warnings.append(
                f"the installed driver {installed} will be replaced by branch {option.branch}"
            )
        floor = _floor(chosen, arch, m)
        return (
            DriverPlan(
                installed=str(installed) if installed else None,
                action=action,
                branch=option.branch,
                minimum=str(floor) if floor else None,
                flavour=option.flavour,
                packages=pkgs,
                source=option.source,
                apt_components=components,
                repo=repo,
            ),
            chosen,
        )
    raise _no_driver(m, distro, target, cands, c)


def _why_not_distro(
    m: Matrix, distro: Distro, target: _Target, cands: list[_Candidate], c: Constraints
) -> str:
    arch = target.arch
    reasons = []
    for b in distro.branches:
        if arch is not None and not arch.drives(b.branch):
            reasons.append(f"{distro.label}'s {b.branch} does not drive {arch.name}")
        elif not _branch_ok(b.branch, c):
            reasons.append(f"{distro.label}'s {b.branch} is outside the requested branches")
        elif _flavour_for(arch, b.branch, c.flavour, m) is None:
            reasons.append(f"{distro.label}'s {b.branch} lacks the needed module flavour")
        else:
            dv = DriverVersion.from_str(b.version) if b.version else latest_of_branch(b.branch)
            if not any(_allows(x, dv, m) for x in cands):
                reasons.append(
                    f"{distro.label}'s {b.branch} is too old for the requested torch "
                    f"({cands[0].label} needs >= {_floor(cands[0], arch, m)})"
                )
    return "; ".join(dict.fromkeys(reasons))


def _no_driver(
    m: Matrix, distro: Distro, target: _Target, cands: list[_Candidate], c: Constraints
) -> MatrixError:
    arch = target.arch
    name = f"{target.gpu.name} ({arch.name if arch else 'unknown architecture'})"
    if c.driver_branch is not None:
        if arch is not None and not arch.drives(c.driver_branch):
            last = (
                f"the last branch for {arch.name} is {arch.last_branch}"
                if arch.last_branch
                else f"{arch.name} needs >= {arch.first_driver}"
            )
            return MatrixError(
                f"driver branch {c.driver_branch} does not drive {name}",
                f"{last}; use --driver-branch {arch.last_branch or 580}",
            )
        if _flavour_for(arch, c.driver_branch, c.flavour, m) is None:
            return MatrixError(
                f"driver branch {c.driver_branch} has no {c.flavour} kernel modules for {name}",
                "change the profile's driver flavour or the branch",
            )
        floor = _floor(cands[0], arch, m)
        return MatrixError(
            f"driver branch {c.driver_branch} cannot run torch {cands[0].label} "
            f"(needs >= {floor}), or it is not packaged for {distro.label}",
            f"drop --driver-branch, or pick an older torch/--cuda; packaged branches: "
            f"{', '.join(str(b.branch) for b in distro.branches)} "
            f"(+ NVIDIA repo {', '.join(map(str, m.nvidia_repo.branches))})",
        )
    if (
        arch is not None
        and arch.last_branch is not None
        and c.min_branch
        and c.min_branch > arch.last_branch
    ):
        return MatrixError(
            f"the profile asks for driver branch >= {c.min_branch}, "
            f"but {arch.name} support ends at {arch.last_branch}",
            f"set the profile's min_branch to {arch.last_branch} or lower",
        )
    if (
        arch is not None
        and c.flavour != "auto"
        and all(_flavour_for(arch, b, c.flavour, m) is None for b in (570, 580))
    ):
        return MatrixError(
            f"{name} cannot use the {c.flavour} kernel modules",
            "set the profile's driver flavour to auto",
        )
    return MatrixError(
        f"no packaged driver branch for {distro.label} drives {name} within the constraints",
        "relax the driver branch limits or --torch/--cuda",
    )


def _requested_range(c: Constraints) -> str:
    if c.driver_branch is not None:
        return f"--driver-branch {c.driver_branch}"
    parts = [
        f">= {c.min_branch}" if c.min_branch is not None else "",
        f"<= {c.max_branch}" if c.max_branch is not None else "",
    ]
    return "the requested driver branch range (" + ", ".join(p for p in parts if p) + ")"


def _keep_unmanaged(
    m: Matrix,
    cands: list[_Candidate],
    installed: DriverVersion,
    facts: Any | None,
    target: _Target,
    distro_label: str | None,
    python: str,
    c: Constraints,
    n: _Notes,
) -> tuple[DriverPlan, _Candidate]:
    """The installed driver drives the GPU on a distribution we have no driver packages for.

    Same policy as WSL2 and the GPU-less case: the driver is managed outside egpu-setup, so the
    torch choice fits the installed driver, or the request is refused (exit 2) naming what the
    installed driver does run. Planning a wheel for a driver we cannot install left a torch that
    fails at `torch.cuda.is_available()` (CUDA minor-version floors: matrix-facts §1.2)."""
    arch = target.arch
    where = distro_label or "this distribution"
    fitting = [x for x in cands if _allows(x, installed, m)]
    if not fitting:
        best = cands[0]
        floor = _floor(best, arch, m)
        runs = [
            x for x in _candidates(m, python, target, True, None, None) if _allows(x, installed, m)
        ]
        hint = f"upgrade the NVIDIA driver to >= {floor} by hand and rerun"
        if runs:
            hint += (
                f", or ask for a torch driver {installed} runs: --torch {runs[0].label} "
                "(in place of --torch/--cuda)"
            )
        raise MatrixError(
            f"driver {installed} cannot run torch {best.label} (needs >= {floor}), and "
            f"egpu-setup installs no NVIDIA driver on {where}",
            hint,
        )
    chosen = fitting[0]
    if not _branch_ok(installed.branch, c):
        n.reasons.append(
            f"{_requested_range(c)} does not apply: egpu-setup installs no NVIDIA driver on "
            f"{where} (the driver is managed outside it), so torch is chosen for the installed "
            f"driver {installed}"
        )
        n.warnings.append(
            f"driver {installed} is kept although {_requested_range(c)} was asked for: install "
            "that branch by hand, then rerun `egpu-setup resolve`"
        )
    n.reasons.append(
        f"keeping driver {installed}: it drives {target.gpu.name} and runs torch {chosen.label}"
    )
    _explain_newer(m, cands, chosen, installed, n, "the installed driver")
    flavour = (
        getattr(getattr(facts, "nvidia", None), "module_flavour", None)
        if c.driver is None
        else None
    )
    floor = _floor(chosen, arch, m)
    return (
        DriverPlan(
            installed=str(installed),
            action="keep",
            branch=installed.branch,
            minimum=str(floor) if floor else None,
            flavour=flavour or _flavour_for(arch, installed.branch, c.flavour, m),
            packages=(),
            source="host",
        ),
        chosen,
    )


def _unsupported_distro(
    m: Matrix,
    cands: list[_Candidate],
    installed: DriverVersion | None,
    target: _Target,
    distro_label: str | None,
    c: Constraints,
    n: _Notes,
) -> tuple[DriverPlan, _Candidate]:
    arch = target.arch
    branch = c.driver_branch or c.preferred_branch or m.nvidia_repo.recommended_branch
    if arch is not None and not arch.drives(branch):
        branch = arch.last_branch or branch
    chosen = next((x for x in cands if _allows(x, latest_of_branch(branch), m)), cands[0])
    floor = _floor(chosen, arch, m)
    flavour = _flavour_for(arch, branch, c.flavour, m)
    n.warnings.append(
        f"no driver packages known for {distro_label or 'this distribution'}: install NVIDIA "
        f"driver branch {branch} ({flavour or 'open'} modules, >= {floor}) by hand; "
        "the torch side is resolved"
    )
    return (
        DriverPlan(
            installed=str(installed) if installed else None,
            action="host-managed",
            branch=branch,
            minimum=str(floor) if floor else None,
            flavour=flavour,
            packages=(),
            source="host",
        ),
        chosen,
    )


def _explain_newer(
    m: Matrix,
    cands: list[_Candidate],
    chosen: _Candidate,
    driver: DriverVersion,
    n: _Notes,
    who: str,
    upgrade_hint: bool = False,
    windows: bool = False,
) -> None:
    """Say what a newer driver would unlock, when the driver is what holds torch back."""
    best = cands[0]
    if best is chosen or best.release.key <= chosen.release.key:
        return
    cv = m.cuda_variant(best.variant.name)
    floor = (cv.min_driver_windows if windows else cv.min_driver) if cv else None
    need = f">= {floor}" if floor else "a newer driver"
    tail = f" (use --driver-branch {max(floor.major, 580)})" if upgrade_hint and floor else ""
    n.reasons.append(
        f"torch {best.label} would need a driver {need}; {who} allows up to {chosen.label}{tail}"
    )


def _explain_mixed(
    m: Matrix, target: _Target, others: list[_Target], c: Constraints, n: _Notes
) -> None:
    for other in others:
        if other.arch is None or target.arch is None:
            continue
        branches = sorted({b.branch for b in m.branches}, reverse=True)
        shared = [
            b for b in branches if _common_flavour([target.arch, other.arch], b, c.flavour, m)
        ]
        if not shared:
            other_needs = (
                f"proprietary modules, up to {other.arch.last_branch}"
                if not other.arch.open_modules
                else "open modules"
            )
            n.warnings.append(
                f"no single driver branch drives both {other.gpu.name} ({other.arch.name}: "
                f"{other_needs}) "
                f"and {target.gpu.name} ({target.arch.name}: "
                f"{'open modules required' if target.arch.needs_open else 'open or proprietary'}): "
                f"this plan serves {target.gpu.name}; {other.gpu.name} will have no NVIDIA driver"
            )


def _torch_plan(m: Matrix, chosen: _Candidate, c: Constraints, n: _Notes) -> TorchPlan:
    release, variant = chosen.release, chosen.variant
    label = f"{release.version}+{variant.name}"
    why = f"torch {label}: the newest release"
    if c.torch_spec:
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
