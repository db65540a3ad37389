"""Output wrapped to the terminal it goes to, and left alone when piped (egpu_setup/text.py)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from conftest import FIXTURES, run_cli
from egpu_setup.text import fit

TB4 = FIXTURES / "tb4-rtx4090-ubuntu2404"


def test_fit_wraps_long_lines_under_their_indent_and_keeps_short_ones() -> None:
    text = "Plan (1 step):\n   1. [torch] " + "word " * 30 + "end"
    out = fit(text, 40).split("\n")
    assert out[0] == "Plan (1 step):"
    assert all(len(line) <= 40 for line in out)
    assert out[2].startswith("       word") and " ".join(" ".join(out[1:]).split()) == " ".join(
        text.split("\n")[1].split()
    )
    assert fit(text, None) == text


def _on_a_terminal(*args: str, columns: int, stderr: bool = False, rc: int = 0) -> str:
    """What the command shows on a terminal of `columns` (its stdout, or its stderr)."""
    main, child = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "egpu_setup", *args],
        stdout=subprocess.DEVNULL if stderr else child,
        stderr=child if stderr else subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == rc
    os.close(main)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_the_plan_fits_an_80_column_terminal_and_is_one_line_per_item_when_piped() -> None:
    args = ("install", "--profile", "rtx4090", "--dry-run", "--from", str(TB4))
    shown = _on_a_terminal(*args, columns=80)
    assert "Plan (" in shown
    # a path is never cut either: only one word alone on its line may reach past the edge
    over = [ln for ln in shown.split("\n") if len(ln) > 80]
    assert all(len(ln.split()) == 1 for ln in over), over
    piped = run_cli(*args).stdout
    assert max(len(line) for line in piped.split("\n")) > 80  # the pip line, whole
    assert " ".join(shown.split()) == " ".join(piped.split())  # the same words


def test_doctor_and_profiles_list_fit_a_60_column_terminal() -> None:
    TB5 = FIXTURES / "tb5-rtx5090-ubuntu2404"
    for args in (("doctor", "--from", str(TB5)), ("profiles", "list")):
        shown = _on_a_terminal(*args, columns=60)
        # a URL is never cut: it stays one word on a line of its own
        over = [ln for ln in shown.split("\n") if len(ln) > 60]
        assert all(len(ln.split()) == 1 and "://" in ln for ln in over), over
        piped = run_cli(*args).stdout
        assert max(len(line) for line in piped.split("\n")) > 60, args
        # the same text (doctor's summary and fix break at hyphens too, as before)
        assert "".join(shown.split()) == "".join(piped.split()), args


def test_an_error_and_its_hint_fit_the_terminal_and_stay_one_line_each_when_piped() -> None:
    # an AMD eGPU behind a Thunderbolt tunnel: the refusal names every bridge of the chain
    args = ("install", "--profile", "rx7900xtx", "--dry-run",
            "--from", str(FIXTURES / "amd-rx7900xt-egpu"))  # fmt: skip
    shown = _on_a_terminal(*args, columns=80, stderr=True, rc=2).rstrip("\n").split("\n")
    assert shown[0].startswith("error: this link cannot run ROCm")
    assert all(len(line) <= 80 for line in shown), shown
    (hint,) = [i for i, line in enumerate(shown) if line.startswith("hint: ")]
    assert hint > 1 and all(line.startswith("    ") for line in shown[1:hint])
    piped = run_cli(*args)
    assert piped.returncode == 2
    assert [line[:6] for line in piped.stderr.strip().split("\n")] == ["error:", "hint: "]
