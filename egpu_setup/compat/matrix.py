"""The compatibility matrix: the data shipped in egpu_setup/data, validated into typed rows.

Knowledge lives in cuda.yaml (variant -> driver floor), torch.yaml (releases, variants, arch
lists, Python versions), drivers.yaml (architecture <-> branch) and distros.yaml (packages, NVIDIA's
repo). Every row carries a `source:`. `matrix update` (fetch.py) may add an overlay read from the
live PyTorch index; `load_matrix()` applies it on top of the shipped snapshot.

Which matrix decides an install is a choice, `select_matrix("shipped" | "updated")`: the shipped
snapshot unless `--matrix updated` asks for the overlay. So the same egpu-setup resolves the same
torch on every laptop of a lab, whatever `matrix update` ran on some of them and when; the
overlay is used when someone asks for it, and the resolution says which one decided.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

from egpu_setup.compat.shipped import load as load_data
from egpu_setup.compat.versions import (
    ArchList,
    ComputeCapability,
    DriverVersion,
    PythonVersion,
    parse_variant,
)
from egpu_setup.errors import MatrixError, UsageError

DATA_FILES = ("cuda.yaml", "torch.yaml", "drivers.yaml", "distros.yaml")


@dataclass(frozen=True)
class CudaVariant:
    variant: str  # "cu128"
    cuda: str  # "12.8"
    min_driver: DriverVersion
    min_driver_windows: DriverVersion  # WSL2: the Windows host's driver
    source: str


@dataclass(frozen=True)
class ToolkitDriver:
    cuda: str
    min_driver: DriverVersion
    source: str


@dataclass(frozen=True)
class TorchVariant:
    name: str  # "cu128" / "cpu"
    status: str  # "stable" / "experimental"
    arch: ArchList | None  # None for cpu
    source: str
    python: tuple[str, ...] | None = None  # from the live index (overlay); None: the release's list

    @property
    def stable(self) -> bool:
        return self.status == "stable"


@dataclass(frozen=True)
class TorchVersion:
    version: str  # "2.9.1"
    series: str  # "2.9"
    released: str | None
    python: tuple[str, ...]
    index_only_python: tuple[str, ...]
    pypi_default: str | None
    variants: tuple[TorchVariant, ...]
    source: str

    @property
    def key(self) -> tuple[int, ...]:
        return version_key(self.version)

    def variant(self, name: str) -> TorchVariant | None:
        return next((v for v in self.variants if v.name == name), None)

    def pythons(self, variant: TorchVariant) -> tuple[str, ...]:
        """CPython versions with a wheel of this variant on the PyTorch index."""
        if variant.python is not None:
            return variant.python
        return self.python + self.index_only_python


@dataclass(frozen=True)
class Architecture:
    name: str
    cc_min: ComputeCapability
    cc_max: ComputeCapability
    first_driver: DriverVersion | None
    last_branch: int | None
    open_modules: bool
    needs_open: bool
    source: str

    def covers(self, cc: ComputeCapability) -> bool:
        return self.cc_min <= cc <= self.cc_max

    def drives(self, branch: int) -> bool:
        """Whether a current release of `branch` drives this architecture."""
        if self.last_branch is not None and branch > self.last_branch:
            return False
        return self.first_driver is None or branch >= self.first_driver.major


@dataclass(frozen=True)
class Branch:
    branch: int
    cuda: str
    status: str
    source: str


@dataclass(frozen=True)
class DistroBranch:
    branch: int
    version: str | None
    # The packages that install this branch where their names break the distribution's scheme
    # (Debian's nvidia-tesla-470-*, Ubuntu's -server builds); "{kflavour}" stands for the
    # kernel flavour of Canonical's prebuilt modules. Empty: the scheme's names.
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class DistroArm64:
    """What the distribution publishes for arm64 (aarch64), verified against its archive."""

    # Canonical's prebuilt modules exist for these kernel flavours on arm64 (Ubuntu); empty
    # where the scheme builds with DKMS (Debian)
    kernel_flavours: tuple[str, ...]
    not_built: tuple[tuple[int, str], ...]  # (branch, why it is not built for arm64)
    source: str


@dataclass(frozen=True)
class Distro:
    id: str
    version_id: str
    codename: str
    python: str
    scheme: str  # "ubuntu" / "debian": how package names are built
    branches: tuple[DistroBranch, ...]
    recommended_branch: int
    components: tuple[str, ...]
    headers: tuple[str, ...]
    nvidia_repo: str | None
    ga_kernel: str | None
    source: str
    arm64: DistroArm64 | None = None  # None: nothing of its archive verified for arm64
    # On a matrix for another machine than x86_64 (Matrix.for_machine): what the distribution
    # cannot give there and why (branches it does not build for that machine)
    unplanned: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.id}-{self.version_id}"

    def on_aarch64(self) -> Distro:
        """This distribution as an arm64 machine sees it: only the branches verified there."""
        if self.arm64 is None:
            return replace(
                self,
                branches=(),
                unplanned=(
                    f"no driver package of {self.label} is verified for arm64 "
                    "(egpu_setup/data/distros.yaml has no arm64 entry for it)",
                ),
            )
        gone = dict(self.arm64.not_built)
        return replace(
            self,
            branches=tuple(b for b in self.branches if b.branch not in gone),
            unplanned=tuple(
                f"driver branch {b} is not planned on {self.label} arm64: {why}"
                for b, why in self.arm64.not_built
            ),
        )


@dataclass(frozen=True)
class Derivative:
    id: str
    version: str  # VERSION_ID prefix: "21" covers 21, 21.1, 21.3
    base: str  # "ubuntu-22.04"
    source: str

    def covers(self, distro_id: str | None, version_id: str | None) -> bool:
        if distro_id != self.id or not version_id:
            return False
        return version_id == self.version or version_id.startswith(self.version + ".")


@dataclass(frozen=True)
class RepoKey:
    dirs: tuple[str, ...]
    file: str
    fingerprint: str
    source: str


@dataclass(frozen=True)
class NvidiaRepoData:
    url: str  # with {dir} and {arch}
    directories: tuple[str, ...]
    keys: tuple[RepoKey, ...]
    branches: tuple[int, ...]
    recommended_branch: int
    pinning_from_branch: int
    packages: dict[str, tuple[str, ...]]
    source: str
    arch_dirs: dict[str, str] = field(default_factory=dict)  # machine -> the tree's folder

    def key_for(self, directory: str) -> RepoKey:
        return next(k for k in self.keys if directory in k.dirs)


@dataclass(frozen=True)
class OverlayInfo:
    fetched_at: str
    index_url: str
    versions: int


MACHINES = ("x86_64", "aarch64")


@dataclass(frozen=True)
class Aarch64Row:
    """From release `since` on, which CUDA variants have a Linux aarch64 wheel (torch.yaml)."""

    since: tuple[int, ...]
    variants: tuple[str, ...] | None  # None: every variant of the release but `excluded`
    excluded: tuple[str, ...]
    arch: ArchList | None  # the aarch64 build's own arch list, where it differs
    source: str

    def has(self, variant: str) -> bool:
        if variant in self.excluded:
            return False
        return self.variants is None or variant in self.variants


@dataclass(frozen=True)
class Matrix:
    snapshot: str
    index_url: str  # with {variant}
    cuda: tuple[CudaVariant, ...]
    toolkit: tuple[ToolkitDriver, ...]
    torch: tuple[TorchVersion, ...]  # newest first
    architectures: tuple[Architecture, ...]
    branches: tuple[Branch, ...]
    open_only_from_branch: int
    open_default_from_branch: int
    distros: tuple[Distro, ...]
    known_unsupported: tuple[str, ...]
    nvidia_repo: NvidiaRepoData
    derivatives: tuple[Derivative, ...] = ()
    overlay: OverlayInfo | None = None
    notes: tuple[str, ...] = field(default=())
    aarch64: tuple[Aarch64Row, ...] = ()
    machine: str = "x86_64"  # whose wheels `torch` lists (for_machine)

    def for_machine(self, machine: str) -> Matrix:
        """This matrix with each release's variants as the Linux wheels for `machine` have them:
        x86_64 as listed; aarch64 CPU always, CUDA only where torch.yaml's `aarch64` rows say,
        with the aarch64 build's own arch list."""
        if machine == self.machine or machine == "x86_64":
            return self
        releases = []
        for t in self.torch:
            row = next((r for r in reversed(self.aarch64) if r.since <= t.key), None)
            kept = tuple(
                replace(v, arch=row.arch or v.arch) if v.name != "cpu" and row else v
                for v in t.variants
                if v.name == "cpu" or (row is not None and row.has(v.name))
            )
            releases.append(replace(t, variants=kept))
        distros = tuple(d.on_aarch64() for d in self.distros)
        return replace(self, torch=tuple(releases), machine=machine, distros=distros)

    def cuda_variant(self, name: str) -> CudaVariant | None:
        return next((c for c in self.cuda if c.variant == name), None)

    def architecture(self, cc: ComputeCapability) -> Architecture | None:
        return next((a for a in self.architectures if a.covers(cc)), None)

    def architecture_named(self, name: str) -> Architecture | None:
        low = name.lower()
        return next((a for a in self.architectures if a.name.lower() == low), None)

    def branch(self, number: int) -> Branch | None:
        return next((b for b in self.branches if b.branch == number), None)

    def distro(self, distro_id: str | None, version_id: str | None) -> Distro | None:
        return next(
            (d for d in self.distros if d.id == distro_id and d.version_id == version_id), None
        )

    def knows_distro_id(self, distro_id: str) -> bool:
        return (
            distro_id in {d.id for d in self.distros}
            or distro_id in self.known_unsupported
            or distro_id in {d.id for d in self.derivatives}
        )

    def base_of(self, distro_id: str | None, version_id: str | None) -> Derivative | None:
        """The derivative row (Linux Mint 21.3 -> ubuntu-22.04) that covers this distro, if any."""
        return next((d for d in self.derivatives if d.covers(distro_id, version_id)), None)

    def torch_version(self, version: str) -> TorchVersion | None:
        return next((t for t in self.torch if t.version == version), None)

    def index_url_for(self, variant: str) -> str:
        return self.index_url.format(variant=variant)


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


