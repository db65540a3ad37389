"""A mirror that stalls: the torch install gives up at its deadline (install
--download-timeout), names the host that stalled, and says what to do. The index here is real
and answers its pages at once; each wheel comes one byte every 2 s, which no read timeout (pip
--timeout, UV_HTTP_TIMEOUT) ever trips."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from egpu_setup.errors import EXIT_FAILED, EgpuSetupError
from helpers import pypi_index as _pypi_index
from helpers.pip_install import install_torch

DEADLINE = 10


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_trickling_index_is_given_up_at_the_deadline(tmp_path: Path, installer: str) -> None:
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("uv not on PATH (.ci/run installs it)")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    whl = _pypi_index.build_wheel(wheels, "egpu-probe", "1.0")
    venv = tmp_path / "venv"
    with _pypi_index.LocalIndex([whl], trickle=2.0) as idx:
        start = time.monotonic()
        with pytest.raises(EgpuSetupError) as caught:
            install_torch(venv, ("egpu-probe==1.0",), idx.url, installer, download_timeout=DEADLINE)
        took = time.monotonic() - start
        assert any(p.startswith("/files/egpu_probe-1.0") for p in idx.requests)
    exc = caught.value
    assert exc.message.startswith("torch's install from 127.0.0.1 did not finish within 10 s")
    assert exc.hint is not None and "--download-timeout" in exc.hint
    assert exc.exit_code == EXIT_FAILED
    # the deadline and the venv's creation (a few seconds on a loaded 2-core machine), no more
    assert took < DEADLINE + 30, took
