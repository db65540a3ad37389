"""Compile egpu_setup/data/*.yaml into egpu_setup/data/compiled/*.json, the form the program reads.

The YAML stays the source (comments, a source on every row, reviewed diffs); the JSON holds the
same data and loads in well under a millisecond per file with the C parser, where YAML needs
tens of milliseconds on every command's start. Run this after editing a YAML file (or after
scripts/gen_gpu_table.py); tests/compat/test_data_compiled.py fails while they disagree.

    python scripts/compile_data.py           # rewrite egpu_setup/data/compiled/*.json
    python scripts/compile_data.py --check   # exit 1 when a compiled file is stale or missing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "egpu_setup" / "data"
OUT = DATA / "compiled"


def _plain(value: Any, where: str) -> Any:
    """`value` unchanged when JSON holds it exactly; ValueError naming `where` otherwise (a date,
    a non-string key or a float would come back different, so the YAML must quote it)."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise ValueError(f"{where}: key {key!r} is not a string: quote it in the YAML")
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    raise ValueError(
        f"{where}: {value!r} ({type(value).__name__}) does not survive JSON: quote it in the YAML"
    )


def compile_one(source: Path) -> str:
    """The compiled text for one YAML file (deterministic: same YAML, same bytes)."""
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{source.name}: expected a mapping at the top")
    document = {
        "generated_from": f"egpu_setup/data/{source.name}",
        "generated_by": "scripts/compile_data.py (do not edit: edit the YAML and run it)",
        "data": _plain(data, source.name),
    }
    return json.dumps(document, ensure_ascii=False, indent=1) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report stale files, write nothing")
    args = ap.parse_args()
    sources = sorted(DATA.glob("*.yaml"))
    wanted = {OUT / f"{s.stem}.json": compile_one(s) for s in sources}
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    extra = sorted(set(OUT.glob("*.json")) - set(wanted))
    if args.check:
        for p in [*stale, *extra]:
            print(f"stale: {p.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale or extra else 0
    OUT.mkdir(exist_ok=True)
    for p in stale:
        p.write_text(wanted[p], encoding="utf-8")
        print(f"wrote {p.relative_to(ROOT)}")
    for p in extra:
        p.unlink()
        print(f"removed {p.relative_to(ROOT)} (no YAML source)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