# -- loading ---------------------------------------------------------------------------------------


class _Rows:
    """Typed access to one YAML row, with errors naming the file and key path."""

    def __init__(self, file: str, path: str, row: Any):
        if not isinstance(row, dict):
            raise MatrixError(f"egpu_setup/data/{file}: {path}: expected a mapping, got {row!r}")
        self.file, self.path, self.row = file, path, row

    def fail(self, key: str, why: str) -> MatrixError:
        return MatrixError(
            f"egpu_setup/data/{self.file}: {self.path}.{key}: {why}",
            "the shipped matrix is damaged; reinstall egpu-setup",
        )

    def get(self, key: str, default: Any = ..., kind: type | tuple[type, ...] = object) -> Any:
        if key not in self.row or self.row[key] is None:
            if default is ...:
                raise self.fail(key, "missing")
            return default
        value = self.row[key]
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    def parse(self, key: str, fn: Any, default: Any = ...) -> Any:
        value = self.get(key, default)
        if value is None or value is default:
            return value
        try:
            return fn(str(value))
        except ValueError as exc:
            raise self.fail(key, str(exc)) from exc

    def source(self, inherited: str | None = None) -> str:
        src = self.row.get("source") or inherited
        if not isinstance(src, str) or not src.strip():
            raise self.fail("source", "every row needs a source")
        return src


