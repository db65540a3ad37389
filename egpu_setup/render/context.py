"""The validated context the hot-plug templates are rendered from.

Every value that reaches a template goes through render.checks first (a PCI address, a
Thunderbolt UUID, a 4-hex device id, an absolute path made of safe characters); a value that does
not match is a UsageError (exit 2) and nothing is rendered.

Pure: facts, profile and resolution in; a frozen `RenderContext` out. Knowledge that decides what
is rendered (initramfs tools per distro, which nvidia-drm parameters a branch knows, Debian's
renamed modules) lives in the tables below, each with its source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.errors import UsageError
from egpu_setup.profile.types import Profile
from egpu_setup.render.checks import (
    PciAddress,
    check_bool,
    check_choice,
    check_device_id,
    check_kernel_params,
    check_path,
    check_profile_name,
    check_temperature,
    check_uuid,
)
from egpu_setup.render.sleep import SleepGuard, SleepSetup, plan_sleep, plan_sleep_guard
from egpu_setup.render.thunderbolt import ThunderboltPlan, plan_thunderbolt
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.state.paths import TOOL_BIN, TORCH_VENV
from egpu_setup.state.verify_marker import FIRSTBOOT_MARKER

MODES = ("compute", "display")


_DRIVER_VERSION = re.compile(r"(\d{2,4})(?:\.\d+){0,3}\Z")


NVIDIA_VENDOR = "10de"


DEFAULT_TOOL_PATH = "/usr/local/bin/egpu-setup"


# Where the boot helper writes the Xorg file with the current BusID (display mode); tmpfs, so
# a boot without the eGPU starts with none.
XORG_RUNTIME = "/run/egpu-setup/90-egpu-setup.conf"


# Directories a distribution or an administrator's install keeps root-owned; an entry point
# elsewhere (a pipx venv in a home directory) could be replaced by the user.
ROOT_OWNED_PREFIXES = ("/usr/", "/opt/")


# distribution families whose packages come through apt (and dpkg runs apt.conf.d hooks)
APT_FAMILIES = ("debian", "ubuntu")


# argv that rebuilds the initramfs after the nouveau blacklist changes, by distro family.
# NVIDIA README "Interaction with the Nouveau Driver"; Debian's blacklist conffile header
# (nvidia-kernel-support) says `update-initramfs -u`; envycontrol uses these per family.
INITRAMFS_COMMANDS: dict[str, tuple[str, ...]] = {
    "debian": ("update-initramfs", "-u"),
    "ubuntu": ("update-initramfs", "-u"),
    "fedora": ("dracut", "-f"),
    "rhel": ("dracut", "-f"),
    "suse": ("dracut", "-f"),
    "arch": ("mkinitcpio", "-P"),
}


# First driver branch that knows each nvidia-drm parameter. `modeset` arrived with nvidia-drm
# itself in 364 (NVIDIA 364.12 release notes, "Direct Rendering Manager Kernel Modesetting");
# `fbdev` in 545, marked experimental (open-gpu-kernel-modules nvidia-drm-linux.c).
# An unknown parameter makes the module refuse to load (docs/sources.md, NVIDIA driver).
NVIDIA_DRM_PARAMS_SINCE: dict[str, int] = {"modeset": 364, "fbdev": 545}


# Debian installs the modules as nvidia-current* and maps upstream names with `install` lines, so
# `options nvidia ...` may not reach the module; its own example options target nvidia-current
# (Debian nvidia-kernel-support nvidia-modprobe.conf / nvidia-options.conf).
DEBIAN_MODULE_PREFIX = "nvidia-current"


# Distros whose grub-mkconfig sources /etc/default/grub.d/*.cfg (a Debian patch, grub-common).
GRUB_DROPIN_DISTROS = ("debian", "ubuntu")


GRUBBY_DISTROS = ("fedora", "rhel")


# Lab images: the marker install --root leaves, and the report the first-boot unit writes for
# the fleet to collect (egpu-setup firstboot; README "Lab images").
FIRSTBOOT_REPORT = "/var/lib/egpu-setup/firstboot.json"
FIRSTBOOT_TIMEOUT_S = 900  # wait for the GPU, then a quick verify on it


@dataclass(frozen=True)
class FirstBoot:
    """What the first-boot unit of a lab image runs: `egpu-setup firstboot` for this profile,
    with the enclosures the image was built for (--enclosure) besides the profile's own."""

    profile: str
    enclosures: tuple[str, ...] = ()
    marker: str = FIRSTBOOT_MARKER
    report: str = FIRSTBOOT_REPORT
    timeout: int = FIRSTBOOT_TIMEOUT_S


