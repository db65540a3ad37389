"""The command line run in this process: `egpu_setup.cli.main` inside Click's CliRunner
isolation (https://click.palletsprojects.com/en/stable/testing/), so a test that needs no real
process (no signal, no child it must outlive, no installed script) saves an interpreter start.

The answer has the shape of subprocess.run's, so a test can move between the two: the exit
status main() left, and stdout and stderr apart (what scripts and `error:`/`hint:` rely on).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from click.testing import CliRunner

from egpu_setup.cli import main


def invoke(
    *args: str, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`egpu-setup ARGS` with `env` added to the environment and `stdin` as its input."""
    with CliRunner().isolation(input=stdin, env=dict(env or {})) as streams:
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return subprocess.CompletedProcess(
        ["egpu-setup", *args], code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    )
