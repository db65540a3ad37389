"""Hostile: a profile file root is pointed at is read capped, never quoted, and validated whole.

Was: a 3 GB profile was read whole before the size cap; a profile error quoted the first line of
whatever file was passed (`profiles check /etc/shadow` printed root's hash); schema patterns
accepted a trailing newline (`re.search` with `$`), so `name: "lab\\n"` passed.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conftest import REPO
from helpers.sentinel import Sentinel, clean_error

Cli = Callable[..., subprocess.CompletedProcess[str]]


def test_a_huge_profile_is_refused_by_its_size(cli: Cli, tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as f:
        f.truncate(3 * 1024**3)  # sparse: 3 GB to read, nothing on disk
    # 1 GiB of address space: reading the file whole would fail with MemoryError
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "profiles", "check", str(huge)],
        capture_output=True, text=True, timeout=60, check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)),
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "profile is larger than 256 KiB" in res.stderr + res.stdout
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr


def test_a_profile_error_never_quotes_the_file(cli: Cli, sentinel: Sentinel) -> None:
    res = cli("profiles", "check", str(sentinel.shadow))
    assert res.returncode == 2, res.stderr
    assert not sentinel.leaked(res.stdout, res.stderr), res.stdout + res.stderr
    res = cli("install", "--profile", str(sentinel.shadow), "--dry-run")
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert not sentinel.leaked(res.stdout, res.stderr)
    assert sentinel.unchanged()


def test_a_pattern_does_not_accept_a_trailing_newline(cli: Cli, tmp_path: Path) -> None:
    text = (REPO / "profiles" / "rtx4090.yaml").read_text()
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good = tmp_path / "good" / "lab.yaml"  # a profile's name is its file's name
    good.write_text(text.replace("name: rtx4090", 'name: "lab"'))
    bad = tmp_path / "bad" / "lab.yaml"
    bad.write_text(text.replace("name: rtx4090", 'name: "lab\\n"'))
    assert cli("profiles", "check", str(good)).returncode == 0  # the control
    res = cli("profiles", "check", str(bad))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "name" in res.stdout + res.stderr


def test_a_profile_that_is_a_fifo_is_not_opened_for_ever(cli: Cli, tmp_path: Path) -> None:
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    res = cli("profiles", "check", str(fifo), timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr


def test_control_characters_and_deep_nesting_are_usage_errors(cli: Cli, tmp_path: Path) -> None:
    """VT and FF in a value, 120 KB of `- - - -` (minutes in the Python parser): exit 2 at once."""
    text = (REPO / "profiles" / "rtx4090.yaml").read_text()
    cases = {
        "vt.yaml": (text.replace("name: rtx4090", "name: vt\x0b"), "vertical tab U+000B"),
        "ff.yaml": (text + "\x0c\n", "form feed U+000C"),
        "deep.yaml": ("name: deep\ngpu:\n  " + "- " * 60000 + "x\n", "nested deeper than"),
    }
    for name, (body, said) in cases.items():
        (tmp_path / name).write_text(body)
        res = cli("profiles", "check", str(tmp_path / name), timeout=60)
        assert res.returncode == 2, res.stdout + res.stderr
        clean_error(res)
        assert said in res.stderr
