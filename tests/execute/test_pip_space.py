"""The venv on a full or read-only filesystem (a small loop-mounted ext4): `error:` naming the
venv (and the space left), exit 1, no traceback, nothing half-made trusted, and the next run,
with space back or read-write again, ends with the distribution whole."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_setup.errors import EXIT_FAILED, EgpuSetupError
from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.installed import venv_versions
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
    # 4 MB of source (a 20 kB wheel): more than the blocks a filled filesystem still finds
    whl = _pypi_index.build_wheel(
        wheels, "egpu-probe", "1.0", body=f"PAD = {'a' * 4_000_000!r}\n", script=True
    )
    with _pypi_index.LocalIndex([whl]) as idx:
        yield idx


def _fill(mount: Path) -> Path:
    """Every block of the filesystem taken, root's reserve too (root writes into it)."""
    filler = mount / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 2**20)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def _converged(venv: Path, index: _pypi_index.LocalIndex) -> None:
    assert (venv_versions(LiveHost(), str(venv)) or {}).get("egpu-probe") == "1.0"
    out = subprocess.run([venv / "bin/egpu-probe"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1.0"
    assert plan_torch(venv, PROBE, index.url).steps == ()


@pytest.mark.parametrize("when", ["before-the-venv", "after-the-venv"])
def test_a_full_venv_filesystem_is_said_and_the_next_run_converges(
    tmp_path: Path, index: _pypi_index.LocalIndex, when: str
) -> None:
    with loop_ext4(tmp_path, 96) as fs:
        venv = fs.mount / "venv"
        if when == "after-the-venv":  # the venv made, then the disk fills up before torch
            subprocess.run(["python3", "-I", "-m", "venv", str(venv)], check=True)
        filler = _fill(fs.mount)
        with pytest.raises(EgpuSetupError) as caught:
            install_torch(venv, PROBE, index.url)
        exc = caught.value
        assert exc.message.startswith(f"{venv}: no space left on its filesystem ("), exc.message
        assert " MiB free)" in exc.message and exc.exit_code == EXIT_FAILED
        assert exc.hint is not None and "--venv PATH" in exc.hint
        assert "egpu-probe" not in (venv_versions(LiveHost(), str(venv)) or {})
        filler.unlink()
        install_torch(venv, PROBE, index.url)
        _converged(venv, index)


def test_a_read_only_venv_filesystem_is_said_and_the_next_run_converges(
    tmp_path: Path, index: _pypi_index.LocalIndex
) -> None:
    with loop_ext4(tmp_path, 96) as fs:
        venv = fs.mount / "venv"
        subprocess.run(["mount", "-o", "remount,ro", str(fs.mount)], check=True)
        with pytest.raises(EgpuSetupError) as caught:
            install_torch(venv, PROBE, index.url)
        assert caught.value.message == (
            f"{venv} is on a read-only filesystem: the venv could not be written"
        )
        assert caught.value.exit_code == EXIT_FAILED
        subprocess.run(["mount", "-o", "remount,rw", str(fs.mount)], check=True)
        install_torch(venv, PROBE, index.url)
        _converged(venv, index)


def test_a_read_only_state_directory_is_said_and_the_next_run_converges(
    tmp_path: Path, index: _pypi_index.LocalIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EGPU_SETUP_STATE_DIR on a read-only filesystem: the run stops at its lock, before any
    change, naming the lock and saying what to make writable; read-write again, it runs."""
    venv = tmp_path / "venv"
    with loop_ext4(tmp_path, 16) as fs:
        state = fs.mount / "state"
        state.mkdir()
        monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
        subprocess.run(["mount", "-o", "remount,ro", str(fs.mount)], check=True)
        with pytest.raises(EgpuSetupError) as caught:
            install_torch(venv, PROBE, index.url)
        assert caught.value.message == (
            f"the run lock {state}/egpu-setup.lock cannot be opened: Read-only file system"
        )
        assert caught.value.hint is not None
        assert caught.value.hint.startswith(f"make {state} writable")
        assert caught.value.exit_code == EXIT_FAILED and not venv.exists()
        subprocess.run(["mount", "-o", "remount,rw", str(fs.mount)], check=True)
        install_torch(venv, PROBE, index.url)
        _converged(venv, index)


# A checkout under /tmp (a clean clone often is) would vanish under the small /tmp: it is bound
# back at its own path, so this Python and egpu_setup still load from it.
_SMALL_TMP_CHILD = """
import os, subprocess, sys
sys.path.insert(0, {tests!r})
repo, old = {repo!r}, {old!r}
under_tmp = repo.startswith("/tmp/")
if under_tmp:
    os.makedirs(old)
    subprocess.run(["mount", "--bind", "/tmp", old], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", "/tmp"], check=True)
if under_tmp:
    os.makedirs(repo)
    subprocess.run(["mount", "--bind", old + repo[len("/tmp"):], repo], check=True)
from pathlib import Path
from helpers.pip_install import install_torch
install_torch(Path({venv!r}), ("egpu-probe==1.0",), {index!r})
"""


def test_a_small_tmp_cannot_fail_the_install(tmp_path: Path) -> None:
    """In a mount namespace of its own, /tmp is a 4 MiB tmpfs (room for ensurepip's pip wheel)
    and the wheel is 6 MB that does not compress: pip downloads into TMPDIR, which the step points
    into the venv
    (PipInstall.temp_dir, the filesystem preflight counted), so the install goes through and
    leaves no temp directory behind."""
    import base64
    import shutil
    import sys
    import tempfile

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1)")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pad = base64.b64encode(os.urandom(4_500_000)).decode()
    whl = _pypi_index.build_wheel(wheels, "egpu-probe", "1.0", f"PAD = {pad!r}\n", script=True)
    assert whl.stat().st_size > 5 * 2**20  # more than all of /tmp
    # outside /tmp, which the child's namespace covers
    base = Path(tempfile.mkdtemp(prefix="egpu-setup-smalltmp-", dir="/var/tmp"))
    try:
        venv = base / "venv"
        code = _SMALL_TMP_CHILD.format(
            tests=str(Path(__file__).parents[1]),
            repo=str(Path(__file__).resolve().parents[2]),
            old=str(base / "old-tmp"),
            venv=str(venv),
            index="{index}",
        )
        with _pypi_index.LocalIndex([whl]) as idx:
            res = subprocess.run(
                [str(shutil.which("unshare")), "-m", "--propagation", "private", "--"]
                + [sys.executable, "-c", code.replace("'{index}'", repr(idx.url))],
                env={**os.environ, "EGPU_SETUP_STATE_DIR": str(base / "state")},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert res.returncode == 0, res.stderr[-3000:]
            assert not (venv / ".egpu-setup-tmp").exists()
            _converged(venv, idx)
    finally:
        shutil.rmtree(base, ignore_errors=True)
