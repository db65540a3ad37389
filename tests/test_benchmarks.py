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
def test_the_benchmark_runs_from_the_repo_root(script: Path) -> None:
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


def test_the_apt_trace_counts_initramfs_builds() -> None:
    """A real strace log of one apt-get install in the image base (dmsetup and lvm2, whose
    triggers files activate initramfs-tools' trigger): apt ran dpkg twice (--unpack with
    --no-triggers, then --configure --pending), the trigger ran update-initramfs once, and that
    built one initramfs (one mkinitramfs). The five-column pid padding strace writes for small
    pids is read too."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import install_vs_by_hand as bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    trace = bench.Trace.read(REPO / "tests/data/benchmarks/apt-dmsetup-lvm2.trace")
    execs = trace.execs()
    assert (execs[bench.APT_DPKG], execs["update-initramfs"], execs["mkinitramfs"]) == (2, 1, 1)
    side = bench.Side()
    (_, start, end), *_ = [r for r in trace.runs if r[0] == "apt-get"]
    bench.split_apt(trace, start, end, side)
    build = next(hi - lo for n, lo, hi in trace.runs if n == "update-initramfs")
    assert side.seconds["initramfs"] == pytest.approx(build)