@dataclass(frozen=True)
class RenderContext:
    """Everything a template may use, validated."""

    profile: str
    mode: str
    device_ids: tuple[str, ...]
    gpu: PciAddress | None
    match_removable: bool
    debian_modules: bool
    branch: int | None
    drm_params: tuple[str, ...]
    runtime_pm_off: bool
    # NVreg_DynamicPowerManagement applies to every GPU the module drives: with an internal
    # NVIDIA GPU too, it would keep the laptop's own dGPU powered; the per-device udev rule
    # (power/control=on) then keeps only the eGPU awake.
    module_rtd3_off: bool
    persistenced: bool
    thunderbolt: ThunderboltPlan
    initramfs: tuple[str, ...] | None
    kernel_params: tuple[str, ...]
    grub: str | None  # "dropin" / "grubby" / None
    tool_path: str
    xorg_runtime: str
    venv: str
    wait_timeout: int
    notes: tuple[str, ...]
    firstboot: FirstBoot | None = None
    # the distribution's packages come through apt: its DPkg::Post-Invoke hook is rendered
    apt: bool = False
    # display mode where the driver ships its suspend units (render/sleep.py)
    sleep: SleepSetup | None = None
    # the profile's expect.max_temp_c, kept by the health sampler beside its readings
    max_temp_c: str = "87"
    # hotplug.sleep_inhibit: the sleep guard's unit, None for "off" (render/sleep.py)
    sleep_guard: SleepGuard | None = None

    def as_template_vars(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "mode": self.mode,
            "display": self.mode == "display",
            "device_ids": self.device_ids,
            "gpu": self.gpu,
            "match_removable": self.match_removable,
            "debian_modules": self.debian_modules,
            "module_prefix": DEBIAN_MODULE_PREFIX,
            "branch": self.branch,
            "drm_params": self.drm_params,
            "runtime_pm_off": self.runtime_pm_off,
            "module_rtd3_off": self.module_rtd3_off,
            "persistenced": self.persistenced,
            "tb": self.thunderbolt,
            "initramfs": self.initramfs,
            "kernel_params": self.kernel_params,
            "tool_path": self.tool_path,
            "tool_venv_bin": TOOL_BIN,
            "xorg_runtime": self.xorg_runtime,
            "venv": self.venv,
            "wait_timeout": self.wait_timeout,
            "firstboot": self.firstboot,
            "sleep": self.sleep,
            "max_temp_c": self.max_temp_c,
            "sleep_guard": self.sleep_guard,
        }


def driver_branch(facts: HostFacts, resolution: Resolution | None) -> int | None:
    """The driver branch the files are for: the resolution's plan, else the installed driver."""
    if resolution is not None:
        branch = resolution.driver.branch
        if branch is not None:
            if not isinstance(branch, int) or isinstance(branch, bool) or not 100 <= branch <= 9999:
                raise UsageError(
                    f"resolution: driver branch {branch!r} is invalid", "re-run resolve"
                )
            return branch
    version = facts.nvidia.driver_version
    if version:
        m = _DRIVER_VERSION.match(version.strip())
        if m:
            return int(m.group(1))
    return None


def distro_family(facts: HostFacts) -> str | None:
    """The first known family among ID and ID_LIKE (os-release(5))."""
    for name in (facts.os.id, *facts.os.id_like):
        if not name:
            continue
        name = name.lower()
        if name in INITRAMFS_COMMANDS:
            return name
        if name in ("centos", "rocky", "almalinux"):
            return "rhel"
        if name.startswith("opensuse") or name == "sles":
            return "suse"
    return None


def detected_cards(facts: HostFacts) -> tuple[Gpu, ...]:
    """The NVIDIA GPUs the rules are for, as detected: the eGPU; else every external NVIDIA GPU
    (two identical enclosures); else the only NVIDIA GPU when nothing says it is internal (its
    placement undecided, e.g. a report with lspci text only: README "How decisions are made").
    Empty when none is there (the profile's ids are used then)."""
    if facts.egpu is not None:
        return (facts.egpu,)
    external = tuple(g for g in facts.nvidia_gpus if g.external)
    if external:
        return external
    nvidia = facts.nvidia_gpus
    if len(nvidia) == 1 and nvidia[0].external is None:
        return nvidia
    return ()


