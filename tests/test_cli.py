"""The command line on Click: help, the error contract (`error:` + `hint:`, the exit codes of
docs/design.md, never a traceback), the options shared by declaration, and tab completion in
real bash, zsh and fish.

In-process tests run `egpu_setup.cli.main` inside Click's CliRunner isolation
(tests/helpers/cli_runner.py); the completion tests run the installed `egpu-setup` from the
shells."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from conftest import REPO
from egpu_setup.cli import COMMANDS, cli
from egpu_setup.commands import _options
from helpers.cli_runner import invoke


def run(*args: str, stdin: str | None = None) -> Result:
    """`egpu-setup ARGS` in this process, through main(): the error handling under test."""
    done = invoke(*args, stdin=stdin)
    return Result(done.returncode, done.stdout, done.stderr)


@dataclass
class Result:
    code: int
    out: str
    err: str


def _all_commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli, info_name="egpu-setup")
    found: list[tuple[str, click.Command]] = []
    for name in cli.list_commands(ctx):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        found.append((name, cmd))
        if isinstance(cmd, click.Group):
            sub_ctx = click.Context(cmd, info_name=name, parent=ctx)
            found += [(f"{name} {s}", cmd.commands[s]) for s in cmd.list_commands(sub_ctx)]
    return found


# -- help ------------------------------------------------------------------------------------


def test_top_level_help_lists_every_command_and_ends_with_examples() -> None:
    res = run("--help")
    assert res.code == 0 and res.err == ""
    listed = re.findall(r"^  ([a-z][a-z-]*) ", res.out.split("Commands:")[1], re.M)
    assert listed == list(COMMANDS)
    assert res.out.rstrip().splitlines()[-1].strip().startswith("egpu-setup ")
    assert run("-h").out == res.out


@pytest.mark.parametrize("name", [n for n, _ in _all_commands()])
def test_every_help_has_examples_and_exits_0(name: str) -> None:
    res = run(*name.split(), "--help")
    assert res.code == 0, res.err
    assert res.out.startswith(f"Usage: egpu-setup {name} ")
    if name != "profiles" and not name.startswith("profiles "):
        assert "Examples:" in res.out, name
    assert run(*name.split(), "-h").out == res.out


def test_version_wins_over_a_command_after_it() -> None:
    from egpu_setup import __version__

    res = run("--version", "install", "--yes")
    assert (res.code, res.out) == (0, f"egpu-setup, version {__version__}\n")


# -- the error contract ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "hint"),
    [
        ((), "error: Missing command.", "hint: one of detect, record, doctor"),
        (("instal",), "error: No such command 'instal'.", "hint: see `egpu-setup --help`"),
        (
            ("install", "--bogus"),
            "error: No such option '--bogus'.",
            "hint: see `egpu-setup install --help`",
        ),
        (
            ("install", "--mode", "gaming"),
            "error: Invalid value for '--mode': 'gaming' is not one of 'compute', 'display'.",
            "hint: see `egpu-setup install --help`",
        ),
        (
            ("install", "--lock-timeout", "-1"),
            "error: Invalid value for '--lock-timeout'",
            "hint: see `egpu-setup install --help`",
        ),
        (
            ("render", "--out", "x"),
            "error: Missing option '--profile'.",
            "hint: see `egpu-setup render --help`",
        ),
        (("record", ""), "error: Invalid value for 'DIRECTORY': an empty path.", "hint: see"),
        (("detect", "--from", ""), "error: Invalid value for '--from': an empty path.", "hint:"),
        (("report",), "error: Missing argument 'PATHS...'.", "hint: see `egpu-setup report"),
        (("matrix",), "error: Missing command.", "hint: see `egpu-setup matrix --help`"),
        (("detect", "--json=yes"), "error: Option '--json' does not take a value.", "hint:"),
        (("resolve", "--profile"), "error: Option '--profile' requires an argument.", "hint:"),
        (("eject", "extra"), "error: Got unexpected extra argument (extra)", "hint:"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
def test_bad_usage_is_an_error_and_a_hint_with_exit_2(
    args: tuple[str, ...], error: str, hint: str
) -> None:
    res = run(*args)
    assert res.code == 2, res
    lines = res.err.splitlines()
    assert lines[0].startswith(error), lines
    assert lines[1].startswith(hint), lines
    assert len(lines) == 2 and res.out == ""


def test_an_expected_failure_of_a_command_keeps_its_message_hint_and_code() -> None:
    res = run("resolve", "--gpu", "2684", "--driver", "550.54.14", "--distro", "beos-5",
              "--python", "3.11")  # fmt: skip
    assert res.code == 2
    assert res.err.startswith("error: --distro 'beos-5': unknown distribution")
    assert "\nhint: " in res.err and "Traceback" not in res.err


# -- one declaration per option --------------------------------------------------------------

SHARED = ("--profile", "--venv", "--root", "--from", "--python", "--torch", "--cuda",
          "--index-url", "--driver-branch", "--mode", "--only", "--yes", "--enclosure",
          "--json", "--matrix")  # fmt: skip


def test_shared_options_are_declared_only_in_the_options_module() -> None:
    for path in sorted((REPO / "egpu_setup/commands").glob("*.py")):
        if path.name == "_options.py":
            continue
        text = path.read_text(encoding="utf-8")
        declared = [o for o in SHARED if re.search(rf'click\.option\(\s*"{o}"', text)]
        assert declared == [], f"{path.name} declares {declared}: use commands/_options.py"


def test_every_profile_option_completes_profile_names() -> None:
    seen = 0
    for name, cmd in _all_commands():
        for param in cmd.params:
            if "--profile" in getattr(param, "opts", ()):
                assert param._custom_shell_complete is _options.complete_profile, name
                seen += 1
    assert seen >= 7


# -- completion in real shells ---------------------------------------------------------------


def _installed() -> str:
    exe = shutil.which("egpu-setup", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("egpu-setup is not installed next to this interpreter")
    return exe


def _shell(program: str, script: str) -> list[str]:
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed (.ci/run installs it)")
    bindir = str(Path(_installed()).parent)
    res = subprocess.run(
        [program, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "HOME": "/nonexistent"},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return [ln.split("\t")[0] for ln in res.stdout.splitlines() if ln]


RTX40 = ["rtx4070", "rtx4070super", "rtx4080", "rtx4080super", "rtx4090"]


def _bash(words: str) -> list[str]:
    """The script bash-completion would load, and its function called as bash calls it."""
    return _shell(
        "bash",
        "source <(_EGPU_SETUP_COMPLETE=bash_source egpu-setup)\n"
        f"COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
        "_egpu_setup_completion egpu-setup\n"
        'printf "%s\\n" "${COMPREPLY[@]}"',
    )


def test_bash_completes_profile_names_commands_and_options() -> None:
    assert _bash("egpu-setup install --profile rtx40") == RTX40
    assert _bash("egpu-setup ins") == ["install"]
    assert "--dry-run" in _bash("egpu-setup install --dr")
    assert _bash("egpu-setup verify --profile gtx") == ["gtx1080ti"]


def test_fish_completes_profile_names_and_commands() -> None:
    """fish's own `complete -C` runs the registered completion as a prompt's Tab would."""
    source = "_EGPU_SETUP_COMPLETE=fish_source egpu-setup | source\n"
    assert _shell("fish", source + "complete -C 'egpu-setup install --profile rtx40'") == RTX40
    assert _shell("fish", source + "complete -C 'egpu-setup resol'") == ["resolve"]


def test_zsh_completes_profile_names_and_commands() -> None:
    """The zsh script run by zsh, with the completion system's compadd/_describe/compdef
    recording what they are given (they exist only inside a line editor's completion widget)."""

    def zsh(*words: str) -> list[str]:
        return _shell(
            "zsh",
            "compdef() { : }\n"
            'compadd() { local name=${@[-1]}; print -l -- "${(@P)name}" }\n'
            '_describe() { print -l -- "${(@P)3%%:*}" }\n'
            'eval "$(_EGPU_SETUP_COMPLETE=zsh_source egpu-setup)"\n'
            f"words=({' '.join(words)}); CURRENT=${{#words}}\n"
            "_egpu_setup_completion",
        )

    assert zsh("egpu-setup", "install", "--profile", "rtx40") == RTX40
    assert zsh("egpu-setup", "firstb") == ["firstboot"]


def test_an_unknown_completion_request_is_refused_by_click() -> None:
    res = subprocess.run(
        [_installed()],
        capture_output=True,
        text=True,
        env={**os.environ, "_EGPU_SETUP_COMPLETE": "tcsh_source"},
        timeout=60,
        check=False,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: _EGPU_SETUP_COMPLETE='tcsh_source' is not a completion")
    assert "\nhint: bash_source, zsh_source or fish_source" in res.stderr


def test_the_installed_command_keeps_the_error_contract() -> None:
    """The console script pip wrote, as a person runs it: Click's usage error, the house's way."""
    res = subprocess.run(
        [_installed(), "install", "--mode", "gaming"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "error: Invalid value for '--mode': 'gaming' is not one of 'compute', 'display'.",
        "hint: see `egpu-setup install --help`",
    ]