def _load_cuda(data: dict[str, Any]) -> tuple[tuple[CudaVariant, ...], tuple[ToolkitDriver, ...]]:
    out = []
    for i, raw in enumerate(data.get("variants") or []):
        r = _Rows("cuda.yaml", f"variants[{i}]", raw)
        out.append(
            CudaVariant(
                variant=r.parse("variant", parse_variant),
                cuda=str(r.get("cuda")),
                min_driver=r.parse("min_driver", DriverVersion.from_str),
                min_driver_windows=r.parse("min_driver_windows", DriverVersion.from_str),
                source=r.source(),
            )
        )
    toolkit = []
    for i, raw in enumerate(data.get("toolkit_drivers") or []):
        r = _Rows("cuda.yaml", f"toolkit_drivers[{i}]", raw)
        toolkit.append(
            ToolkitDriver(
                str(r.get("cuda")), r.parse("min_driver", DriverVersion.from_str), r.source()
            )
        )
    return tuple(out), tuple(toolkit)


def _python_list(r: _Rows, key: str) -> tuple[str, ...]:
    values = r.get(key, [], kind=list)
    try:
        return tuple(str(PythonVersion.from_str(str(v))) for v in values)
    except ValueError as exc:
        raise r.fail(key, str(exc)) from exc


def _load_torch(data: dict[str, Any]) -> tuple[TorchVersion, ...]:
    rows: list[TorchVersion] = []
    for i, raw in enumerate(data.get("releases") or []):
        r = _Rows("torch.yaml", f"releases[{i}]", raw)
        source = r.source()
        variants = []
        for name, vraw in (r.get("variants", kind=dict)).items():
            vr = _Rows("torch.yaml", f"releases[{i}].variants.{name}", vraw)
            vname = parse_variant(str(name))
            status = vr.get("status", kind=str)
            if status not in ("stable", "experimental"):
                raise vr.fail("status", f"expected stable or experimental, got {status!r}")
            arch = vr.parse("arch", ArchList.from_str, None)
            if vname != "cpu" and arch is None:
                raise vr.fail("arch", "a CUDA variant needs its compiled arch list")
            variants.append(TorchVariant(vname, status, arch, vr.source(source)))
        series = str(r.get("series"))
        for version in r.get("versions", kind=list):
            version = str(version)
            if not version.startswith(series + "."):
                raise r.fail("versions", f"{version} is not in series {series}")
            rows.append(
                TorchVersion(
                    version=version,
                    series=series,
                    released=str(r.get("released", None) or "") or None,
                    python=_python_list(r, "python"),
                    index_only_python=_python_list(r, "index_only_python"),
                    pypi_default=r.parse("pypi_default", parse_variant, None),
                    variants=tuple(variants),
                    source=source,
                )
            )
    rows.sort(key=lambda t: t.key, reverse=True)
    return tuple(rows)


