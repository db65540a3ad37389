"""Install into real Debian 12/13 roots (debootstrap): the plan runs for real but for its
AptInstall step (the driver's ~300 packages), whose exact argv the test then gives to apt's own
simulation in the root (`apt-get -s`, apt-get(8)): apt must resolve nvidia-driver from the
components the run added. tests/install/test_apt_kill.py installs packages for real.

Slow: the roots are built once per session (~30 s each, cached under $EGPU_SETUP_TEST_CACHE).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.execute.undo import apply_undo, plan_undo
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, AptRepository, Plan
from egpu_setup.state.lock import RunLock
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import debroot as _debroot
from helpers import install_values as values

pytestmark = pytest.mark.debootstrap

USER_XORG = b'Section "Device"\n  Identifier "mine"\n  Driver "modesetting"\nEndSection\n'
RELEASES = {"bookworm": ("12", "535"), "trixie": ("13", "550")}


@pytest.fixture(params=sorted(RELEASES))
def debroot(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    try:
        root = _debroot.copy_root(request.param, tmp_path / request.param)
    except _debroot.DebrootUnavailable as exc:
        pytest.skip(str(exc))
    (root / "etc/X11").mkdir(parents=True, exist_ok=True)
    (root / "etc/X11/xorg.conf").write_bytes(USER_XORG)
    return request.param, root


def _plan(suite: str, root: Path) -> tuple[RootHost, StatePaths, Plan]:
    host = RootHost(root)
    paths = StatePaths.for_root(root)
    plan = build_plan(
        values.facts(codename=suite, version=RELEASES[suite][0]),
        values.profile(),
        values.resolution(),
        values.rendered(),
        host,
        PlanOptions(target="root", only=frozenset({"driver", "config"})),
        Manifest.load(paths),
    )
    return host, paths, plan


def test_install_into_a_debian_root_then_nothing_then_rollback(debroot: tuple[str, Path]) -> None:
    suite, root = debroot
    etc_before = _debroot.snapshot(root, "etc")
    host, paths, plan = _plan(suite, root)
    repo = [s for s in plan.steps if isinstance(s, AptRepository)]
    assert len(repo) == 1 and "Components: contrib non-free non-free-firmware" in repo[0].content
    assert f"Suites: {suite}" in repo[0].content
    apt = [s for s in plan.steps if isinstance(s, AptInstall)]
    assert apt and "nvidia-driver" in apt[0].packages and "linux-headers-amd64" in apt[0].packages

    rest = type(plan)(tuple(s for s in plan.steps if not isinstance(s, AptInstall)))
    with RunLock(paths.lock):
        result = execute(rest, host, paths, ExecOptions(), progress=lambda _t: None)
    assert "apt-install" not in {s.kind for s in result.steps}
    argv = apt[0].argv()
    sim = _debroot.chroot(root, argv[0], "-s", *argv[1:])
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-2000:]
    count = sum(1 for ln in sim.stdout.splitlines() if ln.startswith("Inst "))
    assert count > 200, sim.stdout[-2000:]  # ~300 with the driver's dependencies
    # apt really saw the non-free components: nvidia-driver resolved in the simulation
    assert "Inst nvidia-driver " in sim.stdout
    sources = (root / "etc/apt/sources.list.d/egpu-setup-debian-components.sources").read_text()
    assert "Signed-By:" not in sources or "/usr/share/keyrings/" in sources
    for rf in values.rendered():
        assert (root / rf.path.lstrip("/")).read_text() == rf.content
    assert (root / "etc/X11/xorg.conf").read_bytes() == USER_XORG

    # second run: no file, no source; only the packages (not installed here) remain, with the
    # run of the dpkg triggers their apt step defers (plan/triggers.py)
    _, _, again = _plan(suite, root)
    assert [s.kind for s in again.steps] == ["apt-install", "run-command"]

    manifest = Manifest.load(paths)
    apply_undo(host, manifest, plan_undo(host, manifest))
    assert _debroot.snapshot(root, "etc") == etc_before
    assert (root / "etc/X11/xorg.conf").read_bytes() == USER_XORG


def test_simulated_driver_version_matches_the_release(debroot: tuple[str, Path]) -> None:
    """The archive gives bookworm 535.x and trixie 550.x (apt-cache madison nvidia-driver)."""
    import subprocess

    suite, root = debroot
    host, paths, plan = _plan(suite, root)
    repo = next(s for s in plan.steps if isinstance(s, AptRepository))
    with RunLock(paths.lock):
        execute(type(plan)((repo,)), host, paths, ExecOptions(), progress=lambda _t: None)
    sim = subprocess.run(
        ["chroot", str(root), "apt-get", "-s", "install", "nvidia-driver"],
        capture_output=True,
        text=True,
        check=True,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert f"Inst nvidia-driver ({RELEASES[suite][1]}." in sim.stdout
