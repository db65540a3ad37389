"""What prepare gathers before it plans: the hosts, the flags checked together, the scope the
facts allow, the resolver's constraints, the rendered set, the manifest, the planner's options."""

from __future__ import annotations

import os

from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import UnsupportedHardware, UsageError
from egpu_setup.host.identity import sudo_caller
from egpu_setup.host.machine import Host, LiveHost, RootHost, open_host
from egpu_setup.image.tool import ToolChoice
from egpu_setup.install.enrol import bolt_can_enrol
from egpu_setup.install.offline import OfflineBundle
from egpu_setup.install.options import InstallOptions
from egpu_setup.plan.options import BundleSource, PlanOptions
from egpu_setup.profile.types import Profile
from egpu_setup.render.files import RenderSet
from egpu_setup.resolve.constraints import Constraints, constraints_from_profile
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from egpu_setup.state.tool_wheels import KeptWheels


def check_flags(options: InstallOptions, bundle: OfflineBundle | None) -> None:
    """Flags that cannot go together, before anything is read from the machine."""
    from egpu_setup.compat.index_url import check_index_url

    if not (options.profile or bundle):
        raise UsageError("--profile is required", "pass --profile NAME (or --bundle DIR)")
    if options.from_dir and not options.root_dir and not options.dry_run:
        raise UsageError(
            "--from describes another machine: a real install there needs --root DIR",
            "add --dry-run to see the plan for that machine, or --root DIR to build an image",
        )
    if options.index_url:
        check_index_url(options.index_url)
    if options.mok_key and not options.root_dir:
        raise UsageError(
            "--mok-key is for a lab image: it needs --root DIR",
            "on this machine DKMS signs with its own key; `sudo mokutil --import` it once",
        )


def hosts(options: InstallOptions) -> tuple[Host, Host]:
    """(the host the plan lands on, the host the facts come from).

    --root: an image (facts from --from when given, else the image itself); --from alone: a dry
    run against the recording's files; otherwise this machine for both."""
    target: Host
    if options.root_dir:
        target = RootHost(options.root_dir)
    elif options.from_dir:
        target = open_host(options.from_dir)
    else:
        target = LiveHost()
    return target, open_host(options.from_dir) if options.from_dir else target


def facts_of(target: Host, facts_host: Host) -> HostFacts:
    """What the plan is made from. An image (--root) with a recording (--from): the hardware
    (GPUs, Thunderbolt, Secure Boot) is the recorded machine's; the distribution, its kernel,
    its Python and its driver state are the image's own, since that is what gets installed
    into (a recording of an Ubuntu laptop must not plan Ubuntu packages into a Debian image)."""
    from dataclasses import replace

    from egpu_setup.detect.probe import detect_host

    if target.kind != "root" or facts_host is target:
        return detect_host(facts_host)
    image, hardware = detect_host(target), detect_host(facts_host)
    return replace(
        hardware,
        os=replace(image.os, secure_boot=hardware.os.secure_boot),
        python=image.python,
        nvidia=image.nvidia,
        source=image.source,
    )


def refuse_non_nvidia_egpu(facts: HostFacts) -> None:
    """CUDA needs NVIDIA, ROCm an AMD GPU (resolve/rocm.py): an Intel eGPU alone is outside what
    egpu-setup provisions."""
    if facts.nvidia_gpus:
        return
    other = [g for g in facts.gpus if g.external and g.vendor != "amd"]
    if other:
        g = other[0]
        what = g.name or ":".join(i for i in (g.vendor_id, g.device_id) if i)
        raise UnsupportedHardware(
            f"the external GPU at {g.pci_address} ({what}) is {g.vendor or 'not NVIDIA'}: "
            "egpu-setup provisions NVIDIA GPUs (CUDA) and AMD GPUs (ROCm)",
            "connect an NVIDIA eGPU and run again (`egpu-setup detect` shows what is seen)",
        )


def scope(
    facts: HostFacts, profile: Profile, only: frozenset[str]
) -> tuple[frozenset[str], list[str]]:
    """The parts the facts allow (WSL2: torch only). Which GPU the plan is for, and what to say
    about it, is the resolver's (resolve/target.py): one message, whatever the command."""
    warnings: list[str] = []
    if facts.os.wsl:
        # The Windows host owns the driver and the device: nothing to render or apt-install.
        if only - {"torch"}:
            warnings.append("WSL2: the Windows driver serves the GPU; planning the torch part only")
        only = only & frozenset({"torch"})
    return only, warnings