def _load_drivers(data: dict[str, Any]) -> tuple[tuple[Architecture, ...], tuple[Branch, ...]]:
    archs = []
    for i, raw in enumerate(data.get("architectures") or []):
        r = _Rows("drivers.yaml", f"architectures[{i}]", raw)
        cc = _Rows(
            "drivers.yaml", f"architectures[{i}].compute_capability", r.get("compute_capability")
        )
        archs.append(
            Architecture(
                name=r.get("name", kind=str),
                cc_min=cc.parse("min", ComputeCapability.from_str),
                cc_max=cc.parse("max", ComputeCapability.from_str),
                first_driver=r.parse("first_driver", DriverVersion.from_str, None),
                last_branch=r.get("last_branch", None, kind=int),
                open_modules=bool(r.get("open_modules", kind=bool)),
                needs_open=bool(r.get("needs_open", kind=bool)),
                source=r.source(),
            )
        )
    branches = []
    for i, raw in enumerate(data.get("branches") or []):
        r = _Rows("drivers.yaml", f"branches[{i}]", raw)
        branches.append(
            Branch(
                r.get("branch", kind=int), str(r.get("cuda")), r.get("status", kind=str), r.source()
            )
        )
    return tuple(archs), tuple(branches)


def _load_derivatives(data: dict[str, Any], distros: tuple[Distro, ...]) -> tuple[Derivative, ...]:
    out = []
    labels = {d.label for d in distros}
    for i, raw in enumerate(data.get("derivatives") or []):
        r = _Rows("distros.yaml", f"derivatives[{i}]", raw)
        base = r.get("base", kind=str)
        if base not in labels:
            raise r.fail("base", f"{base!r} is not a distro in this file")
        out.append(Derivative(r.get("id", kind=str), str(r.get("version")), base, r.source()))
    return tuple(out)


