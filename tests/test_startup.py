"""Nothing heavy on the startup path: --help and detect never import torch, requests or jinja2;
`--help` imports the command table and Click, no command's module; `detect` imports its own
module and no other command's; the shipped data is read once, from its compiled form; `resolve`
with every fact given reads nothing of this machine."""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import sys
from typing import Any

import pytest

from conftest import FIXTURES

PROBE = """
import sys
sys.argv = ["egpu-setup", *{args!r}]
from egpu_setup.cli import main
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "requests", "jinja2", "numpy") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


def _in_child(script: str, tag: str, args: tuple[str, ...]) -> str:
    """Run the command line with `args` under `script` in a fresh interpreter; the value the
    script printed on stderr after `tag`."""
    res = subprocess.run(
        [sys.executable, "-c", script.format(args=list(args))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = [ln for ln in res.stderr.splitlines() if ln.startswith(tag)]
    assert line, res.stderr
    return line[-1].removeprefix(tag)


def heavy_modules(*args: str) -> str:
    return _in_child(PROBE, "HEAVY=", args)


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("detect", "--json"),
        ("detect", "--help"),
        ("resolve", "--help"),
        ("doctor", "--help"),
    ],
    ids=lambda a: " ".join(a),
)
def test_startup_path_is_light(args: tuple[str, ...]) -> None:
    assert heavy_modules(*args) == ""


def test_detect_from_bundle_is_light() -> None:
    bundles = sorted(p for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []
    if not bundles:
        pytest.skip("no recorded hosts yet")
    assert heavy_modules("detect", "--json", "--from", str(bundles[0])) == ""


def _modules_after(code: str) -> set[str]:
    res = subprocess.run(
        [sys.executable, "-c", code + "\nprint('MODULES=' + ','.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("MODULES=")]
    assert line, res.stdout + res.stderr
    return set(line[-1].removeprefix("MODULES=").split(","))


def _ours_after(*args: str) -> list[str]:
    """The egpu_setup modules imported by running the command line with `args`."""
    quiet = "import contextlib, io, sys\nout = io.StringIO()\n"
    loaded = _modules_after(
        quiet + f"sys.argv = ['egpu-setup', *{list(args)!r}]\nfrom egpu_setup.cli import main\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n        main()\n    except SystemExit:\n        pass\n"
    )
    return sorted(m for m in loaded if m == "egpu_setup" or m.startswith("egpu_setup."))


def test_help_imports_the_command_table_and_no_command() -> None:
    assert _ours_after("--help") == [
        "egpu_setup",
        "egpu_setup.cli",
        "egpu_setup.errors",
        "egpu_setup.host",
        "egpu_setup.host.umask",
    ]


def test_detect_imports_no_other_command() -> None:
    commands = [m for m in _ours_after("detect", "--json") if m.startswith("egpu_setup.commands.")]
    assert commands == ["egpu_setup.commands._options", "egpu_setup.commands.detect"]


def test_every_command_in_the_table_has_its_module() -> None:
    import click

    from egpu_setup.cli import COMMANDS, cli

    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == list(COMMANDS)
    for name, (module, help_text) in COMMANDS.items():
        command = importlib.import_module(f"egpu_setup.commands.{module}").command
        assert isinstance(command, click.Command) and cli.get_command(ctx, name) is command
        assert help_text  # what `egpu-setup --help` lists without importing the module
    assert cli.get_command(ctx, "no-such-command") is None


# Runs the command line in this process, recording every file opened and directory listed.
AUDIT = """
import json, sys
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], str):
        opened.append(args[0])
    elif event in ("os.listdir", "os.scandir") and args and isinstance(args[0], str):
        opened.append(args[0])
sys.addaudithook(hook)
sys.argv = ["egpu-setup", *{args!r}]
from egpu_setup.cli import main
try:
    main()
except SystemExit:
    pass
print("AUDIT=" + json.dumps({{"opened": opened, "yaml": "yaml" in sys.modules}}), file=sys.stderr)
"""


def _audit(*args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(_in_child(AUDIT, "AUDIT=", args))
    return result


WHAT_IF = ("resolve", "--gpu", "10de:2684", "--driver", "550.54.14", "--distro", "ubuntu-22.04")


_MACHINE = ("sys", "proc", "etc", "dev")


def _host_reads(opened: list[str]) -> list[str]:
    """This machine's files among `opened`: by path, or by the Host's descriptor walk, which
    opens "/" and then each name beneath it (host/machine.py: no link followed)."""
    by_path = [p for p in opened if p.startswith(tuple(f"/{top}" for top in _MACHINE))]
    walked = [f"/{b}" for a, b in itertools.pairwise(opened) if a == "/" and b in _MACHINE]
    return by_path + walked


def test_resolve_with_every_fact_given_reads_nothing_of_this_machine() -> None:
    seen = _audit(*WHAT_IF, "--python", "3.11", "--json")
    assert _host_reads(seen["opened"]) == []
    data = [p for p in seen["opened"] if "/egpu_setup/data/" in p]
    assert data and all(p.endswith(".json") and "/compiled/" in p for p in data), data
    assert len(data) == len(set(data)), "a data file was read twice"
    assert seen["yaml"] is False
    # one fact short (the Python), the machine is read for it
    assert _host_reads(_audit(*WHAT_IF, "--json")["opened"]) != []
