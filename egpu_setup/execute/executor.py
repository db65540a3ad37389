"""Run a plan: journal every step, write files atomically, keep what rollback needs.

The caller holds the run lock (state.RunLock) around planning *and* execution, so the plan is
never stale. Each step is recorded in the journal before it starts and after it ends; every step
is idempotent, so a run killed anywhere (kill -9, power loss) converges when run again: the next
plan is a fresh diff against the host, and temp files the dead run left are removed first.

A RebootNeeded step leaves state.VERIFY_MARKER on the target: egpu-setup-verify.service runs
once at the next boot when (and only while) it exists, consumes it and saves verify's report.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egpu_setup.detect.dpkg_status import HOLD_PIN, HOLD_UNATTENDED
from egpu_setup.errors import EgpuSetupError, ExecutionError
from egpu_setup.execute import apt as execute_apt
from egpu_setup.execute import files as execute_files
from egpu_setup.execute import hold as execute_hold
from egpu_setup.execute import pip as execute_pip
from egpu_setup.execute import tool as execute_tool
from egpu_setup.execute.console import show_line
from egpu_setup.host.machine import Host, RootHost
from egpu_setup.log import get_logger
from egpu_setup.plan.steps import (
    AptInstall,
    AptRepository,
    CopyFile,
    CreateLink,
    EnableUnit,
    HoldDriver,
    InstallTool,
    PipInstall,
    Plan,
    RebootNeeded,
    RunCommand,
    Step,
    WriteFile,
)
from egpu_setup.state.atomic import clean_temp_files
from egpu_setup.state.journal import Journal, new_run_id
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from egpu_setup.state.verify_marker import write_verify_marker

log = get_logger("egpu_setup.execute")

INSTALLER_ENV = "EGPU_SETUP_INSTALLER"  # auto (uv when on PATH) / uv / pip


@dataclass(frozen=True)
class ExecOptions:
    installer: str = "auto"  # auto (uv when on PATH) / uv / pip
    force: bool = False

    @classmethod
    def from_env(cls, *, force: bool = False) -> ExecOptions:
        """The lab's switch read from the environment (INSTALLER_ENV)."""
        return cls(
            installer=os.environ.get(INSTALLER_ENV, "auto"),
            force=force,
        )


@dataclass(frozen=True)
class StepResult:
    index: int
    kind: str
    description: str
    status: str  # done / skipped
    seconds: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "description": self.description,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


@dataclass
class ExecResult:
    run_id: str
    steps: list[StepResult] = field(default_factory=list)
    reboot_required: str | None = None
    resumed_from: str | None = None
    cleaned: list[str] = field(default_factory=list)


def boot_id(host: Host) -> str | None:
    if host.kind != "live":
        return None
    return host.read_attr("/proc/sys/kernel/random/boot_id")


def recover(
    host: Host, paths: StatePaths, plan: Plan, manifest: Manifest
) -> tuple[str | None, list[str]]:
    """After a dead run: name it, and remove the temp files it left next to its targets."""
    last = Journal(paths).last_run()
    resumed = None
    if last is not None and last.status == "running":
        at = last.interrupted_at
        where = (
            f" at step {at}: {last.steps[at]}" if at is not None and at < len(last.steps) else ""
        )
        resumed = f"run {last.run_id} was interrupted{where}"
        log.warning("%s; continuing from the host's current state", resumed)
    from egpu_setup.execute.undo import temp_dirs

    dirs = temp_dirs(host, manifest)
    for step in plan.steps:
        for p in _paths_of(step):
            dirs.add(execute_files.location(host, p).parent)
    dirs.add(paths.state_dir)
    dirs.add(paths.backups)
    cleaned = [str(p) for p in clean_temp_files(dirs, anchor=host.root)]
    for p in cleaned:
        log.warning("removed a temp file a dead run left: %s", p)
    return resumed, cleaned