def _load_arm64(i: int, raw: object, branches: set[int]) -> DistroArm64 | None:
    if raw is None:
        return None
    r = _Rows("distros.yaml", f"distros[{i}].arm64", raw)
    not_built = []
    for j, nraw in enumerate(r.get("not_built", [], kind=list)):
        nr = _Rows("distros.yaml", f"distros[{i}].arm64.not_built[{j}]", nraw)
        branch = nr.get("branch", kind=int)
        if branch not in branches:
            raise nr.fail("branch", f"branch {branch} is not one of this distribution's")
        not_built.append((branch, nr.get("why", kind=str)))
    return DistroArm64(tuple(r.get("kernel_flavours", [], kind=list)), tuple(not_built), r.source())


def _load_distros(data: dict[str, Any]) -> tuple[tuple[Distro, ...], NvidiaRepoData]:
    distros = []
    for i, raw in enumerate(data.get("distros") or []):
        r = _Rows("distros.yaml", f"distros[{i}]", raw)
        scheme = r.get("scheme", kind=str)
        if scheme not in ("ubuntu", "debian"):
            raise r.fail("scheme", f"expected ubuntu or debian, got {scheme!r}")
        branches = []
        for j, braw in enumerate(r.get("branches", kind=list)):
            br = _Rows("distros.yaml", f"distros[{i}].branches[{j}]", braw)
            version = br.parse("version", DriverVersion.from_str, None)
            if br.get("packages", None) is not None:
                br.source()  # names outside the scheme need their own evidence
            branches.append(
                DistroBranch(
                    br.get("branch", kind=int),
                    str(braw["version"]) if version else None,
                    tuple(br.get("packages", [], kind=list)),
                )
            )
        distros.append(
            Distro(
                id=r.get("id", kind=str),
                version_id=str(r.get("version_id")),
                codename=r.get("codename", kind=str),
                python=str(r.parse("python", PythonVersion.from_str)),
                scheme=scheme,
                branches=tuple(branches),
                recommended_branch=r.get("recommended_branch", kind=int),
                components=tuple(r.get("components", [], kind=list)),
                headers=tuple(r.get("headers", [], kind=list)),
                nvidia_repo=r.get("nvidia_repo", None, kind=str),
                ga_kernel=str(r.get("ga_kernel", "")) or None,
                source=r.source(),
                arm64=_load_arm64(i, raw.get("arm64"), {b.branch for b in branches}),
            )
        )
    rr = _Rows("distros.yaml", "nvidia_repo", data.get("nvidia_repo"))
    keys = []
    for i, kraw in enumerate(rr.get("keys", kind=list)):
        kr = _Rows("distros.yaml", f"nvidia_repo.keys[{i}]", kraw)
        fpr = kr.get("fingerprint", kind=str)
        if len(fpr) != 40 or any(c not in "0123456789ABCDEF" for c in fpr):
            raise kr.fail("fingerprint", "expected a full 40-hex-digit upper-case fingerprint")
        keys.append(
            RepoKey(tuple(kr.get("dirs", kind=list)), kr.get("file", kind=str), fpr, kr.source())
        )
    packages = {k: tuple(v) for k, v in rr.get("packages", kind=dict).items()}
    repo = NvidiaRepoData(
        url=rr.get("url", kind=str),
        directories=tuple(rr.get("directories", kind=list)),
        keys=tuple(keys),
        branches=tuple(rr.get("branches", kind=list)),
        recommended_branch=rr.get("recommended_branch", kind=int),
        pinning_from_branch=rr.get("pinning_from_branch", kind=int),
        packages=packages,
        source=rr.source(),
        arch_dirs={str(k): str(v) for k, v in rr.get("arch_dirs", kind=dict).items()},
    )
    return tuple(distros), repo


