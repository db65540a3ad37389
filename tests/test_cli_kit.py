"""The command-line kit (commands/_cli.py): Click's parsing rules, its failure messages, help
rendered from the declarations, and bash completion answered from the same declarations."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.commands import _cli as cli
from egpu_setup.commands._complete import SCRIPT, candidates
from egpu_setup.errors import UsageError


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(s for v in values for s in v.split(","))


@cli.command("demo", epilog="\b\nExamples:\n  demo --json\n")
@cli.argument("name")
@cli.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cli.option("--count", type=cli.IntRange(0, 10), default=3, show_default=True, help="How many.")
@cli.option("--ratio", type=float, help="A float.")
@cli.option("--mode", type=cli.Choice(["compute", "display"]), help="Mode.")
@cli.option("--skip", multiple=True, callback=_split, help="Repeatable, comma lists.")
@cli.option("--verify/--no-verify", "run_verify", default=True, help="A pair.")
@cli.option("--yes", "-y", is_flag=True, help="No questions.")
@cli.option("--out", type=cli.Path(file_okay=False), help="A directory.")
@cli.option("--token", envvar="DEMO_TOKEN", show_envvar=True, help="From the environment too.")
def demo(**values: Any) -> dict[str, Any]:
    """A demo command.

    Its second paragraph is wrapped to the terminal, however it is written in the source.
    """
    return values


def run(*words: str) -> dict[str, Any]:
    result: dict[str, Any] = demo.main(list(words), "demo")
    return result


def test_values_defaults_and_the_order_of_options_and_arguments() -> None:
    assert run("x") == {
        "name": "x", "as_json": False, "count": 3, "ratio": None, "mode": None, "skip": (),
        "run_verify": True, "yes": False, "out": None, "token": None,
    }  # fmt: skip
    got = run("--count=7", "--json", "x", "--skip", "a,b", "--skip", "c", "--no-verify", "-y")
    assert (got["count"], got["as_json"], got["name"]) == (7, True, "x")
    assert (got["skip"], got["run_verify"], got["yes"]) == (("a", "b", "c"), False, True)


def test_a_value_is_the_next_word_even_with_a_dash_and_double_dash_ends_options() -> None:
    assert run("x", "--token", "-secret")["token"] == "-secret"
    assert run("--", "--json")["name"] == "--json"


def test_environment_fills_an_option_only_when_it_is_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEMO_TOKEN", "from-env")
    assert run("x")["token"] == "from-env"
    assert run("x", "--token", "given")["token"] == "given"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (("x", "--bogus"), "No such option '--bogus'."),
        (("x", "-z"), "No such option '-z'."),
        (("x", "--count"), "Option '--count' requires an argument."),
        (("x", "--json=1"), "Option '--json' does not take a value."),
        (("x", "--count", "11"), "Invalid value for '--count': 11 is not in the range 0<=x<=10."),
        (("x", "--count", "many"), "Invalid value for '--count': 'many' is not a valid integer."),
        (("x", "--ratio", "half"), "Invalid value for '--ratio': 'half' is not a valid float."),
        (("x", "--mode", "gpu"), "Invalid value for '--mode': 'gpu' is not one of 'compute', "
         "'display'."),
        ((), "Missing argument 'NAME'."),
        (("x", "y", "z"), "Got unexpected extra arguments (y z)"),
        (("x", "--jso"), "No such option '--jso'."),  # no abbreviations
        (("x", "--help=1"), "Option '--help' does not take a value."),
        (("x", "--bogus", "--help"), "No such option '--bogus'."),  # help never hides a typo
        (("x", "--out", ""), "Invalid value for '--out': an empty path."),
    ],
)  # fmt: skip
def test_bad_input_is_a_usage_error_with_a_hint(words: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError) as exc:
        run(*words)
    assert exc.value.message == message
    assert exc.value.hint is not None and exc.value.hint.endswith("see `demo --help`")
    assert exc.value.exit_code == 2


def test_a_mistyped_option_gets_the_closest_names_and_the_last_of_a_repeat_counts() -> None:
    with pytest.raises(UsageError) as exc:
        run("x", "--cont", "2")
    assert exc.value.hint is not None and exc.value.hint.startswith("did you mean --count")
    assert run("x", "--count", "1", "--count", "2")["count"] == 2


def test_help_is_honoured_beside_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["x", "--count", "many", "--help"], "demo") == 0
    assert capsys.readouterr().out.startswith("Usage: demo")


def test_a_pair_without_a_default_is_false_and_the_first_long_name_names_the_value() -> None:
    @cli.command("pair")
    @cli.option("--color/--no-color", help="A pair, no default.")
    @cli.option("--out-dir", "--output", help="Two long names.")
    def pair(**values: Any) -> dict[str, Any]:
        return values

    assert pair.main([], "pair") == {"color": False, "out_dir": None}
    assert pair.main(["--output", "d", "--color"], "pair") == {"color": True, "out_dir": "d"}


def test_a_path_that_cannot_be_read_or_is_no_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"Directory '.*/fifo' is not a directory\."):
        run("x", "--out", str(fifo))
    # root reads everything; what a lab user running it meets, as os.access answers for them
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.R_OK)
    with pytest.raises(UsageError, match=r"Directory '.*' is not readable\."):
        run("x", "--out", str(tmp_path))


def test_path_kinds_are_checked_when_the_path_exists(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("")
    assert run("x", "--out", str(tmp_path))["out"] == str(tmp_path)
    assert run("x", "--out", str(tmp_path / "new"))["out"] == str(tmp_path / "new")
    with pytest.raises(UsageError, match=r"Directory '.*/f' is not a directory\."):
        run("x", "--out", str(file))
    must = cli.Path(exists=True, dir_okay=False, path_type=Path)
    assert must(str(file)) == file
    with pytest.raises(cli.BadValue, match=r"File '.*/nope' does not exist\."):
        must(str(tmp_path / "nope"))
    with pytest.raises(cli.BadValue, match="is a directory"):
        must(str(tmp_path))


def test_help_is_asked_for_anywhere_and_rendered_from_the_declarations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert demo.main(["x", "--count", "2", "-h"], "demo") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Usage: demo [OPTIONS] NAME"
    assert out[2] == "  A demo command."
    assert "  --count INTEGER RANGE     How many. [default: 3; 0<=x<=10]" in out
    assert "  --verify / --no-verify    A pair." in out
    assert "  -y, --yes                 No questions." in out
    assert "  --mode [compute|display]  Mode." in out
    assert any("[env var: DEMO_TOKEN]" in line for line in out)
    assert out[-2:] == ["  Examples:", "    demo --json"]
    assert all(len(line) <= 78 for line in out)


def test_help_follows_a_narrow_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    demo.main(["--help"], "demo")
    out = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in out) <= 58
    assert "  --token TEXT              From the environment too. [env" in out


def test_a_terminal_that_reports_no_columns_gets_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd=0: os.terminal_size((0, 0)))
    assert cli._width() == 78


def test_wrap_is_greedy_and_keeps_long_words() -> None:
    assert cli.wrap("aa bb cc dd", 8, "  ") == ["  aa bb", "  cc dd"]
    assert cli.wrap("a-very-long-word x", 6) == ["a-very-long-word", "x"]


def test_a_no_is_aborted_and_so_is_the_end_of_input(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from egpu_setup.errors import Aborted

    for answer, ok in (("y\n", True), ("yes\n", True), ("n\n", None), ("", None)):
        monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
        if ok:
            assert cli.confirm("go?", abort=True, err=True) is True
        else:
            with pytest.raises(Aborted):
                cli.confirm("go?", abort=True, err=True)


def test_top_level_group_version_missing_and_unknown_command() -> None:
    def egpu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "egpu_setup", *args], capture_output=True, text=True, check=False
        )

    assert egpu("-v", "--version").stdout.startswith("egpu-setup, version ")
    missing = egpu()
    assert missing.returncode == 2 and missing.stderr.startswith("error: Missing command.\nhint: ")
    unknown = egpu("instal")
    assert (unknown.returncode, unknown.stderr) == (
        2,
        "error: No such command 'instal'.\nhint: did you mean install? see `egpu-setup --help`\n",
    )
    bogus = egpu("--version", "--bogus")
    assert bogus.returncode == 2 and bogus.stdout == "" and "'--bogus'" in bogus.stderr
    empty = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "--version"],
        capture_output=True,
        text=True,
        env={**os.environ, "_EGPU_SETUP_COMPLETE": ""},
        check=False,
    )
    assert empty.returncode == 0 and empty.stdout.startswith("egpu-setup, version")
    sub = egpu("profiles", "nope")
    assert sub.returncode == 2 and "see `egpu-setup profiles --help`" in sub.stderr


def test_completion_answers_from_the_declarations() -> None:
    from egpu_setup.cli import cli as root

    assert candidates(root, [], "pro") == [("plain", "profiles")]
    assert candidates(root, ["profiles"], "") == [
        ("plain", "list"), ("plain", "show"), ("plain", "check"),
    ]  # fmt: skip
    assert candidates(root, ["install"], "--dry") == [("plain", "--dry-run")]
    assert candidates(root, ["install"], "--no-v") == [("plain", "--no-verify")]
    assert candidates(root, ["install", "--mode"], "d") == [("plain", "display")]
    assert candidates(root, ["doctor", "--from"], "./b") == [("dir", "./b")]
    assert candidates(root, ["profiles", "check"], "x") == [("file", "x")]
    assert candidates(root, ["-v", "install", "--venv", "/opt/v"], "--pro") == [
        ("plain", "--profile")
    ]
    assert candidates(root, ["no-such"], "") == []
    # an option already given is not offered again, a repeatable one is
    assert candidates(root, ["install", "--dry-run"], "--dr") == [("plain", "--driver-branch")]
    assert candidates(root, ["verify", "--skip", "amp"], "--sk") == [("plain", "--skip")]


def test_an_unknown_completion_request_is_bad_input() -> None:
    env = {**os.environ, "_EGPU_SETUP_COMPLETE": "zsh_source"}
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup"], capture_output=True, text=True, env=env, check=False
    )
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.startswith("error: _EGPU_SETUP_COMPLETE='zsh_source' is not a completion")
    assert "\nhint: " in res.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_completion_script_passes_shellcheck(tmp_path: Path) -> None:
    script = tmp_path / "egpu-setup.bash"
    script.write_text(SCRIPT)
    res = subprocess.run(
        ["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout


def test_completion_in_a_real_bash(tmp_path: Path) -> None:
    """bash sources the script, completes a line through the function it registered, and the
    candidates come back from a real egpu-setup process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "egpu-setup"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m egpu_setup "$@"\n')
    wrapper.chmod(0o755)
    script = tmp_path / "egpu-setup.bash"
    script.write_text(SCRIPT)
    line = (
        f"source {script}; COMP_WORDS=(egpu-setup install --profile rtx409); COMP_CWORD=3; "
        '_egpu_setup_completion egpu-setup; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["rtx4090"]
