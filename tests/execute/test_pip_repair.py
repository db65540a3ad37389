"""A venv that is not egpu-setup's own (one root made by hand, or a user's, whose pip runs as
that user) with a file of an installed distribution cut short: pip would call it "already
satisfied" and leave it broken, so the step reinstalls exactly the damaged distribution
(--force-reinstall --no-deps NAME==VERSION) before its normal install, and the run after plans
nothing. Real pip, a loopback PEP 503 index, a real truncate."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.errors import EXIT_USAGE, UsageError
from egpu_setup.execute.pip import commands, pinned_lines
from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.installed import incomplete_distributions
from egpu_setup.plan.steps import PipInstall
from helpers import pypi_index as _pypi_index
from helpers.pip_install import install_torch, plan_torch

# fresh venvs and real pip runs, each test 5 to 30 s: not the quick tier
pytestmark = pytest.mark.slow

PROBE = ("egpu-probe==1.0",)
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_pypi_index.LocalIndex]:
    wheels = tmp_path_factory.mktemp("repair-wheels")
    os.chmod(wheels, 0o755)
    built = [
        _pypi_index.build_wheel(wheels, "egpu-probe", "1.0", script=True, requires=("egpu-dep",)),
        _pypi_index.build_wheel(wheels, "egpu-dep", "1.0", "VALUE = 7\n"),
    ]
    with _pypi_index.LocalIndex(built) as idx:
        yield idx


@pytest.fixture(params=["root-by-hand", "user"])
def owned(request: pytest.FixtureRequest) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(venv, the PlanOptions for it): made and filled by its owner's own pip, never marked."""
    if os.geteuid() != 0 or shutil.which("runuser") is None or not Path(SYSTEM_PYTHON).exists():
        pytest.skip("needs root, runuser and the system python3 (.ci/run runs as root)")
    # under /tmp, not tmp_path: nobody cannot enter root's 0700 pytest directories
    base = Path(tempfile.mkdtemp(prefix="egpu-setup-repair-", dir="/tmp"))
    os.chmod(base, 0o755)
    options: dict[str, Any] = {}
    as_user: list[str] = []
    if request.param == "user":
        nobody = pwd.getpwnam("nobody")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        options = {"sudo_user": "nobody", "sudo_uid": nobody.pw_uid}
        as_user = ["runuser", "-u", "nobody", "--"]
    try:
        venv = base / "venv"
        subprocess.run([*as_user, SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, cwd="/")
        yield venv, options
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fill(venv: Path, index: str, options: dict[str, Any]) -> None:
    as_user = [str(shutil.which("runuser")), "-u", "nobody", "--"] if options else []
    subprocess.run(
        [*as_user, f"{venv}/bin/python", "-m", "pip", "install", "-q", "--no-cache-dir"]
        + ["--index-url", index, *PROBE],
        check=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    )


def _module(venv: Path, name: str) -> Path:
    return next(venv.glob(f"lib/python3*/site-packages/{name}/__init__.py"))


@pytest.mark.parametrize("damaged", ["egpu-probe", "egpu-dep"])
def test_a_short_file_in_a_venv_not_ours_is_reinstalled_alone(
    index: _pypi_index.LocalIndex, owned: tuple[Path, dict[str, Any]], damaged: str
) -> None:
    """egpu-probe itself, or egpu-dep it requires (torch and numpy): the damaged one alone is
    reinstalled, at its version, and the other keeps its very files (the same inode and
    mtime: no blanket --force-reinstall)."""
    venv, options = owned
    _fill(venv, index.url, options)
    short = _module(venv, damaged.replace("-", "_"))
    whole = short.read_bytes()
    other = _module(venv, "egpu_dep" if damaged == "egpu-probe" else "egpu_probe")
    untouched = other.stat()
    with open(short, "r+b") as f:
        f.truncate(10)
    plan = plan_torch(venv, PROBE, index.url, **options)
    (step,) = plan.steps
    assert isinstance(step, PipInstall)
    assert step.repair == (f"{damaged}==1.0",)
    assert not step.create_venv and not step.rebuild_venv
    assert step.run_as == ("nobody" if options else None)
    assert any(f"{damaged}==1.0 is damaged" in w and "RECORD says" in w for w in plan.warnings)
    repair, install = commands(step, None)[-2:]
    assert repair[-3:] == ["--force-reinstall", "--no-deps", f"{damaged}==1.0"]
    assert install[-1] == PROBE[0] and "--force-reinstall" not in install
    _plan, result = install_torch(venv, PROBE, index.url, **options)
    assert [s.status for s in result.steps] == ["done"]
    assert short.read_bytes() == whole
    if options:
        assert short.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    assert (other.stat().st_ino, other.stat().st_mtime_ns) == (
        untouched.st_ino,
        untouched.st_mtime_ns,
    )
    assert incomplete_distributions(LiveHost(), str(venv)) == {}
    assert not (venv / ".egpu-setup-tmp").exists()
    out = subprocess.run([venv / "bin/egpu-probe"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1.0"
    assert plan_torch(venv, PROBE, index.url, **options).steps == ()


def test_a_dist_info_without_record_is_said_and_nothing_changes(
    index: _pypi_index.LocalIndex, owned: tuple[Path, dict[str, Any]]
) -> None:
    """pip uninstalls by RECORD, so it can neither reinstall nor remove such a distribution:
    the plan stops with error/hint naming the folder (exit 2), before any change."""
    venv, options = owned
    _fill(venv, index.url, options)
    info = next(venv.glob("lib/python3*/site-packages/egpu_dep-1.0.dist-info"))
    (info / "RECORD").unlink()
    before = sorted((str(p), p.stat().st_mtime_ns) for p in venv.rglob("*"))
    with pytest.raises(UsageError) as caught:
        plan_torch(venv, PROBE, index.url, **options)
    assert caught.value.exit_code == EXIT_USAGE
    assert str(info) in caught.value.message and "no RECORD" in caught.value.message
    assert caught.value.hint and "remove that folder" in caught.value.hint
    assert sorted((str(p), p.stat().st_mtime_ns) for p in venv.rglob("*")) == before


def test_offline_the_repair_keeps_the_bundles_hashes() -> None:
    """From a bundle the repair installs from its own lines of the checked requirements file
    (--require-hashes), names compared normalised, a version the bundle lacks left out."""
    text = (
        "egpu-probe==1.0 --hash=sha256:aa\n"
        "egpu_dep==1.0 --hash=sha256:bb\n"
        "numpy==2.1.0 --hash=sha256:cc\n"
    )
    assert pinned_lines(text, ("egpu-dep==1.0", "numpy==2.0.0")) == (
        "egpu_dep==1.0 --hash=sha256:bb\n"
    )
