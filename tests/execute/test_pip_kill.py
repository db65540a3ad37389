"""kill -9 inside the venv and pip phases of a torch step, for real: `python -m venv` killed
while ensurepip puts pip in place, pip killed midway through replacing one version by another,
egpu-setup killed as it starts either and as it marks the venv its own. The same run again
converges (the distribution whole, nothing left to do), and `rollback --packages` removes the
venv however far the killed run got.

The steps are the executor's own (helpers/pip_install.py) in a child process, from a loopback
PEP 503 index of small wheels (helpers/pypi_index.py), so pip and venv run for real in seconds.
The points come from one uninterrupted run traced with strace (helpers/kill_points.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.installed import incomplete_distributions
from helpers import kill_points
from helpers import pypi_index as _pypi_index
from helpers.pip_install import plan_torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(kill_points.STRACE is None, reason="strace missing (.ci/run installs it)"),
]

TESTS = Path(__file__).parents[1]
_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from helpers.pip_install import install_torch
    install_torch(Path({venv!r}), ({requirement!r},), {index!r})
    """
)
# ensurepip's renames (each .pyc and dist-info file it puts in place) and pip's (the old
# version stashed away, the new one's files, RECORD), spread over each
IN_VENV, IN_PIP = 2, 3
# the venv's kill points: those of ensurepip, egpu-setup as it starts venv and pip, as it marks
# the venv (docs/testing.md's table of kill points shows it)
VENV_KILL_POINTS = IN_VENV + 3


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_pypi_index.LocalIndex]:
    wheels = tmp_path_factory.mktemp("pip-kill-wheels")
    built = [_pypi_index.build_wheel(wheels, "egpu-probe", v, script=True) for v in ("1.0", "1.1")]
    with _pypi_index.LocalIndex(built) as idx:
        yield idx


def _argv(venv: Path, requirement: str, index: str) -> list[str]:
    code = _CHILD.format(tests=str(TESTS), venv=str(venv), requirement=requirement, index=index)
    return [sys.executable, "-c", code]


def _env(state: Path) -> dict[str, str]:
    # no .pyc of the test's own modules written: every run makes the same calls
    return {**os.environ, "EGPU_SETUP_STATE_DIR": str(state), "PYTHONDONTWRITEBYTECODE": "1"}


def _whole(venv: Path, version: str) -> None:
    """The distribution egpu-setup says it installed is there, every file RECORD lists, whole,
    and its console script runs."""
    site = next(venv.glob("lib/python3*/site-packages"))
    rows = [
        line.split(",")
        for line in (site / f"egpu_probe-{version}.dist-info/RECORD").read_text().splitlines()
        if line
    ]
    for path, _digest, size in rows:
        where = (site / path).resolve()
        assert where.is_file(), path
        assert not size or where.stat().st_size == int(size), path
    out = subprocess.run([venv / "bin/egpu-probe"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == version
    assert incomplete_distributions(LiveHost(), str(venv)) == {}


def _rollback_removes(venv: Path, state: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "rollback", "--packages", "--yes"],
        env=_env(state),
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert not venv.exists(), res.stderr[-2000:]


def _converges(venv: Path, state: Path, requirement: str, index: str, point: object) -> None:
    again = subprocess.run(
        _argv(venv, requirement, index), env=_env(state), capture_output=True, text=True
    )
    assert again.returncode == 0, f"{point}: {again.stderr[-3000:]}"
    _whole(venv, requirement.split("==")[1])
    assert plan_torch(venv, (requirement,), index).steps == (), f"{point}: work left"


def _killed_or_named(res: subprocess.CompletedProcess[str], point: object) -> None:
    """egpu-setup killed (-9), or its child killed and the step's failure raised as such (the
    executor's ExecutionError, which the CLI prints as `error:`) before a later point of
    egpu-setup's own came."""
    named = res.returncode == 1 and "ExecutionError" in res.stderr
    assert named or kill_points.killed(res), f"{point}: {res.returncode} {res.stderr[-2000:]}"


def test_killed_while_the_venv_is_made_the_same_run_converges_and_rollback_removes_it(
    index: _pypi_index.LocalIndex, tmp_path: Path
) -> None:
    ref = tmp_path / "ref"
    done, found = kill_points.follow_points(
        _argv(ref / "venv", "egpu-probe==1.0", index.url), env=_env(ref / "state")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ensurepip = [p for p in found if p.syscall == "rename" and f"{ref}/venv/lib" in p.args]
    assert len(ensurepip) > 100  # pip's own files, each .pyc
    _, own = kill_points.points(
        _argv(tmp_path / "own" / "venv", "egpu-probe==1.0", index.url),
        env=_env(tmp_path / "own" / "state"),
    )
    starts = [p for p in own if p.syscall in kill_points.STARTS]
    marked = [p for p in own if ".egpu-setup-venv" in p.args]
    assert len(starts) >= 2 and marked, [str(p) for p in own]
    # egpu-setup as it starts `python -m venv`, then pip; and as it writes the venv's mark
    chosen = [*kill_points.spread(ensurepip, IN_VENV), *starts[-2:], marked[0]]
    assert len(chosen) == VENV_KILL_POINTS, [str(p) for p in chosen]
    for k, point in enumerate(chosen):
        venv, state = tmp_path / f"r{k}" / "venv", tmp_path / f"r{k}" / "state"
        argv = _argv(venv, "egpu-probe==1.0", index.url)
        if point in ensurepip:
            res = kill_points.kill_in(point, argv, env=_env(state))
        else:
            res = kill_points.kill_at(point, argv, env=_env(state))
        _killed_or_named(res, point)
        _converges(venv, state, "egpu-probe==1.0", index.url, point)
        _rollback_removes(venv, state)


def test_killed_while_pip_replaces_a_version_the_same_run_converges(
    index: _pypi_index.LocalIndex, tmp_path: Path
) -> None:
    """The venv is there with 1.0; the run upgrades to 1.1. pip stashes the old files away
    (renames), writes the new ones and moves RECORD into place: killed at IN_PIP of its
    renames, and straight after a kill rollback still removes the venv. (Each venv is made
    where it stays: a copied venv's scripts and records name the original's path.)"""

    def with_one_zero(r: Path) -> tuple[Path, Path]:
        venv, state = r / "venv", r / "state"
        first = subprocess.run(
            _argv(venv, "egpu-probe==1.0", index.url), env=_env(state), capture_output=True
        )
        assert first.returncode == 0, first.stderr[-3000:]
        return venv, state

    ref, ref_state = with_one_zero(tmp_path / "ref")
    done, found = kill_points.follow_points(
        _argv(ref, "egpu-probe==1.1", index.url), env=_env(ref_state)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    renames = [p for p in found if p.syscall == "rename" and f"{ref}/" in p.args]
    assert any("RECORD" in p.args for p in renames), [str(p) for p in renames]
    for k, point in enumerate(kill_points.spread(renames, IN_PIP)):
        venv, state = with_one_zero(tmp_path / f"r{k}")
        res = kill_points.kill_in(point, _argv(venv, "egpu-probe==1.1", index.url), env=_env(state))
        _killed_or_named(res, point)
        if k % 2:
            _rollback_removes(venv, state)  # straight after the kill
            continue
        _converges(venv, state, "egpu-probe==1.1", index.url, point)
        _rollback_removes(venv, state)