def _load_aarch64(data: dict[str, Any]) -> tuple[Aarch64Row, ...]:
    rows = []
    for i, raw in enumerate(data.get("aarch64") or []):
        r = _Rows("torch.yaml", f"aarch64[{i}]", raw)
        variants = r.get("variants", kind=(list, str))
        if isinstance(variants, str) and variants != "all":
            raise r.fail("variants", f"expected a list or 'all', got {variants!r}")
        rows.append(
            Aarch64Row(
                since=version_key(r.get("from", kind=str)),
                variants=None if variants == "all" else tuple(map(parse_variant, variants)),
                excluded=tuple(map(parse_variant, r.get("except", [], kind=list))),
                arch=r.parse("arch", ArchList.from_str, None),
                source=r.source(),
            )
        )
    if [r.since for r in rows] != sorted(r.since for r in rows):
        raise MatrixError(
            "egpu_setup/data/torch.yaml: aarch64: rows must be in release order",
            "the shipped matrix is damaged; reinstall egpu-setup",
        )
    return tuple(rows)


def pip_temp_bytes(cpu: bool) -> int:
    """What pip holds in its temporary directory while it installs a CPU (or a CUDA) torch with
    its dependencies: torch.yaml's `pip_temp`, measured and derived there."""
    key = "cpu_bytes" if cpu else "cuda_bytes"
    value = (load_data("torch.yaml").get("pip_temp") or {}).get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise MatrixError(
            f"egpu_setup/data/torch.yaml: pip_temp.{key}: {value!r} is not a number of bytes",
            "the shipped matrix is damaged; reinstall egpu-setup",
        )
    return value


@functools.lru_cache(maxsize=1)
def load_snapshot() -> Matrix:
    """The matrix as shipped inside the package (no overlay)."""
    cuda_data = load_data("cuda.yaml")
    torch_data = load_data("torch.yaml")
    drivers_data = load_data("drivers.yaml")
    distros_data = load_data("distros.yaml")
    cuda, toolkit = _load_cuda(cuda_data)
    archs, branches = _load_drivers(drivers_data)
    distros, repo = _load_distros(distros_data)
    return Matrix(
        snapshot=str(torch_data.get("snapshot")),
        index_url=str(torch_data.get("index_url")),
        cuda=cuda,
        toolkit=toolkit,
        torch=_load_torch(torch_data),
        architectures=archs,
        branches=branches,
        open_only_from_branch=int(drivers_data["open_only_from_branch"]),
        open_default_from_branch=int(drivers_data["open_default_from_branch"]),
        distros=distros,
        known_unsupported=tuple(distros_data.get("known_unsupported") or ()),
        nvidia_repo=repo,
        derivatives=_load_derivatives(distros_data, distros),
        aarch64=_load_aarch64(torch_data),
    )


def load_matrix(state_dir: str | None = None, *, use_overlay: bool = True) -> Matrix:
    """The shipped snapshot plus the overlay `matrix update` cached under the state dir, if any."""
    snapshot = load_snapshot()
    if not use_overlay:
        return snapshot
    from egpu_setup.compat.overlay import load_overlay

    overlay = load_overlay(state_dir)
    return apply_overlay(snapshot, overlay) if overlay else snapshot


MATRIX_CHOICES = ("shipped", "updated")


