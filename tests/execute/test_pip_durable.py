"""A pip step is done only once what it wrote is on disk, and a distribution an install did not
finish is never trusted: real power cuts of a loop-mounted ext4 holding the venv (EXT4_IOC_SHUTDOWN,
helpers/loop_ext4.py), real pip installs from a loopback PEP 503 index."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_setup.errors import EgpuSetupError
from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.installed import incomplete_distributions, venv_versions
from egpu_setup.plan.steps import PipInstall
from helpers import pypi_index as _pypi_index
from helpers.loop_ext4 import loop_ext4
from helpers.pip_install import install_torch, plan_torch

# fresh venvs and real pip runs on a loop-mounted ext4, each test 5 to 60 s: not the quick tier
pytestmark = pytest.mark.slow

PROBE = ("egpu-probe==1.0",)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[_pypi_index.LocalIndex]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    whl = [_pypi_index.build_wheel(wheels, "egpu-probe", v, script=True) for v in ("1.0", "1.1")]
    with _pypi_index.LocalIndex(whl) as idx:
        yield idx


def _record_complete(venv: Path, version: str) -> None:
    """Every file the distribution's RECORD lists is there, whole (the size RECORD gives)."""
    site = next(venv.glob("lib/python3*/site-packages"))
    record = (site / f"egpu_probe-{version}.dist-info/RECORD").read_text()
    rows = [line.split(",") for line in record.splitlines() if line]
    assert any(path.endswith("/bin/egpu-probe") for path, *_ in rows)
    for path, _digest, size in rows:
        where = (site / path).resolve()
        assert where.is_file(), path
        if size:
            assert where.stat().st_size == int(size), path
    out = subprocess.run([venv / "bin/egpu-probe"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == version


def test_a_power_cut_right_after_the_step_keeps_what_it_installed(
    tmp_path: Path, index: _pypi_index.LocalIndex
) -> None:
    """The cut comes the moment the run returns, well inside ext4's 5 s commit interval: only
    what the step made durable itself (syncfs) survives it."""
    with loop_ext4(tmp_path) as fs:
        venv = fs.mount / "venv"
        _plan, result = install_torch(venv, PROBE, index.url)
        assert [s.status for s in result.steps] == ["done"]
        fs.power_cut()
        _record_complete(venv, "1.0")
        assert incomplete_distributions(LiveHost(), str(venv)) == {}
        assert plan_torch(venv, PROBE, index.url).steps == ()


def test_a_power_cut_mid_install_converges_on_the_next_run(
    tmp_path: Path, index: _pypi_index.LocalIndex
) -> None:
    """The venv's own pip upgrades to 1.1 behind egpu-setup's back (nothing syncs it) and the
    power goes at once: whatever the disk kept, the next run ends with 1.1 whole."""
    with loop_ext4(tmp_path) as fs:
        venv = fs.mount / "venv"
        install_torch(venv, PROBE, index.url)
        subprocess.run(
            [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--index-url", index.url]
            + ["egpu-probe==1.1"],
            check=True,
            capture_output=True,
        )
        fs.power_cut()
        install_torch(venv, ("egpu-probe==1.1",), index.url)
        _record_complete(venv, "1.1")
        assert plan_torch(venv, ("egpu-probe==1.1",), index.url).steps == ()


# what each loss makes incomplete_distributions say
_LOST = {
    "RECORD": "no RECORD",
    "INSTALLER": "no INSTALLER",
    "script": "/bin/egpu-probe (listed in RECORD)",
    # a kill (or a power cut) while pip wrote the module: pip writes each file in place
    "short-file": "egpu_probe/__init__.py is 100 bytes, RECORD says",
    "missing-file": "egpu_probe/__init__.py is missing, RECORD says",
}


@pytest.mark.parametrize("lost", list(_LOST))
def test_a_half_installed_distribution_is_rebuilt(
    tmp_path: Path, index: _pypi_index.LocalIndex, lost: str
) -> None:
    """METADATA there but RECORD, INSTALLER, a console script RECORD lists, or a file of the
    package whole (the size RECORD gives) gone: the distribution is not counted, egpu-setup's
    own venv is rebuilt, and the run after is a no-op."""
    venv = tmp_path / "venv"
    install_torch(venv, PROBE, index.url)
    info = next(venv.glob("lib/python3*/site-packages/egpu_probe-1.0.dist-info"))
    module = info.parent / "egpu_probe/__init__.py"
    if lost == "short-file":
        with open(module, "r+b") as f:
            f.truncate(100)
    elif lost == "missing-file":
        module.unlink()
    else:
        (venv / "bin/egpu-probe" if lost == "script" else info / lost).unlink()
    host = LiveHost()
    assert "egpu-probe" not in (venv_versions(host, str(venv)) or {})
    broken = incomplete_distributions(host, str(venv))
    assert list(broken) == ["egpu_probe-1.0.dist-info"]
    assert _LOST[lost] in broken["egpu_probe-1.0.dist-info"]
    plan, result = install_torch(venv, PROBE, index.url)
    assert isinstance(plan.steps[0], PipInstall) and plan.steps[0].rebuild_venv
    assert any("egpu_probe-1.0.dist-info" in w for w in plan.warnings), plan.warnings
    assert [s.status for s in result.steps] == ["done"]
    _record_complete(venv, "1.0")
    assert plan_torch(venv, PROBE, index.url).steps == ()


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_corrupt_wheel_fails_and_the_fixed_index_then_succeeds(
    tmp_path: Path, installer: str
) -> None:
    """The index serves a wheel cut in half (listed with its own sha256, so only the unpacking
    finds it out): the run fails with error/hint and counts nothing done. The mirror then fixes
    the file at the same URL, and the next run installs the good one into the venv the first
    made: nothing of the bad wheel is reused from the installer's cache (uv kept it, and the
    next run failed on its hash, until egpu-setup cleaned it)."""
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("uv not on PATH (.ci/run installs it)")
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good = _pypi_index.build_wheel(tmp_path / "good", "egpu-probe", "1.0", script=True)
    bad = tmp_path / "bad" / good.name
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    venv = tmp_path / "venv"
    with _pypi_index.LocalIndex([bad]) as index:
        with pytest.raises(EgpuSetupError) as caught:
            install_torch(venv, PROBE, index.url, installer)
        assert caught.value.hint, caught.value.message
        assert "egpu-probe" not in (venv_versions(LiveHost(), str(venv)) or {})
        index.replace(bad, good)
        _plan, result = install_torch(venv, PROBE, index.url, installer)
        assert [s.status for s in result.steps] == ["done"]
        _record_complete(venv, "1.0")
        assert plan_torch(venv, PROBE, index.url).steps == ()
