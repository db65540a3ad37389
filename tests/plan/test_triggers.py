"""plan/triggers.py: the driver's apt step defers dpkg's triggers to one run after the files,
and the initramfs rebuild becomes an activation of the trigger that run processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from egpu_setup.host.machine import RootHost
from egpu_setup.plan.steps import AptInstall, RunCommand, WriteFile
from egpu_setup.plan.triggers import (
    INITRAMFS_REBUILD,
    INITRAMFS_TRIGGER,
    TRIGGER_RUN,
    defer_like,
    defer_triggers,
    owes_rebuild,
    run_triggers_once,
)

BLACKLIST = "/etc/modprobe.d/egpu-setup-nouveau.conf"
REBUILD = RunCommand(INITRAMFS_REBUILD, "rebuild", for_part="driver", triggers=(BLACKLIST,))
RELOAD = RunCommand(("udevadm", "control", "--reload"), "reload", live_only=True)


def _host(tmp_path: Path, update_initramfs: bool) -> RootHost:
    (tmp_path / "usr/sbin").mkdir(parents=True)
    if update_initramfs:
        tool = tmp_path / "usr/sbin/update-initramfs"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    return RootHost(tmp_path)


def test_only_the_drivers_apt_steps_defer_and_their_argv_says_no_triggers() -> None:
    driver = AptInstall(("nvidia-driver",))
    venv = AptInstall(("python3-venv",), for_part="torch")
    deferred, kept = defer_triggers([driver, venv])
    assert isinstance(deferred, AptInstall) and deferred.defer_triggers
    assert kept == venv
    argv = deferred.argv()
    assert argv[argv.index("install") - 2 : argv.index("install")] == [
        "-o",
        "Dpkg::Options::=--no-triggers",
    ]
    assert "Dpkg::Options::=--no-triggers" not in driver.argv()


def test_the_rebuild_becomes_an_activation_and_the_trigger_run_comes_last(
    tmp_path: Path,
) -> None:
    host = _host(tmp_path, update_initramfs=True)
    before = defer_triggers(
        [
            AptInstall(("nvidia-driver",)),
            WriteFile(BLACKLIST, "x", 0o644, "blacklist", "create", ""),
        ]
    )
    out = run_triggers_once(host, before, [REBUILD, RELOAD])
    assert [s.argv for s in out if isinstance(s, RunCommand)] == [
        INITRAMFS_TRIGGER,
        RELOAD.argv,
        TRIGGER_RUN,
    ]
    run = out[-1]
    assert isinstance(run, RunCommand) and run.triggers == (BLACKLIST,)  # owed until it ran
    assert run.part_name == "driver"


@pytest.mark.parametrize("apt_deferred, tool", [(False, True), (True, False)])
def test_without_a_deferred_apt_step_or_initramfs_tools_the_rebuild_stays(
    tmp_path: Path, apt_deferred: bool, tool: bool
) -> None:
    host = _host(tmp_path, update_initramfs=tool)
    apt = AptInstall(("nvidia-driver",))
    before = defer_triggers([apt]) if apt_deferred else [apt]
    out = run_triggers_once(host, before, [REBUILD])
    argvs = [s.argv for s in out if isinstance(s, RunCommand)]
    assert argvs[0] == INITRAMFS_REBUILD
    assert (TRIGGER_RUN in argvs) == apt_deferred


@pytest.mark.parametrize("owed", [INITRAMFS_REBUILD, INITRAMFS_TRIGGER, TRIGGER_RUN])
def test_a_run_killed_before_the_trigger_run_still_owes_the_rebuild(
    owed: tuple[str, ...],
) -> None:
    assert owes_rebuild(INITRAMFS_REBUILD, {owed})
    assert not owes_rebuild(RELOAD.argv, {owed})
    assert not owes_rebuild(INITRAMFS_REBUILD, {RELOAD.argv})


def test_an_apt_step_between_the_drivers_and_the_trigger_run_defers_too() -> None:
    """An image's python3-venv goes right after the driver's apt step (image/additions.py):
    an apt-get there running dpkg's pending triggers would build the initramfs before the
    files are written."""
    venv = AptInstall(("python3-venv",), for_part="config")
    deferred = defer_triggers([AptInstall(("nvidia-driver",))])
    (after,) = defer_like(deferred, [venv])
    assert isinstance(after, AptInstall) and after.defer_triggers
    assert defer_like([AptInstall(("nvidia-driver",))], [venv]) == [venv]


def test_the_image_plan_puts_python3_venv_inside_the_deferred_span() -> None:
    from egpu_setup.image.additions import insert_early
    from egpu_setup.plan.steps import Plan

    plan = Plan((*defer_triggers([AptInstall(("nvidia-driver",))]), REBUILD))
    venv = AptInstall(("python3-venv",), for_part="config")
    steps = insert_early(plan, [venv]).steps
    assert [s.packages for s in steps if isinstance(s, AptInstall)] == [
        ("nvidia-driver",),
        ("python3-venv",),
    ]
    assert all(s.defer_triggers for s in steps if isinstance(s, AptInstall))