def profile_card_mismatch(profile: Profile, cards: Iterable[Gpu]) -> str | None:
    """'the detected eGPU is X, not this profile's Y', or None: the card is the profile's, the
    profile is generic (no device ids: it accepts any NVIDIA card), or no card is detected."""
    spec = profile.gpu
    if not spec.device_ids:
        return None
    other = [g for g in cards if g.device_id and not spec.matches(g.device_id)]
    if not other:
        return None
    by_id: dict[str, list[Gpu]] = {}
    for g in other:
        by_id.setdefault(g.device_id or "", []).append(g)
    seen = "; ".join(
        f"{gs[0].name or 'NVIDIA GPU'} [10de:{dev}] at {', '.join(g.pci_address for g in gs)}"
        for dev, gs in by_id.items()
    )
    ids = ", ".join(spec.device_ids)
    return f"the detected eGPU is {seen}, not profile {profile.name}'s {spec.name} ({ids})"


def _device_ids(profile: Profile, cards: tuple[Gpu, ...], name: str) -> list[str]:
    """The device ids the udev rules match: the detected cards' (and the profile's, when the
    cards are the profile's), else the profile's; a UsageError when there are none at all."""
    ids: list[str] = []
    for card in cards:
        if card.device_id:
            dev = check_device_id(card.device_id, "detected eGPU device id")
            if dev not in ids:
                ids.append(dev)
    # every profile id is checked, whether it ends up in a rule or not
    wanted = [
        check_device_id(dev_id, f"profile gpu.device_ids[{i}]")
        for i, dev_id in enumerate(profile.gpu.device_ids)
    ]
    if not ids or profile_card_mismatch(profile, cards) is None:
        ids += [d for d in wanted if d not in ids]
    if not ids:
        raise UsageError(
            f"profile {name}: no GPU device id and no NVIDIA GPU detected, "
            "so no rule could match the card",
            "add gpu.device_ids to the profile or connect the eGPU",
        )
    return ids


def build_context(
    facts: HostFacts,
    profile: Profile,
    resolution: Resolution | None,
    mode: str,
    *,
    bolt_available: bool | None = None,
    kernel_params: Iterable[str] = (),
    tool_path: str = DEFAULT_TOOL_PATH,
    tool_exposed: bool | None = None,
    venv: str = TORCH_VENV,
    wait_timeout: int = 30,
    firstboot: FirstBoot | None = None,
    sleep_units_dir: str | None = None,
) -> RenderContext:
    """Validate every input and decide what is rendered. Raises UsageError / ActionRequired.

    sleep_units_dir: where the target has NVIDIA's nvidia-suspend.service already (probed), or
    None."""
    mode = check_choice(mode, MODES, "mode")
    name = check_profile_name(profile.name)
    hp = profile.hotplug
    runtime_pm_off = check_bool(hp.runtime_pm_off, "profile hotplug.runtime_pm_off")
    persistenced = check_bool(hp.persistenced, "profile hotplug.persistenced")
    check_choice(
        hp.connection, ("thunderbolt", "usb4", "oculink", "any"), "profile hotplug.connection"
    )
    _check_wait_timeout(wait_timeout)
    gpu, ids, cards = _card(facts, profile, name)
    tb, tb_notes = plan_thunderbolt(facts, hp, facts.egpu, bolt_available)
    notes = list(tb_notes)
    branch = driver_branch(facts, resolution)
    drm_params = _display(mode, branch, notes)
    family = distro_family(facts)
    initramfs, params, grub = _boot(family, kernel_params, notes)
    packages = tuple(resolution.driver.packages) if resolution is not None else ()
    sleep = plan_sleep(mode, family, branch, packages, sleep_units_dir, notes)
    tool_path = _tool_path(tool_path, tool_exposed, notes)
    internal_nvidia = [g for g in facts.nvidia_gpus if g.external is False]
    if runtime_pm_off and internal_nvidia:
        notes.append(
            f"the internal {internal_nvidia[0].name or 'NVIDIA GPU'} shares the nvidia module: "
            "runtime D3 stays on in the module (battery), only the eGPU's path is kept awake"
        )
    return RenderContext(
        profile=name,
        mode=mode,
        device_ids=ids,
        gpu=gpu,
        match_removable=bool(cards) and all(c.removable == "removable" for c in cards),
        debian_modules=(facts.os.id or "").lower() == "debian",
        branch=branch,
        drm_params=drm_params,
        runtime_pm_off=runtime_pm_off,
        module_rtd3_off=runtime_pm_off and not internal_nvidia,
        persistenced=persistenced,
        thunderbolt=tb,
        initramfs=initramfs,
        kernel_params=params,
        grub=grub,
        tool_path=tool_path,
        xorg_runtime=XORG_RUNTIME,
        venv=check_path(venv, "venv path"),
        wait_timeout=wait_timeout,
        notes=tuple(notes),
        firstboot=_check_firstboot(firstboot),
        apt=family in APT_FAMILIES,
        sleep=sleep,
        max_temp_c=check_temperature(profile.expect.max_temp_c, "profile expect.max_temp_c"),
        sleep_guard=plan_sleep_guard(hp.sleep_inhibit),
    )


