"""The AMD facts of egpu_setup/data/rocm.yaml as typed values: GPU -> gfx target, the gfx targets
each torch ROCm wheel was built for, HSA_OVERRIDE_GFX_VERSION stand-ins, firmware packages.

Validated on load: a row that breaks the shape is a MatrixError naming the file and the row."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from egpu_setup.compat import shipped
from egpu_setup.compat.matrix import version_key
from egpu_setup.errors import MatrixError

AMD_VENDOR = "1002"
_FILE = "rocm.yaml"
_GFX = re.compile(r"gfx[0-9a-f]{3,4}")
_VARIANT = re.compile(r"rocm\d+\.\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Family:
    key: str  # "rdna3"
    name: str  # "RDNA 3"
    needs_atomics: bool  # KFD skips the GPU when the PCIe path rejects atomics
    source: str


@dataclass(frozen=True)
class AmdGpu:
    device_id: str  # "744c"
    name: str
    gfx: str  # "gfx1100"
    family: Family
    official: bool  # AMD lists the card as supported on Linux
    source: str


@dataclass(frozen=True)
class RocmVariant:
    name: str  # "rocm7.2"
    gfx: tuple[str, ...]  # PYTORCH_ROCM_ARCH of the wheel
    glibc: str | None  # the manylinux floor, None where unknown


@dataclass(frozen=True)
class RocmSeries:
    series: str  # "2.13"
    variants: tuple[RocmVariant, ...]  # oldest ROCm first: the last is RELEASE.md's stable one
    source: str


@dataclass(frozen=True)
class Override:
    gfx: str  # the GPU's own target, "gfx1032"
    value: str  # HSA_OVERRIDE_GFX_VERSION, "10.3.0"
    as_gfx: str  # the target it makes the runtime report, "gfx1030"
    source: str


@dataclass(frozen=True)
class Firmware:
    distro: str
    package: str
    component: str | None  # the apt component it lives in (Debian: non-free-firmware)
    source: str


@dataclass(frozen=True)
class FirmwareGap:
    distro: str
    version: str
    gfx: tuple[str, ...]
    fix: str
    source: str


@dataclass(frozen=True)
class RocmData:
    snapshot: str
    index_url: str
    families: tuple[Family, ...]
    gpus: tuple[AmdGpu, ...]
    wheels: tuple[RocmSeries, ...]
    overrides: tuple[Override, ...]
    firmware: tuple[Firmware, ...]
    firmware_gaps: tuple[FirmwareGap, ...]

    def gpu(self, device_id: str) -> AmdGpu | None:
        return next((g for g in self.gpus if g.device_id == device_id.lower()), None)

    def gpu_named(self, text: str) -> AmdGpu | None:
        """A card by (part of) its name: "RX 7900 XTX", "W7900", "9070 XT"."""
        want = _norm(text)
        if not want:
            return None
        for g in self.gpus:
            for part in _name_parts(g.name):
                if want == _norm(part):
                    return g
        return None

    def series(self, series: str) -> RocmSeries | None:
        return next((s for s in self.wheels if s.series == series), None)

    def override(self, gfx: str) -> Override | None:
        return next((o for o in self.overrides if o.gfx == gfx), None)

    def firmware_for(self, distro_id: str | None) -> Firmware | None:
        return next((f for f in self.firmware if f.distro == distro_id), None)

    def firmware_gap(
        self, distro_id: str | None, version: str | None, gfx: str
    ) -> FirmwareGap | None:
        return next(
            (
                g
                for g in self.firmware_gaps
                if g.distro == distro_id
                and version is not None
                and gfx in g.gfx
                and (version == g.version or version.startswith(g.version + "."))
            ),
            None,
        )

    def index_url_for(self, variant: str) -> str:
        return self.index_url.format(variant=variant)


def _norm(text: str) -> str:
    """A card name without its brand words: "AMD Radeon RX 7900 XTX" -> "7900xtx"."""
    words = [w for w in text.lower().split() if w not in ("amd", "radeon", "rx", "pro")]
    return re.sub(r"[^0-9a-z]", "", "".join(words))


def _name_parts(name: str) -> list[str]:
    """ "Radeon RX 7900 XT/7900 XTX" -> ["Radeon RX 7900 XT", "Radeon RX 7900 XTX"]."""
    first, *rest = name.split("/")
    m = re.match(r"(.*?)(?=\d)", first)
    prefix = m.group(1) if m else ""
    return [first] + [f"{prefix}{r}" for r in rest]


def _row(row: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(row, dict) or any(k not in row for k in keys):
        raise MatrixError(
            f"egpu_setup/data/{_FILE}: {where} needs {', '.join(keys)}",
            "reinstall egpu-setup (in a checkout: python scripts/compile_data.py)",
        )
    return row


def _gfx(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _GFX.fullmatch(value):
        raise MatrixError(f"egpu_setup/data/{_FILE}: {where}: {value!r} is not a gfx target")
    return value


@functools.cache
def load_rocm() -> RocmData:
    """The shipped AMD data, validated (MatrixError naming the row that breaks the shape)."""
    d = shipped.load(_FILE)
    families = {
        key: Family(key, str(f["name"]), bool(f["needs_atomics"]), str(f["source"]))
        for key, raw in (d.get("families") or {}).items()
        if (f := _row(raw, f"families.{key}", ("name", "needs_atomics", "source")))
    }
    gpus = []
    for i, raw in enumerate(d.get("gpus") or ()):
        r = _row(raw, f"gpus[{i}]", ("device_id", "name", "gfx", "family", "official", "source"))
        if r["family"] not in families:
            raise MatrixError(f"egpu_setup/data/{_FILE}: gpus[{i}]: unknown family {r['family']}")
        gpus.append(
            AmdGpu(
                str(r["device_id"]).lower(),
                str(r["name"]),
                _gfx(r["gfx"], f"gpus[{i}].gfx"),
                families[r["family"]],
                bool(r["official"]),
                str(r["source"]),
            )
        )
    wheels = []
    for i, raw in enumerate(d.get("wheels") or ()):
        r = _row(raw, f"wheels[{i}]", ("series", "variants", "source"))
        variants = []
        for name, v in r["variants"].items():
            if not _VARIANT.fullmatch(name):
                raise MatrixError(f"egpu_setup/data/{_FILE}: wheels[{i}]: {name!r} is no variant")
            v = _row(v, f"wheels[{i}].{name}", ("gfx", "glibc"))
            gfx = tuple(_gfx(g, f"wheels[{i}].{name}.gfx") for g in v["gfx"])
            variants.append(RocmVariant(name, gfx, v["glibc"]))
        variants.sort(key=lambda v: version_key(v.name.removeprefix("rocm")))
        wheels.append(RocmSeries(str(r["series"]), tuple(variants), str(r["source"])))
    overrides = tuple(
        Override(_gfx(r["gfx"], where), str(r["value"]), _gfx(r["as"], where), str(r["source"]))
        for i, raw in enumerate(d.get("overrides") or ())
        if (r := _row(raw, (where := f"overrides[{i}]"), ("gfx", "value", "as", "source")))
    )
    firmware = tuple(
        Firmware(str(r["distro"]), str(r["package"]), r["component"], str(r["source"]))
        for i, raw in enumerate(d.get("firmware") or ())
        if (r := _row(raw, f"firmware[{i}]", ("distro", "package", "component", "source")))
    )
    gaps = tuple(
        FirmwareGap(
            str(r["distro"]), str(r["version"]), tuple(r["gfx"]), str(r["fix"]), str(r["source"])
        )
        for i, raw in enumerate(d.get("firmware_gaps") or ())
        if (r := _row(raw, f"firmware_gaps[{i}]", ("distro", "version", "gfx", "fix", "source")))
    )
    return RocmData(
        str(d["snapshot"]),
        str(d["index_url"]),
        tuple(families.values()),
        tuple(gpus),
        tuple(wheels),
        overrides,
        firmware,
        gaps,
    )
