"""The NVIDIA GPU table: device id or name -> model, architecture, compute capability.

Data lives in egpu_setup/data/gpus.yaml (every row with its source). It is loaded on first use
and cached; importing this module reads nothing, so `egpu-setup --help` stays fast.

Lookups, most to least specific:
- gpu_by_id("2684"): the exact model;
- gpu_by_name("AD102 [GeForce RTX 4090]" / "NVIDIA GeForce RTX 4090" / "RTX A4000"): the model
  whose name (or alias) the text names;
- arch_from_text("GB202" / "GeForce RTX 5070 Ti Laptop GPU"): (architecture, cc) from a model
  name, a chip codename or a series name, for cards the table lacks;
- arch_from_device_id("2b99"): (architecture, cc) from the id ranges NVIDIA allocates per chip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from egpu_setup.errors import MatrixError

__all__ = [
    "GpuModel",
    "all_gpus",
    "arch_from_device_id",
    "arch_from_text",
    "gpu_by_id",
    "gpu_by_name",
    "is_mobile_name",
]

_DATA_FILE = "gpus.yaml"
_HEX4 = re.compile(r"^[0-9a-f]{4}$")
# "Laptop GPU", "Mobile", "Max-Q" mark a laptop part (pci.ids: "GA104M [GeForce RTX 3070 Mobile /
# Max-Q]"; nvidia-smi: "NVIDIA GeForce RTX 3070 Ti Laptop GPU").
_MOBILE_RE = re.compile(r"\b(?:laptop|mobile|max[\s-]?q)\b", re.I)
_CODENAME_RE = re.compile(
    r"\b(?P<code>(?:G[KMPVAHBN]\d{2,3}[A-Z]*|TU\d{3}[A-Z]*|AD\d{3}[A-Z]*)(?:-[A-Z0-9]+)?)", re.I
)


@dataclass(frozen=True)
class GpuModel:
    """One NVIDIA model for one PCI device id (vendor 10de)."""

    device_id: str  # "2684"
    name: str  # "GeForce RTX 4090"
    architecture: str  # "Ada Lovelace"
    compute_capability: str  # "8.9"
    codename: str | None = None  # "AD102"
    memory_gib: float | None = None
    fp32_tflops: float | None = None
    fp16_tflops: float | None = None  # non-tensor FP16
    mobile: bool = False
    source: str = ""


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    architecture: str
    cc: str


@dataclass(frozen=True)
class _Range:
    first: int
    last: int
    architecture: str
    cc: str


@dataclass(frozen=True)
class _Table:
    by_id: dict[str, GpuModel]
    by_key: dict[str, GpuModel]  # canonical name/alias -> model
    keys_longest_first: tuple[str, ...]
    codenames: tuple[_Rule, ...]
    series: tuple[_Rule, ...]
    ranges: tuple[_Range, ...]


def _canonical(text: str) -> str:
    """A comparable form of a GPU name: lower case, vendor/brand words and punctuation dropped,
    every laptop marker written "laptop" once ("Mobile / Max-Q" == "Laptop GPU")."""
    t = text.lower().replace("geforce", " ").replace("nvidia", " ").replace("corporation", " ")
    t = re.sub(r"\b(?:laptop\s+gpu|laptop|mobile|max[\s-]?q)\b", " laptop ", t)
    t = re.sub(r"[^a-z0-9]+", " ", t)
    words: list[str] = []
    for w in t.split():
        if w == "laptop" and "laptop" in words:
            continue
        words.append(w)
    if "laptop" in words:  # position-independent: "Max-Q / Mobile" vs "Mobile / Max-Q"
        words = [w for w in words if w != "laptop"] + ["laptop"]
    return " ".join(words)


# Words that may follow a model name without naming another model ("RTX 3080 Lite Hash Rate",
# "RTX 2060 Rev. A", "GTX 1080 Ti 10GB", "RTX 3060 Ti GDDR6X").
_NEUTRAL_WORDS = frozenset(
    {
        "lite",
        "hash",
        "rate",
        "lhr",
        "rev",
        "a",
        "gddr6",
        "gddr6x",
        "founders",
        "edition",
        "oc",
        "v2",
    }
)
_NEUTRAL_RE = re.compile(r"^\d+gb$")


def _field(row: dict[str, Any], key: str, where: str) -> Any:
    if key not in row:
        raise MatrixError(
            f"{_DATA_FILE}: {where}: missing key '{key}'",
            "reinstall egpu-setup; the packaged GPU table is damaged",
        )
    return row[key]


def _rules(rows: list[dict[str, Any]] | None, section: str) -> tuple[_Rule, ...]:
    out = []
    for i, row in enumerate(rows or []):
        where = f"{section}[{i}]"
        try:
            pattern = re.compile(str(_field(row, "pattern", where)), re.I)
        except re.error as exc:
            raise MatrixError(
                f"{_DATA_FILE}: {where}.pattern: {exc}", "fix the regular expression"
            ) from exc
        _field(row, "source", where)
        out.append(
            _Rule(pattern, str(_field(row, "architecture", where)), str(_field(row, "cc", where)))
        )
    return tuple(out)


def _build(data: dict[str, Any]) -> _Table:
    by_id: dict[str, GpuModel] = {}
    by_key: dict[str, GpuModel] = {}
    for i, row in enumerate(data.get("models") or []):
        where = f"models[{i}]"
        ids = _field(row, "ids", where)
        source = str(_field(row, "source", where))
        for device_id in ids:
            device_id = str(device_id).lower()
            if not _HEX4.match(device_id) or device_id in by_id:
                raise MatrixError(
                    f"{_DATA_FILE}: {where}.ids: bad or duplicate device id '{device_id}'",
                    "device ids are 4 lowercase hex digits, each listed once",
                )
            model = GpuModel(
                device_id=device_id,
                name=str(_field(row, "name", where)),
                architecture=str(_field(row, "architecture", where)),
                compute_capability=str(_field(row, "cc", where)),
                codename=row.get("codename"),
                memory_gib=row.get("memory_gib"),
                fp32_tflops=row.get("fp32"),
                fp16_tflops=row.get("fp16"),
                mobile=bool(row.get("mobile", False)),
                source=source,
            )
            by_id[device_id] = model
            for name in (model.name, *(row.get("aliases") or ())):
                by_key.setdefault(_canonical(name), model)
    ranges = []
    for i, row in enumerate(data.get("id_ranges") or []):
        where = f"id_ranges[{i}]"
        _field(row, "source", where)
        ranges.append(
            _Range(
                int(str(_field(row, "first", where)), 16),
                int(str(_field(row, "last", where)), 16),
                str(_field(row, "architecture", where)),
                str(_field(row, "cc", where)),
            )
        )
    return _Table(
        by_id=by_id,
        by_key=by_key,
        keys_longest_first=tuple(sorted(by_key, key=len, reverse=True)),
        codenames=_rules(data.get("codenames"), "codenames"),
        series=_rules(data.get("series"), "series"),
        ranges=tuple(ranges),
    )


@lru_cache(maxsize=1)
def _table() -> _Table:
    import yaml  # imported on first use: keeps CLI start-up light

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    text = resources.files("egpu_setup.data").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    data = yaml.load(text, Loader=loader)
    if not isinstance(data, dict):
        raise MatrixError(f"{_DATA_FILE}: not a mapping", "reinstall egpu-setup")
    return _build(data)


def _norm_id(device_id: str | None) -> str | None:
    if not isinstance(device_id, str):
        return None
    d = device_id.strip().lower()
    if d.startswith("0x"):
        d = d[2:]
    if ":" in d:  # "10de:2684"
        vendor, _, d = d.partition(":")
        if vendor != "10de":
            return None
    return d if _HEX4.match(d) else None


def all_gpus() -> tuple[GpuModel, ...]:
    """Every row of the table, one per device id."""
    return tuple(_table().by_id.values())


def gpu_by_id(device_id: str) -> GpuModel | None:
    """The model for an NVIDIA device id ("2684", "0x2684" or "10de:2684"), or None."""
    d = _norm_id(device_id)
    return _table().by_id.get(d) if d else None


def is_mobile_name(text: str | None) -> bool:
    """True when a name marks a laptop part ("Laptop GPU", "Mobile", "Max-Q")."""
    return bool(text and _MOBILE_RE.search(text))


def _candidates(text: str) -> list[str]:
    """The bracketed marketing names first ("AD102 [GeForce RTX 4090]"), then the whole text;
    "A / B" alternatives inside brackets are tried one by one after the whole bracket."""
    out: list[str] = []
    for inner in re.findall(r"\[([^\]]+)\]", text):
        out.append(inner)
        parts = [p for p in re.split(r"\s+/\s+", inner) if p]
        if len(parts) > 1:
            out.extend(parts)
    out.append(re.sub(r"\[[^\]]*\]", " ", text) if out else text)
    return out


def gpu_by_name(text: str) -> GpuModel | None:
    """The model a name denotes (pci.ids, lspci, nvidia-smi or marketing spelling), or None.

    A name that extends a known one only with neutral words ("Lite Hash Rate", "Rev. A",
    "12GB") matches it; one that adds "Ti", "SUPER", "D" or a laptop marker does not."""
    if not isinstance(text, str) or not text.strip():
        return None
    table = _table()
    for candidate in _candidates(text):
        key = _canonical(candidate)
        if not key:
            continue
        if key in table.by_key:
            return table.by_key[key]
        mobile = key.endswith(" laptop") or key == "laptop"
        for known in table.keys_longest_first:
            if not key.startswith(known + " "):
                continue
            model = table.by_key[known]
            rest = key[len(known) + 1 :].split()
            if mobile and not model.mobile:
                continue
            rest = [w for w in rest if w != "laptop"]
            if all(w in _NEUTRAL_WORDS or _NEUTRAL_RE.match(w) for w in rest):
                return model
    return None


def _arch_from_codename(text: str) -> tuple[str, str] | None:
    table = _table()
    for m in _CODENAME_RE.finditer(text):
        code = m.group("code").upper()
        for rule in table.codenames:
            if rule.pattern.match(code):
                return rule.architecture, rule.cc
    return None


def arch_from_text(text: str) -> tuple[str, str] | None:
    """(architecture, compute capability) from a model name, chip codename or series name."""
    if not isinstance(text, str) or not text.strip():
        return None
    model = gpu_by_name(text)
    if model is not None:
        return model.architecture, model.compute_capability
    found = _arch_from_codename(text)
    if found is not None:
        return found
    for rule in _table().series:
        if rule.pattern.search(text):
            return rule.architecture, rule.cc
    return None


def arch_from_device_id(device_id: str) -> tuple[str, str] | None:
    """(architecture, compute capability) for an NVIDIA device id: the table row, else the id
    range the chip's ids fall in, else None."""
    d = _norm_id(device_id)
    if d is None:
        return None
    table = _table()
    model = table.by_id.get(d)
    if model is not None:
        return model.architecture, model.compute_capability
    value = int(d, 16)
    for r in table.ranges:
        if r.first <= value <= r.last:
            return r.architecture, r.cc
    return None
