"""The glibc compatibility floor: which torch wheels a distribution's C library can load.

A Linux wheel's platform tag names the oldest glibc it needs: manylinux_2_28 needs glibc 2.28
(PEP 600), manylinux2014 2.17, manylinux2010 2.12, manylinux1 2.5. torch 2.7.0 and newer ship
only manylinux_2_28 x86_64 wheels, so Ubuntu 18.04 (glibc 2.27) or CentOS 7 (2.17) cannot
install them; pip says "No matching distribution", or "is not a supported wheel on this platform".

Data: torch.yaml `manylinux` (each release's floor, with sources) and distros.yaml `glibc` (each
distribution release's glibc, with sources). `parse_glibc_report` reads what users paste about it:
`ldd --version` (in any language), os-release, pip and uv refusing a wheel's tag, `pip debug
--verbose` tag lists, "version `GLIBC_2.28' not found". Pure and soft: unknown is None.

`distro_glibc()` is the one table of distributions' glibc: the offline bundle's wheel tags
(bundle/wheels.py) read it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from egpu_setup.compat.shipped import load as load_data
from egpu_setup.errors import MatrixError

__all__ = [
    "GlibcReport",
    "distro_glibc",
    "glibc_key",
    "parse_glibc_report",
    "tag_glibc",
    "torch_floor",
]


def glibc_key(version: str | None) -> tuple[int, int] | None:
    """ "2.28" -> (2, 28); None for anything else."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


# PEP 600 (manylinux_x_y), PEP 599 (manylinux2014 = 2.17), PEP 571 (2010 = 2.12), PEP 513 (1 = 2.5).
_LEGACY_TAGS = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}


def tag_glibc(tag: str | None) -> str | None:
    """The glibc a platform tag needs: "manylinux_2_28_x86_64" -> "2.28"; a compressed tag set
    ("manylinux_2_27_x86_64.manylinux_2_28_x86_64") needs its lowest; None for non-manylinux."""
    if not tag:
        return None
    floors = []
    for part in tag.split("."):
        m = re.match(r"manylinux_(\d+)_(\d+)_", part)
        if m:
            floors.append((int(m.group(1)), int(m.group(2))))
            continue
        legacy = re.match(r"(manylinux1|manylinux2010|manylinux2014)_", part)
        if legacy:
            floors.append(glibc_key(_LEGACY_TAGS[legacy.group(1)]))  # type: ignore[arg-type]
    if not floors:
        return None
    low = min(floors)
    return f"{low[0]}.{low[1]}"


# -- the data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Floor:
    releases: str  # a version specifier: "<2.6", "==2.6.*", ">=2.7"
    variants: tuple[str, ...]  # () for every variant
    machine: str  # "x86_64" or "aarch64": the wheels' CPU architecture
    glibc: str
    tag: str
    source: str


def _read(name: str) -> dict[str, Any]:
    return load_data(name)


def _damaged(file: str, where: str, why: str) -> MatrixError:
    return MatrixError(
        f"egpu_setup/data/{file}: {where}: {why}", "the shipped matrix is damaged; reinstall"
    )


@lru_cache(maxsize=1)
def _floors() -> tuple[Floor, ...]:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    out = []
    for i, row in enumerate(_read("torch.yaml").get("manylinux") or []):
        where = f"manylinux[{i}]"
        if not isinstance(row, dict) or not all(
            row.get(k) for k in ("releases", "glibc", "source")
        ):
            raise _damaged("torch.yaml", where, "needs releases, glibc and source")
        try:
            SpecifierSet(str(row["releases"]))
        except InvalidSpecifier as exc:
            raise _damaged("torch.yaml", where, f"releases: {exc}") from exc
        if glibc_key(str(row["glibc"])) is None:
            raise _damaged("torch.yaml", where, f"glibc {row['glibc']!r} is not x.y")
        if row.get("machine", "x86_64") not in ("x86_64", "aarch64"):
            raise _damaged("torch.yaml", where, f"machine {row['machine']!r} is not x86_64/aarch64")
        out.append(
            Floor(
                str(row["releases"]),
                tuple(str(v) for v in row.get("variants") or ()),
                str(row.get("machine") or "x86_64"),
                str(row["glibc"]),
                str(row.get("tag") or ""),
                str(row["source"]),
            )
        )
    return tuple(out)


