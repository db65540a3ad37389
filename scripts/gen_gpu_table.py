"""Generate egpu_setup/data/gpus.yaml, the NVIDIA GPU table, from public sources.

Inputs (all in scripts/gpu_table/):
  pci.ids-nvidia.txt   the vendor 10de section of pci.ids, verbatim from a Debian pci.ids package:
                       every device id with its chip codename and name;
  architectures.yaml   codename -> architecture -> compute capability, each rule checked against
                       NVIDIA's CUDA GPU lists (developer.nvidia.com/cuda-gpus, /cuda-legacy-gpus);
                       the name series rules; the codenames no rule maps, with the reason;
  overlay.yaml         hand-curated facts pci.ids lacks (memory, TFLOPS, aliases, display names).

    python scripts/gen_gpu_table.py           # rewrite egpu_setup/data/gpus.yaml
    python scripts/gen_gpu_table.py --check   # exit 1 when the committed table is stale

Every GPU row (the Tesla architecture's G80 and newer; the GPU function only: no HDMI audio,
USB-C, NVSwitch or bridge ids) becomes one row per device id; a Maxwell-or-newer row whose
codename no rule maps fails the run unless architectures.yaml lists the codename as unresolved.
Id ranges for ids newer than the snapshot are derived from the rows: consecutive ids of one
architecture and compute capability.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from egpu_setup.compat.gpus import _canonical as canonical  # noqa: E402  (the loader's own notion)

INPUTS = ROOT / "scripts" / "gpu_table"
OUTPUT = ROOT / "egpu_setup" / "data" / "gpus.yaml"

# Chip families with a CUDA compute capability: Tesla (G8x, G9x, GT2xx) and newer. The NV-era
# chips before them have none; torch 2.x itself runs on Maxwell (5.0) and newer.
GPU_FAMILY = re.compile(r"^(?:G[89]\d|GT2\d\d|(?:GF|GK|GM|GP|GV|TU|GA|AD|GH|GB|GN|GR)\d)")
MAXWELL_AND_NEWER = re.compile(r"^(?:GM|GP|GV|TU|GA|AD|GH|GB|GN|GR)\d")
_DEVICE = re.compile(r"^\t([0-9a-f]{4})  (.+?)\s*$")
# "Laptop GPU", "Mobile", "Max-Q", and the laptop-only numbering: "940MX", "MX150", "GT 750M".
_MOBILE_NAME = re.compile(r"\b(?:laptop|mobile|max[\s-]?q|\d{3,4}MX?|MX\d{3})\b", re.I)


@dataclass
class Row:
    id: str
    name: str
    codename: str
    architecture: str | None = None
    cc: str | None = None
    mobile: bool = False
    aliases: list[str] = field(default_factory=list)
    memory_gib: float | None = None
    fp32: float | None = None
    fp16: float | None = None
    src: list[str] = field(default_factory=lambda: ["pciids", "cuda-gpus"])


def pciids_devices(text: str) -> list[tuple[str, str]]:
    """(device id, name) for every device line of the vendor section (subsystems skipped)."""
    out = []
    for line in text.splitlines():
        m = _DEVICE.match(line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def split_name(name: str) -> tuple[str, str]:
    """'AD103M / GN21-X11 [GeForce RTX 4090 Laptop GPU]' -> ('AD103M', 'GeForce RTX 4090 Laptop
    GPU'); a name without brackets ('GB112', 'TU117GL') is its own codename and name."""
    codename = re.split(r"[\s\[/(]", name, maxsplit=1)[0]
    m = re.search(r"\[([^\]]+)\]\s*$", name)
    return codename, (m.group(1).strip() if m else name)


def _rule(codename: str, rules: list[dict[str, Any]]) -> dict[str, Any] | None:
    up = codename.upper()
    return next((r for r in rules if re.match(r["pattern"], up)), None)


def is_mobile(codename: str, name: str) -> bool:
    # pci.ids marks laptop dies with an M suffix (GA104M, TU117BM, AD104GLM); names say "Mobile",
    # "Max-Q" or "Laptop GPU" (some rows, e.g. "GA104 [Geforce RTX 3070 Ti Laptop GPU]").
    return codename.upper().endswith("M") or bool(_MOBILE_NAME.search(name))


def build(section: str, arch: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """The table as data (what gpus.yaml holds); ValueError for an unmapped or conflicting row."""
    not_gpu = re.compile(arch["not_gpu"])
    rules = arch["codenames"]
    unresolved = arch.get("unresolved") or []
    rows: dict[str, Row] = {}
    problems = []
    for device_id, full in pciids_devices(section):
        codename, name = split_name(full)
        if not GPU_FAMILY.match(codename.upper()) or not_gpu.search(full):
            continue
        rule = _rule(codename, rules)
        if rule is None:
            if MAXWELL_AND_NEWER.match(codename.upper()) and not _rule(codename, unresolved):
                problems.append(f"{device_id} {full!r}: no codename rule maps {codename}")
            rows[device_id] = Row(device_id, name, codename)  # kept: it breaks id ranges
            continue
        rows[device_id] = Row(
            device_id,
            name,
            codename,
            rule["architecture"],
            str(rule["cc"]),
            mobile=is_mobile(codename, name),
        )
    for i, entry in enumerate(overlay.get("rows") or []):
        # An overlay row describes one product; its `name` is how egpu-setup spells it.
        source = entry.get("source")
        if source not in (overlay.get("sources") or {}):
            problems.append(f"overlay rows[{i}]: unknown source {source!r}")
            continue
        for device_id in entry["ids"]:
            device_id = str(device_id).lower()
            row = rows.get(device_id)
            if row is None:
                if not all(entry.get(k) for k in ("codename", "architecture", "cc")):
                    problems.append(f"overlay {device_id}: not in pci.ids and no codename/arch/cc")
                    continue
                row = rows[device_id] = Row(
                    device_id,
                    entry["name"],
                    entry["codename"],
                    entry["architecture"],
                    str(entry["cc"]),
                    mobile=bool(entry.get("mobile")),
                    src=[],
                )
            elif (entry.get("architecture"), str(entry.get("cc"))) != (row.architecture, row.cc):
                problems.append(
                    f"overlay {device_id} says {entry.get('architecture')} {entry.get('cc')}, "
                    f"pci.ids {row.codename!r} maps to {row.architecture} {row.cc}"
                )
                continue
            if entry.get("name") and entry["name"] != row.name:
                if canonical(entry["name"]) == canonical(row.name):
                    row.name = entry[
                        "name"
                    ]  # a spelling of the same product: "GeForce", "Laptop GPU"
                else:
                    row.aliases.append(
                        entry["name"]
                    )  # pci.ids says more ("Lite Hash Rate", "12GB")
            for alias in entry.get("aliases") or ():
                if alias not in row.aliases and alias != row.name:
                    row.aliases.append(alias)
            for key in ("memory_gib", "fp32", "fp16"):
                if entry.get(key) is not None:
                    setattr(row, key, entry[key])
            if "mobile" in entry:
                row.mobile = bool(entry["mobile"])
            row.src.append(f"overlay-{source}")
    if problems:
        raise ValueError("\n".join(problems))
    codename_only = set(arch.get("codename_only") or ())
    ordered = [
        rows[k]
        for k in sorted(rows, key=lambda k: int(k, 16))
        if rows[k].architecture not in codename_only
    ]
    return {
        "models": [r for r in ordered if r.architecture],
        "ranges": _ranges(ordered),
        "codenames": rules,
        "series": arch["series"],
    }


def _ranges(rows: list[Row]) -> list[tuple[str, str, str, str]]:
    """(first, last, architecture, cc) for each run of consecutive rows of one architecture."""
    out: list[tuple[str, str, str, str]] = []
    run: list[Row] = []

    def close() -> None:
        if len(run) >= 2 and run[0].architecture:
            out.append((run[0].id, run[-1].id, run[0].architecture, run[0].cc or ""))

    for row in rows:
        if run and (row.architecture, row.cc) != (run[0].architecture, run[0].cc):
            close()
            run = []
        run.append(row)
    close()
    return out


def _q(value: Any) -> str:
    """A YAML flow scalar, quoted so that ids like 1e04 or 2204 stay strings."""
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(table: dict[str, Any], overlay: dict[str, Any], section_header: str) -> str:
    lines = [
        "# NVIDIA GPU table: PCI device id (vendor 10de) -> name, chip codename, architecture,",
        "# compute capability. GENERATED by scripts/gen_gpu_table.py: do not edit, edit its inputs",
        "# in scripts/gpu_table/ and run it (tests/test_gpus.py checks that this file is current).",
        "# Read by egpu_setup/compat/gpus.py. Each row's `src` names its sources below.",
        "",
        "sources:",
        f"  pciids: {_q(section_header)}",
        "  cuda-gpus: "
        + _q(
            "architecture and compute capability: the row's codename through the rules below "
            "(scripts/gpu_table/architectures.yaml), each checked against "
            "https://developer.nvidia.com/cuda-gpus and https://developer.nvidia.com/cuda-legacy-gpus"
        ),
    ]
    for key, text in (overlay.get("sources") or {}).items():
        lines.append(f"  overlay-{key}: " + _q(f"scripts/gpu_table/overlay.yaml: {text}"))
    lines.append(
        "  ranges: "
        + _q(
            "derived by scripts/gen_gpu_table.py: a run of consecutive pci.ids rows of one "
            "architecture and compute capability (for ids newer than the snapshot)"
        )
    )
    lines += [
        "",
        "# One row per device id, one line per row (a literal block, so the table loads in a few",
        "# milliseconds on detect's path): the columns below separated by '|'; '-' is none;",
        "# mobile is 'y' for a laptop part; src lists keys of `sources`; aliases split on ';'.",
        "columns: [id, codename, architecture, cc, mobile, memory_gib, fp32, fp16, src, name, "
        "aliases]",
        "models: |",
    ]
    width = max(len(r.codename) for r in table["models"])
    for r in table["models"]:
        for text in (r.name, *r.aliases):
            if "|" in text or ";" in text or "\n" in text:
                raise ValueError(f"{r.id}: a name with '|' or ';' cannot be written: {text!r}")
        cells = [
            r.id,
            r.codename.ljust(width),
            (r.architecture or "").ljust(12),
            (r.cc or "").ljust(4),
            "y" if r.mobile else "-",
            *(
                ("-" if getattr(r, k) is None else f"{getattr(r, k):g}").ljust(5)
                for k in ("memory_gib", "fp32", "fp16")
            ),
            ",".join(r.src).ljust(30),
            r.name,
        ]
        line = " | ".join(cells)
        if r.aliases:
            line += " | " + "; ".join(r.aliases)
        lines.append("  " + line)
    lines += [
        "",
        "# Chip codename -> (architecture, cc), matched at the start of a codename token.",
        "codenames:",
    ]
    for c in table["codenames"]:
        lines.append(
            f"  - {{pattern: {_q(c['pattern'])}, architecture: {_q(c['architecture'])}, "
            f"cc: {_q(c['cc'])}, source: {_q('cuda-gpus: ' + c['verified_by'])}}}"
        )
    lines += [
        "",
        "# Marketing names -> (architecture, cc) for names the table lacks; first match wins.",
        "series:",
    ]
    for s in table["series"]:
        lines.append(
            f"  - {{pattern: {_q(s['pattern'])}, architecture: {_q(s['architecture'])}, "
            f"cc: {_q(s['cc'])}, source: {_q(s['source'])}}}"
        )
    lines += ["", "# Device id ranges -> (architecture, cc) for ids not in `models`.", "id_ranges:"]
    for first, last, arch, cc in table["ranges"]:
        lines.append(
            f"  - {{first: {_q(first)}, last: {_q(last)}, architecture: {_q(arch)}, cc: {_q(cc)}, "
            "source: ranges}"
        )
    return "\n".join(lines) + "\n"


def section_source(section: str) -> str:
    """The section's own provenance: pci.ids version plus the egpu-setup source note."""
    version = re.search(r"^#\s*Version:\s*(\S+)", section, re.M)
    deb = re.search(r"\b(0\.0~[0-9.]+-\d+)\b", section)
    return (
        f"pci.ids {version.group(1) if version else '?'} "
        f"(Debian package pci.ids {deb.group(1) if deb else '?'}), vendor 10de section kept as "
        "scripts/gpu_table/pci.ids-nvidia.txt: device id, chip codename and name"
    )


def generate() -> str:
    section = (INPUTS / "pci.ids-nvidia.txt").read_text(encoding="utf-8")
    arch = yaml.safe_load((INPUTS / "architectures.yaml").read_text(encoding="utf-8"))
    overlay = yaml.safe_load((INPUTS / "overlay.yaml").read_text(encoding="utf-8"))
    return render(build(section, arch, overlay), overlay, section_source(section))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when gpus.yaml is stale")
    args = parser.parse_args(argv)
    try:
        text = generate()
    except ValueError as exc:
        print(
            f"error: {exc}\nhint: map the codename in scripts/gpu_table/architectures.yaml "
            "or list it as unresolved",
            file=sys.stderr,
        )
        return 2
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(
                f"{OUTPUT.relative_to(ROOT)} is stale: run python scripts/gen_gpu_table.py",
                file=sys.stderr,
            )
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    rows = text.split("\nmodels: |\n", 1)[1].split("\n\n", 1)[0].count("\n") + 1
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {rows} rows")
    # The program reads the compiled form of the table: keep it in step.
    import subprocess

    argv = [sys.executable, str(ROOT / "scripts" / "compile_data.py")]
    return subprocess.run(argv, check=False).returncode  # noqa: S603 - our own script


if __name__ == "__main__":
    sys.exit(main())
