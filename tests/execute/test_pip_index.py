"""torch through a PEP 503 index on 127.0.0.1 into a fresh venv, with pip and with uv."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_setup.execute.pip import commands, installer_env
from egpu_setup.plan.steps import PipInstall
from egpu_setup.state.paths import StatePaths
from helpers import pypi_index as _pypi_index
from helpers.pip_install import install_torch, plan_torch

_plan = plan_torch
_install = install_torch


@pytest.fixture
def small_index(tmp_path: Path) -> Iterator[_pypi_index.LocalIndex]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    whl = [_pypi_index.build_wheel(wheels, "egpu-probe", v) for v in ("1.0", "1.1")]
    with _pypi_index.LocalIndex(whl) as idx:
        yield idx


def test_commands_use_one_index_and_never_break_system_packages() -> None:
    step = PipInstall(
        "/opt/v", ("torch==2.13.0+cpu",), "https://example.invalid/whl/cpu", True, "python3"
    )
    for uv in (None, "/usr/bin/uv"):
        argvs = commands(step, uv)
        flat = [a for argv in argvs for a in argv]
        assert flat.count("--index-url") == 1
        assert "--extra-index-url" not in flat and "--break-system-packages" not in flat
        # both compile bytecode: pip by default (never --no-compile), uv when asked
        assert "--no-compile" not in flat
        assert ("--compile-bytecode" in argvs[-1]) == (uv is not None)
    offline = PipInstall(
        "/opt/v", (), "", True, "python3", find_links="/b/wheels", requirements_file="/b/req.txt"
    )
    assert "--compile-bytecode" in commands(offline, "/usr/bin/uv")[-1]
    env = installer_env()
    assert env["PIP_CONFIG_FILE"] == "/dev/null" and "PIP_FIND_LINKS" not in env


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_small_wheel_from_the_local_index_then_no_installer(
    tmp_path: Path, small_index: _pypi_index.LocalIndex, installer: str
) -> None:
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("uv not on PATH")
    venv = tmp_path / "venv"
    plan, result = _install(venv, ("egpu-probe==1.0",), small_index.url, installer)
    assert [s.kind for s in plan.steps] == ["pip-install"]
    assert isinstance(plan.steps[0], PipInstall) and plan.steps[0].create_venv
    assert result.steps[0].detail == f"with {installer}"
    assert any("/simple/egpu-probe/" in r for r in small_index.requests)
    # compiled at install time, before anything imported it (pip by default, uv as asked)
    site = next(venv.glob("lib/python3*/site-packages"))
    assert list((site / "egpu_probe" / "__pycache__").glob("__init__.*.pyc")), installer
    out = subprocess.run(
        [venv / "bin/python", "-c", "import egpu_probe; print(egpu_probe.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1.0"
    # second run: the venv already satisfies it, nothing to plan, no installer started
    n = len(small_index.requests)
    assert _plan(venv, ("egpu-probe==1.0",), small_index.url).steps == ()
    assert len(small_index.requests) == n
    # a changed pin is an upgrade in the same venv
    plan, _ = _install(venv, ("egpu-probe==1.1",), small_index.url, installer)
    assert isinstance(plan.steps[0], PipInstall) and not plan.steps[0].create_venv


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_our_own_source_variables_never_reach_the_installer(
    tmp_path: Path,
    small_index: _pypi_index.LocalIndex,
    installer: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PIP_FIND_LINKS (and friends) in egpu-setup's own environment would mix a second source
    into the install: a newer egpu-probe sits there, and only the index's may be installed."""
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("uv not on PATH")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _pypi_index.build_wheel(elsewhere, "egpu-probe", "9.9")
    monkeypatch.setenv("PIP_FIND_LINKS", str(elsewhere))
    monkeypatch.setenv("UV_FIND_LINKS", str(elsewhere))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", elsewhere.as_uri())
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", elsewhere.as_uri())
    venv = tmp_path / "venv"
    _install(venv, ("egpu-probe",), small_index.url, installer)
    out = subprocess.run(
        [venv / "bin/python", "-c", "import egpu_probe; print(egpu_probe.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1.1"


def test_a_non_venv_target_is_refused(tmp_path: Path, small_index: _pypi_index.LocalIndex) -> None:
    from egpu_setup.errors import EgpuSetupError

    fake = tmp_path / "sys"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin/python").symlink_to(sys.executable)
    with pytest.raises(EgpuSetupError, match="not a virtual environment"):
        _install(fake, ("egpu-probe==1.0",), small_index.url, "pip")


@pytest.mark.slow
@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_torch_cpu_from_a_loopback_index(tmp_path: Path, installer: str) -> None:
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("uv not on PATH")
    wheels = _pypi_index.download_torch(_pypi_index.cache_dir())
    with _pypi_index.LocalIndex(wheels) as idx:
        venv = tmp_path / "venv"
        _install(venv, ("torch==2.13.0+cpu",), idx.url, installer)
        assert any(r.startswith("/files/torch-2.13.0") for r in idx.requests)
        out = subprocess.run(
            [
                venv / "bin/python",
                "-c",
                "import torch; print(torch.__version__, torch.cuda.is_available())",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == ["2.13.0+cpu", "False"]
        assert _plan(venv, ("torch==2.13.0+cpu",), idx.url).steps == ()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_second_root_venv_takes_the_wheel_from_the_state_cache_not_the_index(
    tmp_path: Path, small_index: _pypi_index.LocalIndex, installer: str
) -> None:
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("uv not on PATH")
    wheel = "/files/egpu_probe-1.0-py3-none-any.whl"
    _install(tmp_path / "first", ("egpu-probe==1.0",), small_index.url, installer)
    assert wheel in small_index.requests  # uv asks for it more than once (Range requests)
    cache = StatePaths.for_root(Path("/")).wheel_cache
    for d in (cache, cache / installer):  # root's alone: a user could plant a wheel in it
        info = d.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, os.geteuid())
    n = len(small_index.requests)
    _install(tmp_path / "second", ("egpu-probe==1.0",), small_index.url, installer)
    if installer == "pip":  # pip keeps an HTTP response only when the server says it may
        return  # (ETag, Cache-Control); http.server sends neither
    assert any((cache / installer).iterdir())
    # the project page is asked again (the pin could have moved), the wheel is not fetched
    assert wheel not in small_index.requests[n:]
    site = next((tmp_path / "second").glob("lib/python3*/site-packages"))
    assert (site / "egpu_probe" / "__init__.py").is_file()