@lru_cache(maxsize=1)
def _distros() -> dict[tuple[str, str], tuple[str, str]]:
    out = {}
    for i, row in enumerate(_read("distros.yaml").get("glibc") or []):
        if not isinstance(row, dict) or not all(row.get(k) for k in ("id", "version_id", "glibc")):
            raise _damaged("distros.yaml", f"glibc[{i}]", "needs id, version_id and glibc")
        if not row.get("source"):
            raise _damaged("distros.yaml", f"glibc[{i}]", "every row needs a source")
        out[(str(row["id"]), str(row["version_id"]))] = (str(row["glibc"]), str(row["source"]))
    return out


def torch_floor(version: str, variant: str, machine: str = "x86_64") -> Floor | None:
    """The glibc floor of torch `version`'s `variant` Linux wheels for `machine` ("x86_64",
    "aarch64"), or None if unknown."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return None
    for floor in _floors():
        if floor.machine != machine:
            continue
        if floor.variants and variant not in floor.variants:
            continue
        if _specifier(floor.releases).contains(v, prereleases=True):
            return floor
    return None


@lru_cache(maxsize=64)  # the resolver asks for every candidate wheel: parse each range once
def _specifier(text: str) -> Any:  # packaging.specifiers.SpecifierSet, imported on first use
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(text)


def distro_glibc(distro_id: str | None, version_id: str | None) -> tuple[str, str] | None:
    """(glibc, source) of a distribution release: ("ubuntu", "18.04") -> ("2.27", ...). A point
    release falls back to its major ("8.10" -> "8", "24.04.1" -> "24.04")."""
    if not distro_id or not version_id:
        return None
    table = _distros()
    version = version_id
    while version:
        found = table.get((distro_id, version))
        if found:
            return found
        version = version.rpartition(".")[0]
    return None


# -- what users paste ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GlibcReport:
    """What a paste says about the host's C library and the wheel it could not install."""

    glibc: str | None = None  # the host's glibc: ldd's, else the newest manylinux tag it accepts
    distro: str | None = None  # "ubuntu-18.04", "centos-7", "kylin"
    wheel_tag: str | None = None  # the refused or available wheel's platform tag
    torch: str | None = None  # the torch version the paste asks for or names in a wheel
    host_max_tag: str | None = None  # the newest manylinux tag the installer says the host takes
    required_glibc: str | None = None  # from "version `GLIBC_2.28' not found"
    variant: str | None = None  # the index the paste installs from: ".../whl/cu118" -> "cu118"
    python: str | None = None  # "3.11" ("Using Python 3.11.13", "cp310" in a wheel name)

    @property
    def host_glibc(self) -> str | None:
        return self.glibc


# "ldd (Ubuntu GLIBC 2.27-3ubuntu1.6) 2.27", "ldd (GNU libc) 2.17", "ldd (Debian GLIBC 2.28-10)
# 2.28": the banner's first line is not translated, the copyright lines below it are.
_LDD_RE = re.compile(
    r"^ldd \((?:GNU libc|(?P<vendor>[\w ]+?) GLIBC (?P<package>\S+))\) (?P<version>\d+\.\d+)", re.M
)
_OS_RELEASE_RE = re.compile(r'^(?P<key>ID|VERSION_ID)="?(?P<value>[^"\n]*)"?\s*$', re.M)
_DOCKER_RE = re.compile(
    r"docker run\b[^\n]*?\b(?P<image>centos|debian|ubuntu|fedora):(?P<tag>[\w.-]+)"
)
_DEBIAN_CODENAMES = {
    "stretch": "9",
    "buster": "10",
    "bullseye": "11",
    "bookworm": "12",
    "trixie": "13",
}
# A word that may be a wheel's file name; packaging.utils.parse_wheel_filename decides (the wheel
# file name convention, https://packaging.python.org/en/latest/specifications/binary-distribution-format/).
_WHEEL_WORD_RE = re.compile(r"[\w.+!-]+\.whl\b")
_UV_HOST_RE = re.compile(r"no wheels with a matching platform tag \(e\.g\., `(?P<tag>[^`]+)`\)")
_UV_AVAILABLE_RE = re.compile(
    r"Wheels are available for `(?P<name>[\w-]+)` \(v(?P<version>[^)\s]+)\) on the following "
    r"platforms: (?P<tags>(?:`[^`]+`(?:, )?)+)"
)
_REQUIREMENT_RE = re.compile(
    r"requirement torch==(?P<version>[0-9][\w.+]*)|\btorch==(?P<v2>[0-9][\w.+]*)"
)
_GLIBC_NOT_FOUND_RE = re.compile(r"version `GLIBC_(?P<version>\d+\.\d+)' not found")
_PIP_TAG_RE = re.compile(r"^\s*cp\d+-[\w]+-(?P<tag>manylinux_\d+_\d+_[a-z0-9_]+)\s*$", re.M)
_INDEX_RE = re.compile(r"/whl/(?P<variant>cu\d{3}|cpu|rocm[\d.]+)\b")
_PYTHON_RE = re.compile(r"\bPython (?P<v>3\.\d+)(?:\.\d+)?\b")


