"""Render the hot-plug configuration: udev, modprobe.d, systemd, shell helpers, Xorg, GRUB.

`render_set()` validates everything first (render_context.build_context), renders every file in
memory, and returns files plus the commands an installer runs after writing them. Nothing here
writes to disk: `egpu-setup render` writes the set under a directory, the executor writes it to
the host (render everything before writing anything: docs/design.md, "The pipeline").

Every file carries a header naming egpu-setup, the profile and the sha256 of its body, so that
rollback removes only our files and notices a hand edit (`classify_generated`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from egpu_setup.detect.facts import HostFacts
from egpu_setup.host.machine import Host
from egpu_setup.profile.types import Profile
from egpu_setup.render.context import DEFAULT_TOOL_PATH, FirstBoot, RenderContext, build_context
from egpu_setup.render.headers import add_header
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.state.paths import TORCH_VENV

if TYPE_CHECKING:
    import jinja2

# Where each file goes on the host and which template makes it.
UDEV_RULES = "/etc/udev/rules.d/71-egpu-setup.rules"


UDEV_TB_RULES = "/etc/udev/rules.d/61-egpu-setup-tb-authorize.rules"


MODPROBE_NOUVEAU = "/etc/modprobe.d/egpu-setup-nouveau.conf"


MODPROBE_NVIDIA = "/etc/modprobe.d/egpu-setup-nvidia.conf"


UNIT_WAIT = "/etc/systemd/system/egpu-setup-wait.service"


UNIT_HOTPLUG = "/etc/systemd/system/egpu-setup-hotplug.service"


UNIT_PERSISTENCED = "/etc/systemd/system/egpu-setup-persistenced.service"


UNIT_VERIFY = "/etc/systemd/system/egpu-setup-verify.service"


UNIT_FIRSTBOOT = "/etc/systemd/system/egpu-setup-firstboot.service"


UNIT_KERNELS = "/etc/systemd/system/egpu-setup-kernels.service"


UNIT_SLEEP = "/etc/systemd/system/egpu-setup-sleep.service"


UNIT_RESUME = "/etc/systemd/system/egpu-setup-resume.service"


UNIT_SLEEP_GUARD = "/etc/systemd/system/egpu-setup-sleep-guard.service"


APT_KERNELS_HOOK = "/etc/apt/apt.conf.d/99egpu-setup-kernels"


UNIT_HEALTH = "/etc/systemd/system/egpu-setup-health.service"


UNIT_HEALTH_TIMER = "/etc/systemd/system/egpu-setup-health.timer"


UDEV_FIRSTBOOT = "/etc/udev/rules.d/62-egpu-setup-firstboot.rules"


BIN_HOTPLUG = "/usr/local/bin/egpu-hotplug"


BIN_EJECT = "/usr/local/bin/egpu-eject"


# A managed symlink to XORG_RUNTIME, which the boot helper writes only while the eGPU is there.
# Xorg skips a config-dir entry it cannot open (hw/xfree86/parser/scan.c, AddConfigDirFiles:
# fopen fails -> next file), so the dangling link of a boot without the eGPU is ignored;
# tests/test_checkers.py checks this with the real Xorg.
XORG_DROPIN = "/etc/X11/xorg.conf.d/90-egpu-setup.conf"


GRUB_DROPIN = "/etc/default/grub.d/60-egpu-setup.cfg"


@dataclass(frozen=True)
class RenderedFile:
    """One generated file: its host path, full text, permission bits and why it exists."""

    path: str
    content: str
    mode: int
    purpose: str


@dataclass(frozen=True)
class RenderedLink:
    """A symlink at host path `path` pointing to `target` (absolute), managed like a file:
    install creates it, rollback removes it."""

    path: str
    target: str
    purpose: str


@dataclass(frozen=True)
class HostCommand:
    """A command the installer runs after writing the files (argv, never a shell string).

    `after`: run only when one of these rendered paths changed; empty: always (it is idempotent
    or the installer checks first). `consent`: ask before running (boot configuration).
    """

    argv: tuple[str, ...]
    purpose: str
    after: tuple[str, ...] = ()
    consent: bool = False


@dataclass(frozen=True)
class RenderSet:
    files: tuple[RenderedFile, ...]
    commands: tuple[HostCommand, ...]
    notes: tuple[str, ...]
    links: tuple[RenderedLink, ...] = ()


def _environment() -> jinja2.Environment:
    # Imported here: jinja2 stays off the CLI startup path (tests/test_startup.py).
    from importlib.resources import files

    import jinja2

    def load(name: str) -> str:
        return files("egpu_setup.templates").joinpath(name).read_text(encoding="utf-8")

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shquote"] = lambda v: shlex.quote(str(v))
    env.filters["shwords"] = lambda vs: shlex.quote(" ".join(str(v) for v in vs))
    return env


def _files_for(ctx: RenderContext) -> list[tuple[str, str, int, str]]:
    """(template, host path, mode, purpose) of every file this context renders."""
    return [*_always(ctx), *_optional(ctx)]


def _always(ctx: RenderContext) -> list[tuple[str, str, int, str]]:
    """The files every eGPU gets: udev and modprobe configuration, the units, the helpers."""
    return [
        (
            "udev/71-egpu-setup.rules.j2",
            UDEV_RULES,
            0o644,
            "eGPU udev rules: runtime PM off, module load and hot-plug unit on add"
            + ("; Wayland primary-GPU tag" if ctx.mode == "display" else ""),
        ),
        (
            "modprobe/egpu-setup-nouveau.conf.j2",
            MODPROBE_NOUVEAU,
            0o644,
            "blacklist nouveau so the nvidia driver can bind the eGPU",
        ),
        (
            "modprobe/egpu-setup-nvidia.conf.j2",
            MODPROBE_NVIDIA,
            0o644,
            "nvidia module options: runtime D3 off for the eGPU"
            + ("; nvidia-drm modeset for the display" if ctx.drm_params else ""),
        ),
        (
            "systemd/egpu-setup-wait.service.j2",
            UNIT_WAIT,
            0o644,
            "boot unit: wait until the eGPU is authorized, bound and has its device node",
        ),
        (
            "systemd/egpu-setup-hotplug.service.j2",
            UNIT_HOTPLUG,
            0o644,
            "started by udev when the eGPU appears: pins power, loads modules, starts persistenced",
        ),
        (
            "systemd/egpu-setup-verify.service.j2",
            UNIT_VERIFY,
            0o644,
            "one-shot `egpu-setup verify` after the reboot an install needed (runs only when the "
            "installer leaves /var/lib/egpu-setup/verify-after-reboot)",
        ),
        (
            "systemd/egpu-setup-kernels.service.j2",
            UNIT_KERNELS,
            0o644,
            "boot unit: `egpu-setup kernels check`, an NVIDIA module for every installed kernel",
        ),
        (
            "systemd/egpu-setup-sleep.service.j2",
            UNIT_SLEEP,
            0o644,
            "before every sleep: `egpu-setup resume-check --before-sleep` notes the eGPU, its "
            "enclosure and the CUDA processes on it",
        ),
        (
            "systemd/egpu-setup-resume.service.j2",
            UNIT_RESUME,
            0o644,
            "after every resume: `egpu-setup resume-check` (enclosure authorized, GPU bound, one "
            "PCI rescan if not; verify --quick when CUDA was using it)",
        ),
        (
            "systemd/egpu-setup-health.service.j2",
            UNIT_HEALTH,
            0o644,
            "`egpu-setup health sample`: temperature, power, throttling, link and Xids into "
            "/var/lib/egpu-setup/health.json (skipped without an NVIDIA GPU)",
        ),
        (
            "systemd/egpu-setup-health.timer.j2",
            UNIT_HEALTH_TIMER,
            0o644,
            "runs egpu-setup-health.service every minute",
        ),
        (
            "bin/egpu-hotplug.j2",
            BIN_HOTPLUG,
            0o755,
            "helper run by the units: wait for the eGPU, pin runtime PM, load modules, "
            "log the link",
        ),
        (
            "bin/egpu-eject.j2",
            BIN_EJECT,
            0o755,
            "fixed-path wrapper for `egpu-setup eject` (for a sudoers rule or a desktop launcher)",
        ),
    ]


def _optional(ctx: RenderContext) -> list[tuple[str, str, int, str]]:
    """The files a profile or a finding asks for: persistenced, the one-UUID rule, GRUB."""
    out = []
    if ctx.persistenced:
        out.append(
            (
                "systemd/egpu-setup-persistenced.service.j2",
                UNIT_PERSISTENCED,
                0o644,
                "nvidia-persistenced for the eGPU, started when it appears",
            )
        )
    if ctx.sleep_guard is not None:
        out.append(
            (
                "systemd/egpu-setup-sleep-guard.service.j2",
                UNIT_SLEEP_GUARD,
                0o644,
                f"while a CUDA process holds the eGPU: a logind sleep lock "
                f"({ctx.sleep_guard.mode}) naming each one (`egpu-setup sleep-guard`)",
            )
        )
    if ctx.firstboot is not None:
        out += [
            (
                "systemd/egpu-setup-firstboot.service.j2",
                UNIT_FIRSTBOOT,
                0o644,
                "lab image: at boot and on plug-in until a verify passed, enrol the enclosure "
                "under the profile's policy, wait for the eGPU, verify and leave the report",
            ),
            (
                "udev/62-egpu-setup-firstboot.rules.j2",
                UDEV_FIRSTBOOT,
                0o644,
                "lab image: start the first-boot unit when an enclosure or an NVIDIA GPU appears",
            ),
        ]
    if ctx.apt:
        out.append(
            (
                "apt/99egpu-setup-kernels.j2",
                APT_KERNELS_HOOK,
                0o644,
                "apt hook (DPkg::Post-Invoke): `egpu-setup kernels check` after every package "
                "change, "
                "so a new kernel gets its module or a finding; never fails apt",
            )
        )
    if ctx.thunderbolt.kind == "udev":
        out.append(
            (
                "udev/61-egpu-setup-tb-authorize.rules.j2",
                UDEV_TB_RULES,
                0o644,
                "authorize exactly this enclosure (bolt is not installed)",
            )
        )
    if ctx.grub == "dropin":
        out.append(
            (
                "grub/60-egpu-setup.cfg.j2",
                GRUB_DROPIN,
                0o644,
                "kernel parameters for the PCI BAR allocation failure doctor found",
            )
        )
    return out


def _links_for(ctx: RenderContext) -> tuple[RenderedLink, ...]:
    if ctx.mode != "display":
        return ()
    xorg = RenderedLink(
        XORG_DROPIN,
        ctx.xorg_runtime,
        "Xorg drop-in: X screen on the eGPU; points to the file egpu-hotplug writes at boot "
        "with the current decimal BusID, dangling (ignored by Xorg) when the eGPU is absent",
    )
    # `systemctl enable` of the driver's own units, as the links it makes: systemd reads them
    # at the next boot, which the preservation option needs anyway (module options)
    sleep = tuple(
        RenderedLink(
            path,
            target,
            f"enable {target.rsplit('/', 1)[1]} (NVIDIA's, shipped by the "
            "driver): save and restore video memory over suspend",
        )
        for path, target in (ctx.sleep.links() if ctx.sleep else ())
    )
    return (xorg, *sleep)


def _commands(ctx: RenderContext) -> tuple[HostCommand, ...]:
    cmds: list[HostCommand] = []
    tb = ctx.thunderbolt
    if tb.kind == "bolt" and tb.unique_id and tb.policy and not tb.stored:
        cmds.append(
            HostCommand(
                ("boltctl", "enroll", "--policy", tb.policy, tb.unique_id),
                f"authorize and store this enclosure only (policy {tb.policy}); "
                "never a blanket rule",
            )
        )
    if ctx.initramfs:
        cmds.append(
            HostCommand(
                ctx.initramfs,
                "rebuild the initramfs so nouveau stays out at boot",
                after=(MODPROBE_NOUVEAU,),
            )
        )
    cmds.append(
        HostCommand(
            ("udevadm", "control", "--reload"),
            "load the new udev rules",
            after=(UDEV_RULES, UDEV_TB_RULES) + ((UDEV_FIRSTBOOT,) if ctx.firstboot else ()),
        )
    )
    cmds.append(
        HostCommand(
            ("systemctl", "daemon-reload"),
            "load the new units",
            after=(
                UNIT_WAIT,
                UNIT_HOTPLUG,
                UNIT_PERSISTENCED,
                UNIT_VERIFY,
                UNIT_KERNELS,
                UNIT_SLEEP,
                UNIT_RESUME,
                UNIT_HEALTH,
                UNIT_HEALTH_TIMER,
            )
            + ((UNIT_FIRSTBOOT,) if ctx.firstboot else ())
            + ((UNIT_SLEEP_GUARD,) if ctx.sleep_guard else ()),
        )
    )
    cmds.append(
        HostCommand(
            (
                "systemctl",
                "enable",
                "egpu-setup-wait.service",
                "egpu-setup-verify.service",
                "egpu-setup-kernels.service",
                "egpu-setup-sleep.service",
                "egpu-setup-resume.service",
                "egpu-setup-health.timer",
                *(("egpu-setup-sleep-guard.service",) if ctx.sleep_guard else ()),
            ),
            "wait for the eGPU at boot; verify once after a reboot; check the kernels' modules; "
            "check the eGPU around every sleep; sample its health every minute"
            + ("; hold sleep off while CUDA uses it" if ctx.sleep_guard else ""),
        )
    )
    if ctx.grub == "dropin":
        cmds.append(
            HostCommand(
                ("update-grub",),
                "apply the kernel parameters at the next boot",
                after=(GRUB_DROPIN,),
                consent=True,
            )
        )
    elif ctx.grub == "grubby":
        cmds.append(
            HostCommand(
                ("grubby", "--update-kernel=ALL", "--args=" + " ".join(ctx.kernel_params)),
                "apply the kernel parameters at the next boot",
                consent=True,
            )
        )
    return tuple(cmds)


def render_set(
    facts: HostFacts,
    profile: Profile,
    resolution: Resolution | None,
    mode: str,
    *,
    bolt_available: bool | None = None,
    bar_allocation_failed: bool = False,
    kernel_params: Iterable[str] = (),
    tool_path: str | None = None,
    tool_exposed: bool | None = None,
    venv: str = TORCH_VENV,
    wait_timeout: int = 30,
    firstboot: FirstBoot | None = None,
    sleep_units_dir: str | None = None,
) -> RenderSet:
    """Validate, then render every file in memory. Raises UsageError/ActionRequired first.

    bolt_available: None = infer (bolt reported device policies, or assume bolt: it is preferred
    and the installer can install it); False renders the one-UUID udev fallback instead.
    bar_allocation_failed: doctor's `pci-bar-allocation-failed` finding; adds pci=realloc.
    tool_path: absolute path of the egpu-setup entry point that egpu-eject execs; pass the one
    that is running (`entry_point_path(sys.argv[0])`), so the wrapper works wherever egpu-setup
    was installed. None: /usr/local/bin/egpu-setup. Checked like every path (UsageError).
    tool_exposed: tool_path_exposed() of it (None: judged by its directory alone); the sudoers
    note about egpu-eject comes only when the path is exposed.
    The result's `links` (display mode: the Xorg drop-in) are symlinks to create next to files.
    firstboot: a lab image's first-boot unit and its udev rule (install --root).
    sleep_units_dir: the directory the target has NVIDIA's nvidia-suspend.service in
    (probe_sleep_units), or None; display mode enables the units there (render/sleep.py).
    """
    if bolt_available is None and any(d.policy for d in facts.thunderbolt.devices):
        bolt_available = True
    params = list(kernel_params)
    if bar_allocation_failed and not params:
        params = ["pci=realloc"]  # the first fix to try (Linux kernel-parameters.txt)
    ctx = build_context(
        facts,
        profile,
        resolution,
        mode,
        bolt_available=bolt_available,
        kernel_params=params,
        tool_path=DEFAULT_TOOL_PATH if tool_path is None else tool_path,
        tool_exposed=tool_exposed,
        venv=venv,
        wait_timeout=wait_timeout,
        firstboot=firstboot,
        sleep_units_dir=sleep_units_dir,
    )
    env = _environment()
    variables = ctx.as_template_vars()
    files = []
    for template, path, perm, purpose in _files_for(ctx):
        body = env.get_template(template).render(**variables)
        files.append(RenderedFile(path, add_header(body, ctx.profile, ctx.mode), perm, purpose))
    return RenderSet(tuple(files), _commands(ctx), ctx.notes, _links_for(ctx))


def tool_path_exposed(host: Host, path: str | None) -> bool | None:
    """Whether someone other than root could replace the egpu-setup that egpu-eject runs as
    root (through a sudoers rule): host/trust.py's rule for every program root starts (the
    file, each directory above it, the interpreter its `#!` names). None where it cannot be
    told (not this machine, or no such file); False for None, the default
    /usr/local/bin/egpu-setup that scripts/install.sh makes root-owned."""
    from egpu_setup.host.trust import root_may_run

    if path is None:
        return False
    if host.kind != "live" or not os.path.lexists(path):
        return None
    return not root_may_run(path)


def entry_point_path(argv0: str) -> str | None:
    """The running egpu-setup console script (sys.argv[0] holds its absolute path when the
    kernel runs it by its shebang), or None under `python -m egpu_setup` and the like."""
    if argv0.startswith("/") and argv0.rsplit("/", 1)[-1] == "egpu-setup":
        return argv0
    return None


def render_template(name: str, **values: object) -> str:
    """One template of templates/ rendered with `values` (the environment every file uses)."""
    return _environment().get_template(name).render(**values)
