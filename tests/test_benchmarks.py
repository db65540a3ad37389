"""Every benchmark runs, from the repository root, against the installed package (in --smoke mode:
tiny inputs, one round; nothing here asserts a time), and docs/testing.md lists each one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BENCHMARKS = sorted(p for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_"))
# These install torch-sized things, train on the CPU or run Ansible plays even when small: CI
# runs them too.
SLOW = {"torch_uv_vs_pip.py", "bundle_fetch.py", "verify_cpu.py", "ansible_forks.py"}


@pytest.mark.parametrize(
    "script",
    [pytest.param(p, marks=[pytest.mark.slow] if p.name in SLOW else []) for p in BENCHMARKS],
    ids=lambda p: p.name,
)
def test_the_benchmark_runs_from_the_repo_root(script) -> None:
    res = subprocess.run(
        [sys.executable, str(script.relative_to(REPO)), "--smoke"],
        cwd=REPO,  # where `python -m egpu_setup` would import the source tree: they must not
        # as the README runs them: in the activated venv (its uv, its egpu-setup)
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "--smoke" in res.stdout and "load" in res.stdout, res.stdout
    # every benchmark prints at least one ratio (its goal verdicts, or a side-by-side factor)
    assert re.search(r"\d\.\d+x\b", res.stdout), res.stdout


def test_the_testing_page_lists_every_benchmark() -> None:
    page = (REPO / "docs" / "testing.md").read_text()
    section = page.split("## Tests and benchmarks", 1)[1].split("\n## ", 1)[0]
    missing = [p.name for p in BENCHMARKS if f"benchmarks/{p.name}" not in section]
    assert missing == []