def _check_wait_timeout(wait_timeout: object) -> None:
    if (
        isinstance(wait_timeout, bool)
        or not isinstance(wait_timeout, int)
        or not 5 <= wait_timeout <= 300
    ):
        raise UsageError(f"wait timeout {wait_timeout!r} is out of range", "use 5 to 300 seconds")


def _card(
    facts: HostFacts, profile: Profile, name: str
) -> tuple[PciAddress | None, tuple[str, ...], tuple[Gpu, ...]]:
    """The eGPU's address (when one is attached), every device id the rules match, checked,
    and the detected cards they are for (detected_cards).

    Display mode needs no address here: the boot helper writes Xorg's BusID from the address the
    eGPU has at that boot (another port means another bus number), or no Xorg file at all when
    it is absent, so X falls back to the built-in GPU."""
    cards = detected_cards(facts)
    egpu = cards[0] if len(cards) == 1 else None
    gpu = PciAddress.parse(egpu.pci_address, "detected eGPU address") if egpu else None
    ids = _device_ids(profile, cards, name)
    for card in cards:
        address = PciAddress.parse(card.pci_address, "detected eGPU address")
        if card.vendor_id and card.vendor_id.lower() != NVIDIA_VENDOR:
            raise UsageError(
                f"the eGPU at {address.sysfs} is not an NVIDIA GPU", "use an NVIDIA GPU"
            )
    return gpu, tuple(ids), cards


def _display(mode: str, branch: int | None, notes: list[str]) -> tuple[str, ...]:
    """The nvidia-drm parameters display mode sets (those the branch knows)."""
    if mode != "display":
        return ()
    drm_params: tuple[str, ...] = ()
    if branch is None:
        notes.append(
            "driver branch unknown: nvidia-drm modeset is not set; re-render after the driver "
            "is installed (Wayland needs modeset=1)"
        )
    else:
        drm_params = tuple(p for p, since in NVIDIA_DRM_PARAMS_SINCE.items() if branch >= since)
    notes.append(
        "display mode: GDM turns Wayland off unless nvidia-drm modeset=Y, "
        "NVreg_PreserveVideoMemoryAllocations=1 and the nvidia-suspend/resume services "
        "are set up; check the session type after logging in again"
    )
    return drm_params


def _boot(
    family: str | None, kernel_params: Iterable[str], notes: list[str]
) -> tuple[tuple[str, ...] | None, tuple[str, ...], str | None]:
    """(the initramfs rebuild, the kernel parameters, how they reach the boot loader)."""
    initramfs = INITRAMFS_COMMANDS.get(family) if family else None
    if initramfs is None:
        notes.append(
            "unknown distribution: rebuild the initramfs yourself after the nouveau blacklist"
        )
    params = check_kernel_params(kernel_params)
    grub = None
    if params:
        if family in GRUB_DROPIN_DISTROS:
            grub = "dropin"
        elif family in GRUBBY_DISTROS:
            grub = "grubby"
        else:
            notes.append(f"add these kernel parameters in your boot loader: {' '.join(params)}")
    return initramfs, params, grub


def _tool_path(tool_path: str, tool_exposed: bool | None, notes: list[str]) -> str:
    """The egpu-setup egpu-eject runs as root; said when a user could replace it (tool_exposed:
    what the caller found out about the file; None: judged by its path alone)."""
    tool_path = check_path(tool_path, "egpu-setup path")
    exposed = (
        not tool_path.startswith(ROOT_OWNED_PREFIXES) if tool_exposed is None else tool_exposed
    )
    if exposed:
        notes.append(
            f"egpu-eject runs {tool_path} as root: allow egpu-eject in sudoers only if that file "
            "and every directory above it are root-owned and not writable by the user"
        )
    return tool_path


def _check_firstboot(fb: FirstBoot | None) -> FirstBoot | None:
    if fb is None:
        return None
    return FirstBoot(
        profile=check_profile_name(fb.profile),
        enclosures=tuple(
            check_uuid(u, f"enclosure {i + 1} for the first boot")
            for i, u in enumerate(fb.enclosures)
        ),
        marker=check_path(fb.marker, "first-boot marker"),
        report=check_path(fb.report, "first-boot report"),
        timeout=fb.timeout if isinstance(fb.timeout, int) and 60 <= fb.timeout <= 3600 else 900,
    )
