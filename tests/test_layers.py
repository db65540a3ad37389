"""The one-way pipeline, checked over every import: module level and inside functions alike.

detect -> resolve -> plan -> show|execute -> verify reads as a tree of packages; an import that
points up the list below (or sideways, into another package of the same layer) is a wrong turn,
and a cycle among modules, however deep in a function it hides, is a knot. Both fail here.
(The idea of pip-tools' tests/test_circular_imports.py, done over the syntax trees, so a
function-level import cannot hide.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "egpu_setup"

# Lowest first. A module may import from its own package and from any layer below its own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "text", "data"),  # version, errors, safe terminal text, data
    ("log",),  # deferred loggers (a warning's arguments pass text's sanitizer)
    ("host",),  # the one gateway to the machine
    ("state",),  # what egpu-setup remembers: manifest, journal, lock, atomic writes
    ("compat", "profile"),  # knowledge as data with sources; GPU profiles, loaded strictly
    ("detect",),  # -> HostFacts
    ("resolve", "doctor"),  # pure decisions over facts: a Resolution; findings
    ("render",),  # validated values -> files in memory
    ("plan",),  # -> typed steps, a diff against the host
    ("execute", "verify"),  # what changes the machine; proving the eGPU trains
    ("bundle",),  # offline bundles (apt sources as plan reads them, pip's environment)
    ("image",),  # what `install --root` adds to a plan: egpu-setup itself, the first-boot marker
    ("install", "fleet", "rollback"),  # the pipeline around execute; many reports; undoing a run
    ("commands",),  # Click options -> one core call -> print -> exit code
    ("cli",),  # the entry point: errors become `error:`/`hint:` and an exit code
    ("__main__",),  # `python -m egpu_setup`
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every egpu_setup import in the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "egpu_setup":
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "egpu_setup":
                continue
            for a in node.names:  # `from egpu_setup.x import y`: y may be a module itself
                yield node.lineno, f"{target}.{a.name}"


def resolved(name: str, known: dict[str, Path]) -> str:
    """The module an import names (`egpu_setup.plan.steps.Plan` -> `egpu_setup.plan.steps`)."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def top(module: str) -> str:
    """The layer key of a module: its first-level package, or its own name at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {
        mod: {resolved(name, known): line for line, name in imports(path, mod)}
        for mod, path in known.items()
    }


def test_every_package_has_a_layer() -> None:
    assert sorted({top(m) for m in modules()} - set(LAYER)) == []


def _wrong_turns() -> list[str]:
    out = []
    for mod, deps in graph().items():
        here = top(mod)
        for dep, line in deps.items():
            there = top(dep)
            if there == here or dep == "egpu_setup":
                continue
            if LAYER[there] >= LAYER[here]:
                out.append(f"{mod}:{line} imports {dep} ({there} is not below {here})")
    return sorted(out)


def test_imports_only_point_down_the_layers() -> None:
    assert _wrong_turns() == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_imports_itself_back_through_another() -> None:
    edges = {m: {d for d in deps if d != "egpu_setup"} for m, deps in graph().items()}
    assert _cycles(edges) == []


def test_a_package_init_lists_its_modules_and_holds_no_code() -> None:
    for path in sorted(PKG.rglob("__init__.py")):
        if path.parent == PKG:
            continue
        body = ast.parse(path.read_text()).body
        assert body == [] or (
            len(body) == 1
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ), path.relative_to(PKG)
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if path.parent.name in ("data",):
            continue
        names = sorted(p.stem for p in path.parent.glob("*.py") if p.stem != "__init__")
        missing = [n for n in names if f"`{n}`" not in doc]
        assert missing == [], f"{path.relative_to(PKG)} does not list {missing}"


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert LAYER["host"] < LAYER["plan"]  # so plan -> host is fine and host -> plan is not
    assert top("egpu_setup.plan.steps") == "plan" and top("egpu_setup.cli") == "cli"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import egpu_setup.plan.steps", ["egpu_setup.plan.steps"]),
        ("def f():\n    from egpu_setup.state import lock\n", ["egpu_setup.state.lock"]),
        ("from . import steps", ["egpu_setup.plan.steps"]),
        ("import os", []),
    ],
)
def test_imports_are_found_at_any_depth(tmp_path: Path, source: str, expected: list[str]) -> None:
    path = tmp_path / "build.py"
    path.write_text(source)
    assert [name for _, name in imports(path, "egpu_setup.plan.build")] == expected
