"""Every egpu-setup command line the README and docs/ show parses as written: each code span or
code-block line that starts with `egpu-setup` (or `sudo egpu-setup`) goes through Click's own
parser for its command (options, their types and choices, required arguments), the way a reader
who pastes it would reach it. A renamed flag, a dropped choice or a line that breaks when pasted
fails here with the page that shows it.

A span that only names a command (`egpu-setup report` in a sentence) checks that the command
exists. The placeholders the pages use for a reader's own value (DIR, PATH, HEX, X and NAME for a profile, COMMAND) become a
value of that kind first; `[--yes]` is both with and without. What a command then does with its
values is tested where it is built (the README's quick start runs for real in test_quickstart.py).
"""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import click
import pytest

from conftest import REPO
from egpu_setup.cli import COMMANDS, cli

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SPAN = re.compile(r"`((?:sudo )?egpu-setup [^`]+)`")
BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.S)


def _shown() -> list[tuple[str, str]]:
    """(page, command line) for every command line the pages show."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        lines = [m.group(1) for m in SPAN.finditer(text)]
        for block in BLOCK.findall(text):
            lines += [line.split("  #")[0].strip() for line in block.splitlines()]
        for line in lines:
            line = " ".join(line.split())  # a span wrapped over two lines of the page
            line = re.split(r"\s(?:&&|\|\|?|;)\s", line)[0]  # the first command of a pipeline
            if re.match(r"(?:sudo )?egpu-setup\b", line):
                found.append((page.name, line))
    return found


SHOWN = _shown()


def _variants(line: str, tmp: Path) -> list[list[str]]:
    values = {"DIR": str(tmp), "PATH": str(tmp / "venv"), "HEX": "0" * 64}
    values |= dict.fromkeys(("X", "NAME"), "rtx4090")
    words = [values.get(w, w) for w in shlex.split(line.removeprefix("sudo "))[1:]]
    if "COMMAND" in words:
        return [[name if w == "COMMAND" else w for w in words] for name in COMMANDS]
    if "[--yes]" in words:
        rest = [w for w in words if w != "[--yes]"]
        return [rest, [*rest, "--yes"]]
    return [words]


def _parse(words: list[str]) -> None:
    """Click's parse of `egpu-setup WORDS` down to the last (sub)command, without running it."""
    ctx = cli.make_context("egpu-setup", [], resilient_parsing=True)
    command: click.Command = cli
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(ctx, words[0])
        assert sub is not None, f"no command {words[0]!r}"
        ctx, command, words = click.Context(sub, info_name=words[0], parent=ctx), sub, words[1:]
    if not words:
        return  # the command named in prose (`egpu-setup report`), not a line to paste
    with contextlib.suppress(click.exceptions.Exit):  # --help: what the reader asked for
        command.make_context(ctx.info_name, list(words), parent=ctx.parent)


def test_the_pages_show_commands() -> None:
    pages = {page for page, _line in SHOWN}
    assert len(SHOWN) >= 40 and {"README.md", "commands.md", "lab.md"} <= pages, SHOWN


@pytest.mark.parametrize(("page", "line"), SHOWN, ids=[f"{p}: {line}" for p, line in SHOWN])
def test_a_command_the_docs_show_parses_as_written(page: str, line: str, tmp_path: Path) -> None:
    for words in _variants(line, tmp_path):
        try:
            _parse(words)
        except click.UsageError as exc:
            pytest.fail(f"{page} shows `{line}`: {exc.format_message()}")


@pytest.mark.parametrize(
    "line",
    ["egpu-setup install --profil rtx4090", "egpu-setup verify --quik", "egpu-setup kernel"],
)
def test_a_wrong_line_fails(line: str, tmp_path: Path) -> None:
    with pytest.raises((click.UsageError, AssertionError)):
        for words in _variants(line, tmp_path):
            _parse(words)
