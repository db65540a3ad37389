"""A small system root the executor writes into, and one install run of the hand-made rendered
set (helpers.install_values.rendered) over it: shared by the executor and rollback tests, and run
in a child process by the kill -9 test."""

from __future__ import annotations

from pathlib import Path

from egpu_setup.execute.executor import ExecOptions, ExecResult, execute
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import Plan
from egpu_setup.state.lock import RunLock
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import install_values as values

ONLY = frozenset({"driver", "config"})
USER_XORG = b'Section "Device"\n  Identifier "mine"\nEndSection\n'
PRIOR_UDEV = b"# the admin's own rule that happened to have our name\n"


def make_root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    for d in (
        "etc/udev/rules.d",
        "etc/modprobe.d",
        "etc/systemd/system",
        "etc/X11",
        "usr/local/bin",
    ):
        (r / d).mkdir(parents=True)
    (r / "etc/X11/xorg.conf").write_bytes(USER_XORG)  # the user's own: never touched
    return r


def plan_for(root: Path, force: bool = False) -> tuple[RootHost, StatePaths, Plan]:
    host = RootHost(root)
    paths = StatePaths.for_root(root)
    manifest = Manifest.load(paths)
    plan = build_plan(
        values.facts(),
        values.profile(),
        values.resolution(action="keep"),
        values.rendered(),
        host,
        PlanOptions(only=ONLY, target="root", force=force),
        manifest,
    )
    return host, paths, plan


def run(root: Path, force: bool = False) -> ExecResult:
    host, paths, plan = plan_for(root, force)
    with RunLock(paths.lock):
        return execute(plan, host, paths, ExecOptions(force=force), progress=lambda _t: None)
