"""build_plan: the steps that take the host from what it is to what profile and resolution ask for.

Pure over its inputs (facts, profile, resolution, rendered files) plus what it *reads* through the
Host to diff: current file contents, the dpkg status database, apt sources, unit links, and the
torch version in an existing venv. So a second run on a converged machine plans nothing.

Order matters: package sources, packages, files, units, commands that consume files (initramfs,
reloads), the torch venv, and a reboot marker last, so a reboot never blocks the parts that do not
need it, and a failed torch download never leaves a written file's command undone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from egpu_setup.plan.config import config_steps, link_steps
from egpu_setup.plan.driver import driver_steps
from egpu_setup.plan.installed import dpkg_interrupted
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, Plan, RebootNeeded, RunCommand, Step, WriteFile
from egpu_setup.plan.torch import torch_steps


def build_plan(
    facts: Any,
    profile: Any,
    resolution: Any,
    rendered_files: Sequence[Any],
    host: Any,
    options: PlanOptions,
    manifest: Any = None,
    commands: Sequence[Any] = (),
    links: Sequence[Any] = (),
) -> Plan:
    """The steps that take `host` from what it is to what the profile and resolution ask for."""
    steps: list[Step] = []
    warnings: list[str] = []
    live = options.target == "live"
    interrupted = dpkg_interrupted(host) if "driver" in options.only else None
    if interrupted:
        # apt refuses to work until this is done (dpkg(1) --configure -a); doing it first is
        # what a person would do, and it is shown in the plan so nobody is surprised. The apt
        # step after it then reinstalls what dpkg could not finish (half-configured counts as
        # not installed there)
        steps.append(
            RunCommand(
                ("dpkg", "--configure", "-a"),
                interrupted,
                skip_if_missing=False,
                for_part="driver",
            )
        )

    driver = driver_steps(facts, resolution, host, options, warnings)
    file_steps, unit_steps, cmd_steps = config_steps(
        rendered_files, host, options, manifest, commands, facts
    )

    if "driver" in options.only:
        steps += driver
    # the commands that consume the files (initramfs, udev/systemd reloads) come right after
    # them: a torch download that fails or is interrupted must not leave them undone
    steps += file_steps + unit_steps + link_steps(links, host, options) + cmd_steps
    if "torch" in options.only:
        steps += torch_steps(resolution, host, options, warnings)
    wants_reboot = [s for s in driver if isinstance(s, AptInstall)] and "driver" in options.only
    module_reason = module_config_reboot(facts, file_steps)
    if live and (wants_reboot or module_reason):
        steps.append(
            RebootNeeded(
                "the new NVIDIA kernel module takes effect at the next boot"
                if wants_reboot
                else module_reason
            )
        )
    elif live and options.pending_reboot:
        steps.append(RebootNeeded(options.pending_reboot))
    return Plan(tuple(steps), tuple(warnings))


def module_config_reboot(facts: Any, file_steps: Sequence[Step]) -> str | None:
    """Why changed modprobe.d files need a reboot, or None: they only matter to a module that is
    loaded now (a module loaded later, when the eGPU appears, reads them then)."""
    written = {s.path for s in file_steps if isinstance(s, WriteFile)}
    nv = getattr(facts, "nvidia", None)
    gpus = getattr(facts, "gpus", ())
    nouveau_in_use = bool(nv and nv.nouveau_loaded) or any(g.driver == "nouveau" for g in gpus)
    if any("nouveau" in p for p in written if p.startswith("/etc/modprobe.d/")) and nouveau_in_use:
        return "nouveau holds the GPU now: the blacklist takes effect at the next boot"
    nvidia_conf = any(p.startswith("/etc/modprobe.d/") and "nouveau" not in p for p in written)
    if nvidia_conf and nv is not None and nv.module_loaded:
        return "the NVIDIA module options take effect when the module loads again (next boot)"
    return None