def select_matrix(choice: str = "shipped", state_dir: str | None = None) -> Matrix:
    """The matrix an install, a resolve or a bundle decides with: the shipped snapshot, or with
    `updated` the snapshot plus the overlay of the last `matrix update` (UsageError when there
    is none: silently deciding with the snapshot instead would not be what was asked)."""
    if choice not in MATRIX_CHOICES:
        raise UsageError(f"--matrix {choice!r}: expected shipped or updated")
    if choice == "shipped":
        return load_snapshot()
    from egpu_setup.compat.overlay import load_overlay, overlay_path

    overlay = load_overlay(state_dir)
    if overlay is None:
        raise UsageError(
            f"--matrix updated: no usable updated matrix at {overlay_path(state_dir)}",
            "run `egpu-setup matrix update` first, or leave --matrix out for the shipped snapshot",
        )
    return apply_overlay(load_snapshot(), overlay)


# -- the overlay from the live index ---------------------------------------------------------------


def apply_overlay(matrix: Matrix, overlay: dict[str, Any]) -> Matrix:
    """Apply what the live index says exists ({version: {variant: [python, ...]}}) to the snapshot.

    The index is the authority on *which* wheels exist; the snapshot stays the authority on arch
    lists and statuses. A variant the snapshot does not know inherits its arch list from the newest
    older release that had it (marked [inferred]); one with no such release, or whose CUDA has no
    driver floor in cuda.yaml, is not usable and is skipped (listed in `notes`)."""
    seen: dict[str, dict[str, list[str]]] = overlay.get("releases") or {}
    notes: list[str] = []
    known_cuda = {c.variant for c in matrix.cuda} | {"cpu"}
    by_version = {t.version: t for t in matrix.torch}
    out: list[TorchVersion] = []
    for version in sorted(set(by_version) | set(seen), key=version_key, reverse=True):
        base = by_version.get(version)
        wheels = seen.get(version)
        if wheels is None:  # the index does not list it: keep the snapshot row
            out.append(base)  # type: ignore[arg-type]
            continue
        variants = []
        for name in sorted(wheels):
            pythons = tuple(sorted(wheels[name], key=lambda p: PythonVersion.from_str(p)))
            if name not in known_cuda:
                notes.append(
                    f"torch {version}+{name}: no driver floor for {name} in cuda.yaml; skipped"
                )
                continue
            mine = base.variant(name) if base else None
            if mine is None:
                mine = _inherit_variant(matrix.torch, version, name)
                if mine is None:
                    notes.append(f"torch {version}+{name}: arch list unknown; skipped")
                    continue
            variants.append(replace(mine, python=pythons))
        if base is not None:
            out.append(replace(base, variants=tuple(variants)))
        else:
            pys = sorted({p for ps in wheels.values() for p in ps}, key=PythonVersion.from_str)
            out.append(
                TorchVersion(
                    version=version,
                    series=".".join(version.split(".")[:2]),
                    released=None,
                    python=tuple(pys),
                    index_only_python=(),
                    pypi_default=None,
                    variants=tuple(variants),
                    source=f"PyTorch wheel index {overlay.get('index_url')} "
                    f"({overlay.get('fetched_at')})",
                )
            )
    info = OverlayInfo(
        fetched_at=str(overlay.get("fetched_at")),
        index_url=str(overlay.get("index_url")),
        versions=len(seen),
    )
    return replace(matrix, torch=tuple(out), overlay=info, notes=tuple(notes))


def _inherit_variant(
    snapshot: tuple[TorchVersion, ...], version: str, name: str
) -> TorchVariant | None:
    key = version_key(version)
    for row in snapshot:  # newest first: the first older release with this variant
        if row.key < key and (v := row.variant(name)) is not None:
            return replace(
                v,
                status="experimental"
                if row.series != ".".join(version.split(".")[:2])
                else v.status,
                source=f"seen on the PyTorch index; arch list [inferred] from torch {row.version}",
            )
    return None
