"""The state directory on a full filesystem (a real tmpfs, a few pages): the journal or a
backup that cannot be written stops the run with `error:`/`hint:` naming the file and the
space, and the next run, with space back, finishes what the stopped one began (or begins it
again) and rolls back to the tree as it was."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_setup.errors import EXIT_FAILED, EgpuSetupError
from egpu_setup.execute.undo import apply_undo, plan_undo
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.steps import Plan
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers.debroot import snapshot
from helpers.execute_root import PRIOR_UDEV, make_root, plan_for, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

UDEV = "etc/udev/rules.d/71-egpu-setup.rules"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    mount = tmp_path / "state-fs"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", mount], check=True
    )
    try:
        monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(mount / "state"))
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=True)


def _fill(mount: Path, leave: int) -> Path:
    """All of the filesystem taken but about `leave` bytes."""
    filler = mount / "filler"
    free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave))
            f.flush()
            os.fsync(f.fileno())
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.mark.parametrize("full_at", ["journal", "backup"])
def test_a_full_state_directory_stops_the_run_and_the_next_one_finishes(
    tmp_path: Path, state: Path, full_at: str
) -> None:
    root = make_root(tmp_path)
    # a file of ours from before (it carries our name): replacing it backs it up first, and
    # with "backup" it is larger than the space left after the journal's first lines
    prior = PRIOR_UDEV + b"# egpu-setup\n" + b"# padding\n" * (20_000 if full_at == "backup" else 0)
    (root / UDEV).write_bytes(prior)
    before = snapshot(root, "etc"), snapshot(root, "usr")
    filler = _fill(state, 0 if full_at == "journal" else 64 * 1024)
    with pytest.raises(EgpuSetupError) as caught:
        run(root)
    exc = caught.value
    assert exc.exit_code == EXIT_FAILED
    assert "No space left on device" in exc.message, exc.message
    assert str(state / "state") in exc.message, exc.message
    assert exc.hint and "free" in exc.hint, exc.hint
    assert (root / UDEV).read_bytes() == prior  # never replaced without its backup
    filler.unlink()
    result = run(root)
    assert all(s.status in ("done", "skipped") for s in result.steps)
    _, _, again = plan_for(root)
    assert again.steps == ()
    paths = StatePaths.for_root(root)
    manifest = Manifest.load(paths)
    apply_undo(RootHost(root), manifest, plan_undo(RootHost(root), manifest))
    assert (snapshot(root, "etc"), snapshot(root, "usr")) == before


def test_a_venv_on_a_filesystem_too_small_is_refused_before_any_change(
    tmp_path: Path, state: Path
) -> None:
    """torch into a venv on a 256 KiB tmpfs: the dry run's figures name it, and preflight
    stops the run naming the path and both sizes, before the venv exists."""
    from egpu_setup.host.machine import LiveHost
    from egpu_setup.install.preflight import (
        TORCH_CPU_BYTES,
        TORCH_CPU_WHEELS,
        SpaceNeed,
        space_needs,
    )
    from helpers.pip_install import plan_torch

    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount], check=True)
    try:
        venv = mount / "venv"
        plan = plan_torch(venv, ("egpu-probe==1.0",), "http://127.0.0.1:9/simple/")
        free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
        needs = space_needs(plan, LiveHost())
        temp = f"{venv}/.egpu-setup-tmp"
        assert needs == (SpaceNeed((str(venv), temp), TORCH_CPU_BYTES + TORCH_CPU_WHEELS, free),)
        assert needs[0].short
        with pytest.raises(EgpuSetupError) as caught:
            _preflight(plan, venv, state)
        assert caught.value.message == (
            f"not enough disk space: about 1.2 GiB in {venv} and {temp} (0.0 GiB free); "
            "nothing was changed"
        )
        assert caught.value.hint and str(venv) in caught.value.hint
        assert not venv.exists()
    finally:
        subprocess.run(["umount", "-l", mount], check=True)


def _preflight(plan: Plan, venv: Path, state: Path) -> None:
    from egpu_setup.host.machine import LiveHost
    from egpu_setup.install.preflight import preflight
    from egpu_setup.plan.options import PlanOptions
    from helpers import install_values as values

    options = PlanOptions(only=frozenset({"torch"}), venv=str(venv), target="live")
    preflight(plan, LiveHost(), StatePaths.for_root(Path("/")), values.facts(), options)


def test_the_installers_temporary_files_are_counted_on_the_venvs_filesystem(
    tmp_path: Path,
) -> None:
    """A real tmpfs with room for torch's venv (TORCH_CPU_BYTES) but not for the wheels pip
    downloads into its TMPDIR beside it: refused, the temp directory named (a tmpfs takes no
    memory until written, so 1.1 GiB costs nothing here)."""
    from egpu_setup.host.machine import LiveHost
    from egpu_setup.install.preflight import TORCH_CPU_BYTES, TORCH_CPU_WHEELS, space_needs
    from helpers.pip_install import plan_torch

    mount = tmp_path / "venv-fs"
    mount.mkdir()
    size = TORCH_CPU_BYTES + TORCH_CPU_WHEELS // 2
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount], check=True)
    try:
        venv = mount / "venv"
        plan = plan_torch(venv, ("torch==2.13.0+cpu",), "http://127.0.0.1:9/simple/")
        (need,) = space_needs(plan, LiveHost())
        assert need.paths == (str(venv), f"{venv}/.egpu-setup-tmp")
        assert need.free is not None and TORCH_CPU_BYTES < need.free < need.need
        assert need.short
        with pytest.raises(EgpuSetupError) as caught:
            _preflight(plan, venv, tmp_path / "state")
        assert f"{venv}/.egpu-setup-tmp" in caught.value.message
        assert not venv.exists()
    finally:
        subprocess.run(["umount", "-l", mount], check=True)
