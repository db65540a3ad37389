"""docs/design.md holds the contracts: every command, long option, schema id, finding id and exit
code the code has must be named there, so a change that adds one without documenting it fails."""

from __future__ import annotations

import re

import click
import pytest

from conftest import REPO
from egpu_setup import errors
from egpu_setup.cli import COMMANDS, cli
from egpu_setup.doctor.catalog import CATALOG

DESIGN = (REPO / "docs" / "design.md").read_text(encoding="utf-8")


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli, info_name="egpu-setup")
    found: list[tuple[str, click.Command]] = []
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None, name
        found.append((name, command))
        if isinstance(command, click.Group):
            found += [(f"{name} {sub}", command.commands[sub]) for sub in command.commands]
    return found


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_a_row(name: str) -> None:
    assert re.search(rf"\| `{name}\b", DESIGN), name


def test_every_long_option_of_every_command_is_named() -> None:
    missing = []
    for name, command in _commands():
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            names = [*param.opts, *param.secondary_opts]
            longs = [o for o in names if o.startswith("--") and o != "--help"]
            if longs and not any(
                f"`{o}" in DESIGN or f"[{o}" in DESIGN or f" {o}" in DESIGN for o in longs
            ):
                missing.append(f"{name}: {longs}")
    assert missing == []


def test_every_schema_id_is_named() -> None:
    ids = set()
    for path in (REPO / "egpu_setup").rglob("*.py"):
        ids |= set(re.findall(r'"(egpu-setup/[a-z-]+/\d+)"', path.read_text(encoding="utf-8")))
    assert ids, "no schema id found in the package"
    assert sorted(i for i in ids if f"`{i}`" not in DESIGN) == []


def test_every_finding_id_is_named() -> None:
    assert [s.id for s in CATALOG if f"`{s.id}`" not in DESIGN] == []


def test_every_exit_code_is_in_the_table() -> None:
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert sorted(c for c in codes if not re.search(rf"^\| {c} \|", DESIGN, re.M)) == []


def test_the_hostile_count_docs_testing_quotes_is_the_suites() -> None:
    """docs/testing.md says how many hostile cases the suite holds: that number is collected."""
    import subprocess
    import sys

    testing = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    quoted = re.search(r"`tests/\*/test_hostile_\*\.py`, (\d+) cases", testing)
    assert quoted, "docs/testing.md no longer quotes the hostile count"
    files = sorted(str(p.relative_to(REPO)) for p in REPO.glob("tests/*/test_hostile_*.py"))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n0", "-p", "no:cacheprovider", "--collect-only", "-q",
         *files],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    collected = re.search(r"^(\d+) tests? collected", out, re.M)
    assert collected, out[-2000:]
    assert int(quoted[1]) == int(collected[1])


def test_every_environment_variable_the_package_names_is_in_the_table() -> None:
    """A variable that shipped code reads and the contracts do not name is a seam nobody can
    find (or one only a test sets): each is a row of design.md's environment table."""
    named = re.compile(r"(?<![\w$])_?EGPU_SETUP_[A-Z][A-Z0-9_]*")
    found = {
        m.group(0): path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "egpu_setup").rglob("*.py"))
        for m in named.finditer(path.read_text(encoding="utf-8"))
    }
    assert found, "the pattern found no variable: it tests nothing"
    table = DESIGN.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    missing = {name: where for name, where in found.items() if f"| `{name}` |" not in table}
    assert missing == {}


def test_the_kill_point_counts_docs_testing_shows_are_the_tests_own() -> None:
    """docs/testing.md's table of how many points each phase's convergence test kills at: each
    number is the named constant of that test module."""
    import importlib.util

    testing = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\s*\| [^|]+ \| `(tests/[^`]+\.py)` \| (\d+) \| `(\w+)` \|$", testing, re.M)
    assert len(rows) >= 6, "docs/testing.md no longer has the table of kill points"
    for path, quoted, name in rows:
        spec = importlib.util.spec_from_file_location(f"kill_count_{name}_{quoted}", REPO / path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert getattr(module, name) == int(quoted), f"{path}: {name}"