@dataclass(frozen=True)
class _WheelName:
    name: str  # canonical: "torch", "ale-py"
    version: str  # "2.7.0+cu118"
    platform: str  # the platform tags, a compressed set as PEP 425 writes it
    python: str | None  # "3.11" for a cp311 wheel


def _first_wheel(text: str) -> _WheelName | None:
    """The first valid wheel file name in `text`."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion

    for m in _WHEEL_WORD_RE.finditer(text):
        try:
            name, version, _, tags = parse_wheel_filename(m.group(0))
        except (InvalidWheelFilename, InvalidVersion):
            continue
        cpython = sorted(t.interpreter[2:] for t in tags if re.fullmatch(r"cp\d+", t.interpreter))
        python = f"{cpython[0][0]}.{cpython[0][1:]}" if cpython else None
        return _WheelName(name, str(version), ".".join(sorted({t.platform for t in tags})), python)
    return None


def _distro(text: str, ldd: re.Match[str] | None) -> str | None:
    fields = {m["key"]: m["value"] for m in _OS_RELEASE_RE.finditer(text)}
    if fields.get("ID") and fields.get("VERSION_ID"):
        return f"{fields['ID']}-{fields['VERSION_ID']}"
    docker = _DOCKER_RE.search(text)
    if docker:
        tag = docker["tag"].split("-")[0]
        tag = _DEBIAN_CODENAMES.get(tag, tag)
        return f"{docker['image']}-{tag}"
    stretch = re.search(r'^VERSION="(?P<v>\d+) \((?P<name>\w+)\)"', text, re.M)
    package = (ldd["package"] or "") if ldd else ""
    if "kylin" in package:
        return "kylin"
    deb = re.search(r"\+deb(\d+)u", package)
    if deb:
        return f"debian-{deb.group(1)}"
    if stretch and ldd and (ldd["vendor"] or "") == "Debian":
        return f"debian-{stretch['v']}"
    if ldd and ldd["vendor"] in ("Ubuntu", "Debian"):
        # The package version names the release: the one whose glibc this is.
        vendor = ldd["vendor"].lower()
        for (did, version), (glibc, _) in _distros().items():
            if did == vendor and glibc == ldd["version"]:
                return f"{did}-{version}"
    return None


def parse_glibc_report(text: str | None) -> GlibcReport:
    """The facts about glibc and wheel tags in pasted text (see the module docstring)."""
    if not isinstance(text, str) or not text.strip():
        return GlibcReport()
    ldd = _LDD_RE.search(text)
    wheel = _first_wheel(text)
    uv_host = _UV_HOST_RE.search(text)
    uv_available = _UV_AVAILABLE_RE.search(text)
    pip_tags = [m["tag"] for m in _PIP_TAG_RE.finditer(text)]
    wheel_tag = wheel.platform if wheel else None
    torch = wheel.version if wheel and wheel.name == "torch" else None
    if uv_available and not wheel_tag:
        tags = re.findall(r"`([^`]+)`", uv_available["tags"])
        wheel_tag = next((t for t in tags if t.startswith("manylinux")), None)
    requirement = _REQUIREMENT_RE.search(text)
    if torch is None and requirement:
        torch = requirement["version"] or requirement["v2"]
    host_max = uv_host["tag"] if uv_host else None
    if host_max is None and pip_tags:
        host_max = max(pip_tags, key=lambda t: glibc_key(tag_glibc(t)) or (0, 0))
    glibc = ldd["version"] if ldd else tag_glibc(host_max)
    needed = [m["version"] for m in _GLIBC_NOT_FOUND_RE.finditer(text)]
    index = _INDEX_RE.search(text)
    python = _PYTHON_RE.search(text)
    py = python["v"] if python else None
    if py is None and wheel and wheel.python:
        py = wheel.python
    return GlibcReport(
        glibc=glibc,
        distro=_distro(text, ldd),
        wheel_tag=wheel_tag,
        torch=torch,
        host_max_tag=host_max,
        required_glibc=max(needed, key=lambda v: glibc_key(v) or (0, 0)) if needed else None,
        variant=index["variant"] if index else None,
        python=py,
    )
