"""An AMD Radeon eGPU's install into a real Debian 12 root (debootstrap), then rollback.

The facts are the recorded OCuLink RX 7900 XTX host's (tests/fixtures/hosts/
oculink-rx7900xtx-debian12), the resolution the real resolver's for them, the files
render/amd.py's: what `install --root ROOT --profile rx7900xtx` plans for that laptop. Everything
runs for real in the root: the deb822 drop-in that adds `non-free-firmware` (a debootstrap root
has `main` only, as a fresh Debian may), apt installing the real firmware-amd-graphics from the
machine's own Debian mirror, gpasswd for a user that exists in the root, the udev rule, and
torch into the venv by `--index-url` from a loopback PEP 503 index. The ROCm wheels (GBs) are
not reachable from here: the index serves stand-ins with the real names and tags
(torch-2.8.0+rocm6.4-cp311-cp311-manylinux_2_28_x86_64.whl, the form the PyTorch index lists)
and torch's ROCm-only dependency pytorch-triton-rocm; its pure-Python dependencies (sympy,
networkx, ...) are left out of the stand-in's metadata, as the index does not serve them.

Before it, the user is in a `render` group already (as on a system whose udev made one and an
admin added them): install adds only `video`, and `rollback --packages` (the code `rollback
--root ROOT --yes --packages` runs) returns the root to what it was: /etc byte for byte (the
user out of video again, still in render; shadow-utils' own `group-` / `gshadow-` backup copies
aside) and dpkg's package list.

Slow: the root (bookworm + python3 + a user) is built once and cached under
$EGPU_SETUP_TEST_CACHE/debroot/amd-bookworm (about 55 s the first time, from the cached
bookworm root); each run then copies it and fetches the firmware (~25 s here, warm cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.host.machine import RootHost
from egpu_setup.install.inputs import constraints
from egpu_setup.install.options import InstallOptions
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.installed import installed_packages
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, AptRepository, Plan
from egpu_setup.profile.load import load_profile
from egpu_setup.render.amd import render_amd_set
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.resolve.resolver import resolve
from egpu_setup.rollback.core import RollbackOptions, apply_rollback, plan_rollback
from egpu_setup.state.lock import RunLock
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import debroot as _debroot
from helpers.facts import recorded
from helpers.pypi_index import LocalIndex, build_wheel

pytestmark = pytest.mark.debootstrap

USER = "student"  # the recorded host's SUDO_USER (meta.json)
TAG = "cp311-cp311-manylinux_2_28_x86_64"
# gfx1100 (Navi 31) firmware that firmware-amd-graphics 20230210-5 ships (its file list on
# https://packages.debian.org/bookworm/all/firmware-amd-graphics/filelist)
FIRMWARE = "usr/lib/firmware/amdgpu/gc_11_0_0_mec.bin"


def _prepare(work: Path) -> None:
    """What the laptop has before egpu-setup: python3 (no ensurepip) and the person who trains."""
    for argv in (
        ("apt-get", "install", "-y", "--no-install-recommends", "python3"),
        ("useradd", "-m", "-u", "1000", "-s", "/bin/bash", USER),
        ("apt-get", "clean"),
    ):
        done = _debroot.chroot(work, *argv)
        if done.returncode != 0:
            raise _debroot.DebrootUnavailable(f"{argv}: {done.stderr[-500:]}")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    try:
        src = _debroot.derived_root("bookworm", "amd-bookworm", _prepare)
    except _debroot.DebrootUnavailable as exc:
        pytest.skip(str(exc))
    dest = _debroot.layered_copy(src, tmp_path / "root")
    (dest / _debroot._MARKER).unlink()
    return dest


def _standins(directory: Path) -> list[Path]:
    directory.mkdir()
    return [
        build_wheel(
            directory, "torch", "2.8.0+rocm6.4", tag=TAG, requires=("pytorch-triton-rocm==3.4.0",)
        ),
        build_wheel(directory, "pytorch-triton-rocm", "3.4.0", tag=TAG),
        build_wheel(
            directory, "torchvision", "0.23.0+rocm6.4", tag=TAG, requires=("torch==2.8.0",)
        ),
    ]


def _plan(root: Path, index_url: str) -> tuple[Resolution, RootHost, StatePaths, Plan]:
    facts = recorded("oculink-rx7900xtx-debian12")
    profile = load_profile("rx7900xtx")
    options = InstallOptions(profile="rx7900xtx", torch_spec="2.8.0")
    resolution = resolve(facts, profile, constraints(options, profile))
    rendered = render_amd_set(facts, profile, profile.mode)
    host = RootHost(root)
    paths = StatePaths.for_root(root)
    plan = build_plan(
        facts,
        profile,
        resolution,
        rendered.files,
        host,
        PlanOptions(target="root", index_url=index_url, sudo_user=USER, sudo_uid=1000),
        Manifest.load(paths),
        rendered.commands,
    )
    return resolution, host, paths, plan


def _already_in_render(root: Path) -> None:
    """The membership the user had before egpu-setup: rollback must leave it."""
    for argv in (("groupadd", "-r", "render"), ("gpasswd", "-a", USER, "render")):
        done = _debroot.chroot(root, *argv)
        assert done.returncode == 0, done.stderr


def test_amd_install_into_a_debian_root_then_rollback(root: Path, tmp_path: Path) -> None:
    _already_in_render(root)
    etc_before = _debroot.snapshot(root, "etc")
    packages_before = installed_packages(RootHost(root))
    with LocalIndex(_standins(tmp_path / "wheels")) as index:
        resolution, host, paths, plan = _plan(root, index.url)
        assert resolution.torch is not None and resolution.torch.variant == "rocm6.4"
        assert resolution.torch.requirements[0] == "torch==2.8.0+rocm6.4"
        kinds = [s.kind for s in plan.steps]
        (repo,) = [s for s in plan.steps if isinstance(s, AptRepository)]
        assert (
            "Components: non-free-firmware" in repo.content and "Suites: bookworm" in repo.content
        )
        assert [s.packages for s in plan.steps if isinstance(s, AptInstall)] == [
            ("firmware-amd-graphics",),
            ("python3.11-venv",),  # minbase's python3 has no ensurepip, as a stock Debian
        ]
        with RunLock(paths.lock):
            result = execute(plan, host, paths, ExecOptions(installer="pip"), lambda _t: None)
        assert {s.status for s in result.steps} <= {"done", "skipped"}, result.steps
        assert kinds == [
            "apt-repository",
            "apt-install",
            "run-command",  # gpasswd -a student video: render it has already
            "write-file",
            "run-command",  # the firmware's deferred dpkg triggers, once (plan/triggers.py)
            "apt-install",
            "pip-install",
        ]
        # the torch came from the loopback index only, by --index-url
        assert f"/files/torch-2.8.0%2Brocm6.4-{TAG}.whl" in index.requests, index.requests

    installed = installed_packages(RootHost(root))
    assert {"firmware-amd-graphics", "python3.11-venv"} <= set(installed)
    assert (root / FIRMWARE).is_file()
    group = _debroot.chroot(root, "id", "-nG", USER).stdout.split()
    assert sorted(group) == sorted([USER, "video", "render"]), group
    # recorded with its undo (in the manifest before gpasswd ran): video only, never render
    assert Manifest.load(paths).commands == [
        {
            "argv": ["gpasswd", "-a", USER, "video"],
            "undo": ["gpasswd", "-d", USER, "video"],
            "run": result.run_id,
        }
    ]
    rule = (root / "etc/udev/rules.d/71-egpu-setup.rules").read_text()
    assert 'ATTR{vendor}=="0x1002", ATTR{device}=="0x744c"' in rule
    assert 'ATTR{power/control}="on"' in rule
    py = "/opt/egpu-setup/venv/bin/python"
    shown = _debroot.chroot(root, py, "-c", "import torch, torchvision; print(torch.__version__)")
    assert shown.stdout.strip() == "2.8.0+rocm6.4", shown.stderr

    # second run: nothing left to do
    with LocalIndex(_standins(tmp_path / "wheels2")) as index:
        _, _, _, again = _plan(root, index.url)
    assert again.steps == ()

    outcome = apply_rollback(
        plan_rollback(RollbackOptions(yes=True, root_dir=str(root), packages=True))
    )
    assert [(f.argv, f.status) for f in outcome.followups] == [
        (("gpasswd", "-d", USER, "video"), "done")
    ]
    after = _debroot.snapshot(root, "etc")
    # shadow-utils copies the file it edits to group- / gshadow- (gpasswd(1)): not ours to undo
    backups = {"etc/group-", "etc/gshadow-"}
    assert {k: v for k, v in after.items() if k not in backups} == {
        k: v for k, v in etc_before.items() if k not in backups
    }
    assert sorted(_debroot.chroot(root, "id", "-nG", USER).stdout.split()) == sorted(
        [USER, "render"]
    )
    assert Manifest.load(paths).commands == []
    assert installed_packages(RootHost(root)) == packages_before
    assert not (root / "opt/egpu-setup/venv").exists()
    assert not (root / FIRMWARE).exists()


def test_a_membership_that_failed_or_is_gone_leaves_nothing_to_undo(root: Path) -> None:
    """gpasswd refusing (no such group) leaves no record; a recorded membership someone took
    back since is done on rollback without running gpasswd again (it would fail: not a member)."""
    from egpu_setup.errors import ExecutionError
    from egpu_setup.plan.steps import Plan, RunCommand

    host, paths = RootHost(root), StatePaths.for_root(root)
    group_before = (root / "etc/group").read_bytes()
    missing = RunCommand(("gpasswd", "-a", USER, "no-such-group"), "test", skip_if_missing=False)
    with RunLock(paths.lock), pytest.raises(ExecutionError, match="no-such-group"):
        execute(Plan((missing,)), host, paths, ExecOptions(), lambda _t: None)
    assert Manifest.load(paths).commands == []
    assert (root / "etc/group").read_bytes() == group_before

    video = RunCommand(("gpasswd", "-a", USER, "video"), "test", skip_if_missing=False)
    with RunLock(paths.lock):
        execute(Plan((video,)), host, paths, ExecOptions(), lambda _t: None)
    assert _debroot.chroot(root, "id", "-nG", USER).stdout.split() == [USER, "video"]
    done = _debroot.chroot(root, "gpasswd", "-d", USER, "video")  # an admin took it back
    assert done.returncode == 0, done.stderr
    outcome = apply_rollback(plan_rollback(RollbackOptions(yes=True, root_dir=str(root))))
    [followup] = outcome.followups
    assert (followup.argv, followup.status) == (("gpasswd", "-d", USER, "video"), "done")
    assert "nothing to undo" in followup.detail and not outcome.failed
    assert (root / "etc/group").read_bytes() == group_before
    assert Manifest.load(paths).commands == []
