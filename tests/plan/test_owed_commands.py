"""A run killed after writing a trigger file but before its follow-up command owes that command:
the next run plans it again and clears the debt only when it ran (it converges)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from conftest import REPO
from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import Plan, RunCommand
from egpu_setup.render.files import HostCommand
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import install_values as values
from helpers import kill_points

NOUVEAU = values.rendered()[1]
INITRAMFS = HostCommand(("update-initramfs", "-u"), "rebuild the initramfs", after=(NOUVEAU.path,))
OPTS = PlanOptions(target="root", only=frozenset({"driver", "config"}))

SCRIPT = """
import sys
sys.path[:0] = [{tests!r}]
from helpers import install_values as values
from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.options import PlanOptions
from egpu_setup.render.files import HostCommand
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths

nouveau = values.rendered()[1]
cmd = HostCommand(("update-initramfs", "-u"), "rebuild the initramfs", after=(nouveau.path,))
host = RootHost({root!r})
paths = StatePaths.for_root(host.root)
opts = PlanOptions(target="root", only=frozenset({{"driver", "config"}}))
plan = build_plan(values.facts(), None, values.resolution(action="keep"), (nouveau,), host, opts,
                  Manifest.load(paths), (cmd,))
execute(plan, host, paths, ExecOptions())
"""


def plan_for(root: Path) -> Plan:
    host = RootHost(root)
    manifest = Manifest.load(StatePaths.for_root(host.root))
    return build_plan(
        values.facts(), values.profile(), values.resolution(action="keep"), (NOUVEAU,), host, OPTS, manifest,
        (INITRAMFS,),
    )  # fmt: skip


def test_a_command_owed_by_a_killed_run_is_run_by_the_next(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc/modprobe.d").mkdir(parents=True)
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    ref = tmp_path / "ref"
    shutil.copytree(root, ref, symlinks=True)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # the same calls in every run

    def argv(r: Path) -> list[str]:
        return [sys.executable, "-c", SCRIPT.format(tests=str(REPO / "tests"), root=str(r))]

    done, found = kill_points.points(argv(ref), env=env)
    assert done.returncode == 0, done.stderr
    # the manifest's last save: the one that clears the debt once the command step ended
    clears = [
        p for p in found if p.syscall.startswith("rename") and p.args.endswith('"manifest.json"')
    ]
    res = kill_points.kill_at(clears[-1], argv(root), env=env)
    assert kill_points.killed(res), res.stderr  # killed as the manifest was to be told
    assert (root / NOUVEAU.path.lstrip("/")).exists()  # the trigger file was written
    paths = StatePaths.for_root(root)
    assert Manifest.load(paths).pending_commands() == (INITRAMFS.argv,)

    again = plan_for(root)
    assert [s.kind for s in again.steps] == ["run-command"]
    assert isinstance(again.steps[0], RunCommand) and again.steps[0].owed
    # update-initramfs is not in this image: the step is skipped, and that settles the debt
    execute(again, RootHost(root), paths, ExecOptions())
    assert Manifest.load(paths).pending_commands() == ()
    assert plan_for(root).steps == ()