def _paths_of(step: Step) -> list[str]:
    if isinstance(step, (WriteFile, CopyFile)):
        return [step.path]
    if isinstance(step, AptRepository):
        return [p for p in (step.sources_path, step.keyring_path, step.pin_path) if p]
    if isinstance(step, EnableUnit):
        return list(step.links)
    if isinstance(step, HoldDriver):
        return [HOLD_PIN, HOLD_UNATTENDED]
    return []


def execute(
    plan: Plan,
    host: Host,
    paths: StatePaths,
    options: ExecOptions,
    progress: Callable[[str], None] | None = None,
) -> ExecResult:
    """Apply every step in order; raise on the first failure (journaled, with what to do next)."""
    if plan.conflicts and not options.force:
        first = plan.conflicts[0]
        raise EgpuSetupError(
            f"{first.path} was changed by someone since egpu-setup wrote it (or is not ours)",
            "see the diff with `egpu-setup install --dry-run`; --force replaces it "
            f"(your version is kept in {paths.backups})",
        )
    # a normal user against root-owned state: `error: … needs root`, before anything is written
    paths.check_writable()
    manifest = Manifest.load(paths)
    journal = Journal(paths)
    result = ExecResult(new_run_id())
    result.resumed_from, result.cleaned = recover(host, paths, plan, manifest)
    if isinstance(host, RootHost):  # mounts or a policy-rc.d a killed run left inside the image
        result.cleaned += host.clean_leftovers()
    owed = [s for s in plan.steps if isinstance(s, RunCommand) and s.triggers]
    for command in owed:  # before any trigger file is written: a kill from here on leaves them owed
        manifest.add_pending_command(command.argv, result.run_id)
    if owed:
        manifest.save()
    journal.append(
        {
            "event": "run-begin",
            "run": result.run_id,
            "steps": [s.describe() for s in plan.steps],
            "target": str(host.root),
            "boot_id": boot_id(host),
        }
    )
    say = progress or (lambda text: log.warning("%s", text))
    ctx = execute_files.Context(host, manifest, result.run_id, options.force)
    for i, step in enumerate(plan.steps):
        say(f"[{i + 1}/{len(plan.steps)}] {step.describe()}")
        result.steps.append(_run_step(step, i, ctx, journal, paths, options))
        if isinstance(step, RebootNeeded):
            result.reboot_required = step.reason
    journal.append(
        {
            "event": "run-end",
            "run": result.run_id,
            "status": "reboot" if result.reboot_required else "ok",
            "reason": result.reboot_required,
            "boot_id": boot_id(host),
        }
    )
    return result


def _run_step(
    step: Step,
    i: int,
    ctx: execute_files.Context,
    journal: Journal,
    paths: StatePaths,
    options: ExecOptions,
) -> StepResult:
    """One step between its journal records; a failure is journaled and named with its step."""
    run = ctx.run_id
    journal.append({"event": "step-begin", "run": run, "step": i, "kind": step.kind})
    started = time.monotonic()
    try:
        status, detail = _apply(step, i, ctx, paths, options)
    except BaseException as exc:
        message = str(getattr(exc, "message", exc))[:500]
        journal.append({"event": "step-failed", "run": run, "step": i, "error": message})
        journal.append({"event": "run-end", "run": run, "status": "failed"})
        if isinstance(exc, ExecutionError):
            exc.message = f"step {i + 1} ({step.describe()}) failed: {exc.message}"
        elif isinstance(exc, OSError) and not isinstance(exc, EgpuSetupError):
            raise EgpuSetupError(
                f"step {i + 1} ({step.describe()}) failed: {exc}",
                "nothing half-written was left; fix the cause and run the same command again",
            ) from exc
        raise
    if isinstance(step, RunCommand) and status in ("done", "skipped"):
        ctx.manifest.clear_pending_command(step.argv)
        ctx.manifest.save()
    journal.append({"event": "step-done", "run": run, "step": i, "status": status})
    return StepResult(i, step.kind, step.describe(), status, time.monotonic() - started, detail)


