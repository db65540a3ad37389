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

from egpu_setup.detect.facts import HostFacts
from egpu_setup.host.dpkg_lock import lock_holder
from egpu_setup.host.machine import Host
from egpu_setup.plan.amd import amd_steps, is_amd_plan
from egpu_setup.plan.config import config_steps, link_steps
from egpu_setup.plan.driver import driver_steps
from egpu_setup.plan.hold import hold_steps
from egpu_setup.plan.installed import dpkg_interrupted
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, Plan, RebootNeeded, RunCommand, Step, WriteFile
from egpu_setup.plan.torch import torch_steps
from egpu_setup.plan.triggers import defer_triggers, run_triggers_once
from egpu_setup.profile.types import Profile
from egpu_setup.render.files import HostCommand, RenderedFile, RenderedLink
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.state.manifest import Manifest


def build_plan(
    facts: HostFacts,
    profile: Profile,
    resolution: Resolution,
    rendered_files: Sequence[RenderedFile],
    host: Host,
    options: PlanOptions,
    manifest: Manifest | None = None,
    commands: Sequence[HostCommand] = (),
    links: Sequence[RenderedLink] = (),
) -> Plan:
    """The steps that take `host` from what it is to what the profile and resolution ask for."""
    steps: list[Step] = []
    warnings: list[str] = []
    live = options.target == "live"
    interrupted = dpkg_interrupted(host) if "driver" in options.only else None
    holder = lock_holder(host) if interrupted else None
    if holder:
        # dpkg's journal and half-unpacked packages are what a *running* dpkg looks like too:
        # with the lock held, nothing was interrupted; the apt step waits for the lock, and a
        # run that finds dpkg's work unfinished after it plans the recovery then
        warnings.append(
            f"another package manager is running ({holder}), not an interrupted one: the "
            "install waits for it (--lock-timeout)"
        )
        interrupted = None
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
    if is_amd_plan(resolution):
        # amdgpu is in the kernel: the firmware, the user's groups, the torch venv (plan/amd.py);
        # its hot-plug files are render/amd.py's, none of NVIDIA's
        driver += amd_steps(host, options, warnings)
    file_steps, unit_steps, cmd_steps = config_steps(
        rendered_files, host, options, manifest, commands, facts
    )

    if "driver" in options.only:
        release, hold = hold_steps(resolution, profile, host, options, driver)
        steps += release + defer_triggers(driver) + hold
    # the commands that consume the files (initramfs, udev/systemd reloads) come right after
    # them: a torch download that fails or is interrupted must not leave them undone; the
    # driver's dpkg triggers run once after them all (plan/triggers.py)
    steps += file_steps + unit_steps + link_steps(links, host, options)
    steps += run_triggers_once(host, steps, cmd_steps)
    if "torch" in options.only:
        steps += torch_steps(resolution, host, options, warnings, facts)
    reboot = _reboot_reason(driver, file_steps, facts, options)
    if live and reboot:
        steps.append(RebootNeeded(reboot))
    return Plan(tuple(steps), tuple(warnings))


def _reboot_reason(
    driver: Sequence[Step], file_steps: Sequence[Step], facts: HostFacts, options: PlanOptions
) -> str | None:
    """Why this plan ends in a reboot: a new kernel module, module options a loaded module only
    reads when it loads again, or a reboot an earlier run asked for and did not get."""
    if "driver" in options.only and any(isinstance(s, AptInstall) for s in driver):
        if any("NVIDIA" in s.reason for s in driver if isinstance(s, AptInstall)):
            return "the new NVIDIA kernel module takes effect at the next boot"
        return "amdgpu reads the new GPU firmware when it starts the GPU (the next boot)"
    return module_config_reboot(facts, file_steps) or options.pending_reboot


def module_config_reboot(facts: HostFacts, file_steps: Sequence[Step]) -> str | None:
    """Why changed modprobe.d files need a reboot, or None: they only matter to a module that is
    loaded now (a module loaded later, when the eGPU appears, reads them then)."""
    written = {s.path for s in file_steps if isinstance(s, WriteFile)}
    nv = facts.nvidia
    nouveau_in_use = bool(nv.nouveau_loaded) or any(g.driver == "nouveau" for g in facts.gpus)
    if any("nouveau" in p for p in written if p.startswith("/etc/modprobe.d/")) and nouveau_in_use:
        return "nouveau holds the GPU now: the blacklist takes effect at the next boot"
    nvidia_conf = any(p.startswith("/etc/modprobe.d/") and "nouveau" not in p for p in written)
    if nvidia_conf and nv.module_loaded:
        return "the NVIDIA module options take effect when the module loads again (next boot)"
    return None
