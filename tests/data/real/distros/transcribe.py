"""Write expected.json: for each release tree here, the values python-distro's own test file
expects for it, picked as README.md says.

    python tests/data/real/distros/transcribe.py PATH/TO/distro/tests/test_distro.py

The values are read from the test file's literals (ast.literal_eval), never computed by distro.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
FIELDS = ("id", "version", "codename", "pretty_name", "like")
# Trees that say who they are only through commands (uname, oslevel), which egpu-setup never
# runs for a tree: nothing in their files names a distribution.
COMMANDS_ONLY = ("aix72", "freebsd111", "midnightbsd12", "netbsd711", "openbsd62")


def outcomes(source: str) -> dict[str, dict[str, dict[str, str]]]:
    """class name -> test name -> the dict that test hands to self._test_outcome."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            names = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    with contextlib.suppress(ValueError):
                        names[node.targets[0].id] = ast.literal_eval(node.value)
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "_test_outcome"
                    and node.args
                ):
                    arg = node.args[0]
                    value = names.get(arg.id) if isinstance(arg, ast.Name) else None
                    if value is None:
                        try:
                            value = ast.literal_eval(arg)
                        except ValueError:
                            continue
                    out.setdefault(cls.name, {}).setdefault(fn.name, value)
    return out


def pick(tree: str, tests: dict[str, dict[str, dict[str, str]]]) -> dict[str, object]:
    overall = tests["TestOverall"].get(f"test_{tree}_release")
    os_release = tests["TestOSRelease"].get(f"test_{tree}_os_release")
    dist = tests["TestDistroRelease"].get(f"test_{tree}_dist_release")
    if tree in COMMANDS_ONLY:
        return {"from": "commands only (uname, oslevel): nothing to read"}
    if overall is not None and _reads_files_only(HERE / tree):
        return {"from": f"TestOverall.test_{tree}_release", **_fields(overall)}
    if os_release is not None:
        values = _fields(os_release)
        source = f"TestOSRelease.test_{tree}_os_release"
        if dist is not None:
            filled = {k: v for k, v in _fields(dist).items() if k not in values}
            values.update(filled)
            if filled:
                source += f" + TestDistroRelease.test_{tree}_dist_release ({', '.join(filled)})"
        return {"from": source, **values}
    return {"from": "none: no test of distro's reads this tree's files alone"}


def _reads_files_only(tree: Path) -> bool:
    """Whether distro's default arguments see only the tree's files: no bin/, or only the
    shared lsb_release, which prints etc/lsb-release (egpu-setup reads that file itself)."""
    commands = list((tree / "bin").iterdir()) if (tree / "bin").is_dir() else []
    shared = "../../__shared__/bin/lsb_release"
    return all(p.is_symlink() and os.readlink(p) == shared for p in commands)


def _fields(outcome: dict[str, str]) -> dict[str, str]:
    return {k: outcome[k] for k in FIELDS if outcome.get(k)}


def main(test_file: str) -> None:
    tests = outcomes(Path(test_file).read_text(encoding="utf-8"))
    trees = sorted(p.name for p in HERE.iterdir() if p.is_dir() and p.name != "__shared__")
    expected = {tree: pick(tree, tests) for tree in trees}
    text = json.dumps(expected, indent=1, sort_keys=True) + "\n"
    (HERE / "expected.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