def _apply(
    step: Step, index: int, ctx: execute_files.Context, paths: StatePaths, options: ExecOptions
) -> tuple[str, str]:
    host = ctx.host
    if isinstance(step, WriteFile):
        execute_files.write_managed(ctx, step.path, step.content.encode(), step.mode)
        return "done", ""
    if isinstance(step, CopyFile):
        execute_files.copy_managed(ctx, step.path, step.source, step.sha256, step.mode)
        return "done", ""
    if isinstance(step, EnableUnit):
        for link in step.links:
            execute_files.link_managed(ctx, link, step.unit_path)
        return "done", ""
    if isinstance(step, CreateLink):
        execute_files.link_managed(ctx, step.path, step.target)
        return "done", ""
    if isinstance(step, AptRepository):
        return execute_apt.add_repository(ctx, step)
    if isinstance(step, AptInstall):
        return execute_apt.install(ctx, step)
    if isinstance(step, HoldDriver):
        return execute_hold.hold(ctx, step)
    if isinstance(step, PipInstall):
        return execute_pip.install(ctx, step, options.installer, paths)
    if isinstance(step, InstallTool):
        return execute_tool.install(ctx, step)
    if isinstance(step, RunCommand):
        if step.live_only and host.kind != "live":
            return "skipped", "only on a running system"
        if host.which(step.argv[0]) is None:
            if step.skip_if_missing:
                return "skipped", f"{step.argv[0]} is not installed here: nothing to do"
            raise ExecutionError(f"{step.argv[0]} not found", "install it", argv=step.argv, rc=127)
        # dpkg --configure -a finishing a killed run's packages: their maintainer scripts ask
        # nothing and a changed conffile is kept, as in every apt run (execute/apt.py)
        env = execute_apt.APT_ENV if step.argv[0] == "dpkg" else None
        argv = list(step.argv)
        if argv[0] == "dpkg":
            argv[1:1] = ["--force-confdef", "--force-confold"]
        undo = undo_argv(step.argv)
        if undo is not None:
            # rollback takes it back (`boltctl forget`, `grubby --remove-args`, `gpasswd -d`):
            # recorded before it runs, so a run killed while it ran still owes the undo (an
            # undo whose change is not there is a no-op, rollback/core.py)
            ctx.manifest.add_command(list(step.argv), undo, ctx.run_id)
            ctx.manifest.save()
        try:
            host.run_checked(argv, timeout=1800, on_line=show_line, env=env)
        except ExecutionError:
            if undo is not None:  # it said it failed: nothing of it to take back
                ctx.manifest.forget_command(undo)
                ctx.manifest.save()
            raise
        return "done", ""
    if isinstance(step, RebootNeeded):
        write_verify_marker(host, ctx.run_id, step.reason)
        return "done", step.reason
    raise AssertionError(f"unknown step {step!r}")


def undo_argv(argv: tuple[str, ...] | list[str]) -> list[str] | None:
    """The command that takes back what `argv` did outside any file we manage, or None.

    `boltctl enroll [--policy P] UUID` stores the device in boltd's database (it is authorized
    at every connect from then on): `boltctl forget UUID` removes it (boltctl(1)).
    `grubby --update-kernel=ALL --args=A` edits every boot entry: `--remove-args=A` undoes it
    (grubby(8)). `gpasswd -a USER GROUP` adds USER to GROUP: `gpasswd -d USER GROUP` removes
    that one membership (gpasswd(1)).
    """
    argv = list(argv)
    if argv[:2] == ["gpasswd", "-a"] and len(argv) == 4:
        return ["gpasswd", "-d", argv[2], argv[3]]
    if argv[:2] == ["boltctl", "enroll"] and len(argv) > 2:
        return ["boltctl", "forget", argv[-1]]
    if argv and argv[0] == "grubby":
        args = [a.split("=", 1)[1] for a in argv if a.startswith("--args=")]
        kernels = [a for a in argv if a.startswith("--update-kernel=")]
        if args and kernels:
            return ["grubby", kernels[0], "--remove-args=" + args[0]]
    return None