def constraints(options: InstallOptions, profile: Profile) -> Constraints:
    """The resolver's Constraints: the profile's, with our flags winning."""
    return constraints_from_profile(
        profile,
        torch_spec=options.torch_spec,
        cuda=options.cuda,
        rocm=options.rocm,
        driver_branch=options.driver_branch,
    )


def render(
    options: InstallOptions,
    facts: HostFacts,
    profile: Profile,
    resolution: Resolution,
    target: Host,
    only: frozenset[str],
    tool_path: str,
) -> RenderSet:
    """The configuration files, when the plan has a driver or config part; an image's set
    carries its first-boot unit (image/additions.py)."""
    from egpu_setup.image.additions import firstboot_for
    from egpu_setup.render.files import render_set
    from egpu_setup.render.sleep import probe_sleep_units

    if not only & {"driver", "config"}:
        return RenderSet(files=(), commands=(), notes=())
    if resolution.driver.action == "in-kernel":  # amdgpu: the AMD eGPU's own rule (render/amd.py)
        from egpu_setup.render.amd import render_amd_set

        return render_amd_set(facts, profile, options.mode or profile.mode)
    return render_set(
        facts,
        profile,
        resolution,
        options.mode or profile.mode,
        venv=options.venv_path,
        tool_path=tool_path,
        # choose_tool (image/tool.py) held the path to host/trust.py's rule already: the
        # units run a root-owned egpu-setup, or root's own /opt one, so no sudoers caveat
        tool_exposed=False,
        bolt_available=bolt_can_enrol(target),
        firstboot=firstboot_for(profile, options.enclosure) if target.kind == "root" else None,
        sleep_units_dir=probe_sleep_units(target),
    )


def tool_choice(
    options: InstallOptions,
    target: Host,
    facts: HostFacts,
    only: frozenset[str],
    bundle_tool: KeptWheels | None,
) -> ToolChoice:
    """The egpu-setup the units run (image/tool.py); its install steps only with the config
    part, which writes the units."""
    from egpu_setup.image.tool import choose_tool

    choice = choose_tool(
        target, facts.os.id, bundle_tool=bundle_tool, lock_timeout=options.lock_timeout
    )
    if "config" not in only:
        return ToolChoice(choice.path, ())
    return choice


def manifest(paths: StatePaths) -> tuple[Manifest, list[str]]:
    """The manifest the plan diffs against; a normal user's dry run goes on without root's."""
    try:
        return Manifest.load(paths), []
    except PermissionError:
        return Manifest(paths), [
            f"cannot read {paths.manifest} (not root): edits to our files not checked"
        ]


def pending_reboot(paths: StatePaths, target: Host) -> str | None:
    """The reboot the previous run asked for, when this machine has not booted since."""
    from egpu_setup.execute.executor import boot_id
    from egpu_setup.state.journal import Journal

    last = Journal(paths).last_run() if os.access(paths.state_dir, os.R_OK) else None
    if last is None or last.status != "reboot" or target.kind != "live":
        return None
    if last.boot_id and last.boot_id == boot_id(target):
        return "the previous run installed changes that need a reboot"
    return None


def plan_options(
    options: InstallOptions,
    target: Host,
    paths: StatePaths,
    only: frozenset[str],
    bundle: BundleSource | None,
    profile_hold: bool = False,
) -> PlanOptions:
    """The planner's options; the driver hold is the flag's when given, else the profile's."""
    caller = sudo_caller(target)  # SUDO_USER and SUDO_UID, when they name one account
    return PlanOptions(
        only=only,
        venv=options.venv_path,
        index_url=options.index_url,
        force=options.force,
        apt_lock_timeout=options.lock_timeout,
        download_timeout=options.download_timeout,
        # A recording is planned as the live machine it describes (it can never execute).
        target="root" if target.kind == "root" else "live",
        pending_reboot=pending_reboot(paths, target),
        sudo_user=caller[0] if caller else None,
        sudo_uid=caller[1] if caller else None,
        bundle=bundle,
        hold_driver=profile_hold if options.hold_driver is None else options.hold_driver,
    )


def stale_warning(paths: StatePaths) -> str | None:
    """Another run holds the lock: what it changes may make this plan stale."""
    from egpu_setup.state.lock import RunLock

    holder = RunLock(paths.lock).holder()
    if holder:
        return f"another run is in progress ({holder}): this plan may already be stale"
    return None
