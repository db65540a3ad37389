"""The validated context the hot-plug templates are rendered from.

Every value that reaches a template is checked here first, by pattern, against the one shape it
may have (a PCI address, a Thunderbolt UUID, a 4-hex device id, an absolute path made of safe
characters). Templates write these values into udev rules, shell scripts and unit files, where a
quote, a newline, `$(...)`, `RUN+=` or `"; ` would become code (hotplug-security.md §1.5, §5.7,
§7 #18), so a value that does not match is a UsageError (exit 2) and nothing is rendered.

Pure: facts, profile and resolution in; a frozen `RenderContext` out. Knowledge that decides what
is rendered (initramfs tools per distro, which nvidia-drm parameters a branch knows, Debian's
renamed modules) lives in the tables below, each with its source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from egpu_setup.detect.facts import Gpu, HostFacts, TbDevice, TbDomain
from egpu_setup.errors import ActionRequired, UsageError

MODES = ("compute", "display")

# -- patterns (anchored with \Z so a trailing newline never slips through `$`) ------------------
_PCI_ADDRESS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])\Z")
_DEVICE_ID = re.compile(r"[0-9a-f]{4}\Z")
# The kernel prints a router's unique_id with %pUb: always a canonical UUID
# (Documentation/ABI/testing/sysfs-bus-thunderbolt, hotplug-security.md §1.1).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_SAFE_PATH = re.compile(r"/(?:[A-Za-z0-9._+-]+/)*[A-Za-z0-9._+-]+\Z")
_DRIVER_VERSION = re.compile(r"(\d{2,4})(?:\.\d+){0,3}\Z")
# Kernel parameters the GRUB drop-in may carry (hotplug-security.md §2.3): a closed list of
# shapes, so a profile or finding can never smuggle shell into /etc/default/grub.d.
_KERNEL_PARAM = re.compile(
    r"(pci=realloc|pci=assign-busses|pci=hpbussize=\d{1,3}|pci=hpmmiosize=\d{1,5}[KMG]"
    r"|pci=hpmmioprefsize=\d{1,5}[KMG]|pci=hpmemsize=\d{1,5}[KMG]|pcie_ports=native"
    r"|pcie_aspm=off|pcie_port_pm=off|thunderbolt\.host_reset=0)\Z"
)

NVIDIA_VENDOR = "10de"

DEFAULT_TOOL_PATH = "/usr/local/bin/egpu-setup"
# Where the boot helper writes the Xorg file with the current BusID (display mode); tmpfs, so
# a boot without the eGPU starts with none (hotplug-security.md §3.7).
XORG_RUNTIME = "/run/egpu-setup/90-egpu-setup.conf"
# Directories a distribution or an administrator's install keeps root-owned; an entry point
# elsewhere (a pipx venv in a home directory) could be replaced by the user.
ROOT_OWNED_PREFIXES = ("/usr/", "/opt/")

# -- knowledge tables -----------------------------------------------------------------------------

# argv that rebuilds the initramfs after the nouveau blacklist changes, by distro family.
# NVIDIA README "Interaction with the Nouveau Driver" [N1]; Debian's blacklist conffile header
# says `update-initramfs -u` [N8]; envycontrol uses these per family [R9].
INITRAMFS_COMMANDS: dict[str, tuple[str, ...]] = {
    "debian": ("update-initramfs", "-u"),
    "ubuntu": ("update-initramfs", "-u"),
    "fedora": ("dracut", "-f"),
    "rhel": ("dracut", "-f"),
    "suse": ("dracut", "-f"),
    "arch": ("mkinitcpio", "-P"),
}

# First driver branch that knows each nvidia-drm parameter. `modeset` arrived with nvidia-drm
# itself in 364 (NVIDIA 364.12 release notes, "Direct Rendering Manager Kernel Modesetting"
# [N1]); `fbdev` in 545, marked experimental (open-gpu-kernel-modules nvidia-drm-linux.c [N3]).
# An unknown parameter makes the module refuse to load (hotplug-security.md §3.1, §7 #34).
NVIDIA_DRM_PARAMS_SINCE: dict[str, int] = {"modeset": 364, "fbdev": 545}

# Debian installs the modules as nvidia-current* and maps upstream names with `install` lines, so
# `options nvidia ...` may not reach the module; its own example options target nvidia-current
# (Debian nvidia-kernel-support nvidia-modprobe.conf / nvidia-options.conf [N8], §3.3).
DEBIAN_MODULE_PREFIX = "nvidia-current"

# Distros whose grub-mkconfig sources /etc/default/grub.d/*.cfg (a Debian patch, §2.3 [R11]).
GRUB_DROPIN_DISTROS = ("debian", "ubuntu")
GRUBBY_DISTROS = ("fedora", "rhel")


# -- the context ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PciAddress:
    """A parsed PCI address: every number the templates need, in both notations."""

    domain: int
    bus: int
    device: int
    function: int

    @classmethod
    def parse(cls, text: str, what: str) -> PciAddress:
        m = _PCI_ADDRESS.match(str(text).lower())
        if not m:
            raise UsageError(
                f"{what}: {text!r} is not a PCI address",
                "expected the sysfs form DOMAIN:BUS:DEVICE.FUNCTION, e.g. 0000:3c:00.0",
            )
        return cls(*(int(g, 16) for g in m.groups()))

    @property
    def sysfs(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    @property
    def slot(self) -> str:
        """The address without the function: every function of the card shares it."""
        return self.sysfs.rsplit(".", 1)[0]

    @property
    def xorg_busid(self) -> str:
        """Xorg's BusID: decimal bus@domain:device:function, @domain only when non-zero.

        xorg.conf(5) parses decimal; lspci prints hex, the classic eGPU mistake [N1][D1]:
        0000:0a:00.0 -> PCI:10:0:0, 10000:e1:00.0 -> PCI:225@65536:0:0.
        """
        domain = f"@{self.domain}" if self.domain else ""
        return f"PCI:{self.bus}{domain}:{self.device}:{self.function}"


@dataclass(frozen=True)
class ThunderboltPlan:
    """How this enclosure gets its PCIe tunnel (hotplug-security.md §1.5, §1.7)."""

    kind: str  # "none" (not Thunderbolt / nothing to do), "bolt", "udev"
    unique_id: str | None = None
    domain: str | None = None
    security: str | None = None
    iommu: bool | None = None
    policy: str | None = None  # bolt policy: iommu / auto / manual
    require_iommu: bool = True  # udev fallback: match only on IOMMU-protected domains


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
            "xorg_runtime": self.xorg_runtime,
            "venv": self.venv,
            "wait_timeout": self.wait_timeout,
        }


# -- validators -----------------------------------------------------------------------------------


def check_profile_name(name: object) -> str:
    if not isinstance(name, str) or not _PROFILE_NAME.match(name):
        raise UsageError(
            f"profile name {name!r} cannot be written into configuration files",
            "use letters, digits, '.', '_' and '-' only (at most 64 characters)",
        )
    return name


def check_device_id(value: object, what: str) -> str:
    text = str(value).lower().removeprefix("0x") if isinstance(value, str) else ""
    if not _DEVICE_ID.match(text):
        raise UsageError(
            f"{what}: {value!r} is not a PCI device id", "expected 4 hex digits, e.g. 2684"
        )
    return text


def check_uuid(value: object, what: str) -> str:
    text = value.lower() if isinstance(value, str) else ""
    if not _UUID.match(text):
        raise UsageError(
            f"{what}: {value!r} is not a Thunderbolt unique_id",
            "copy the UUID that `boltctl list` prints for the enclosure (8-4-4-4-12 hex digits)",
        )
    return text


def check_path(value: object, what: str) -> str:
    text = value if isinstance(value, str) else ""
    if not _SAFE_PATH.match(text) or "/../" in f"{text}/" or "/./" in f"{text}/":
        raise UsageError(
            f"{what}: {value!r} is not a safe absolute path",
            "use an absolute path of letters, digits, '.', '_', '+', '-' and '/'",
        )
    return text


def check_kernel_params(params: Iterable[str]) -> tuple[str, ...]:
    out = []
    for p in params:
        if not isinstance(p, str) or not _KERNEL_PARAM.match(p):
            raise UsageError(
                f"kernel parameter {p!r} is not one egpu-setup may add",
                "allowed: pci=realloc, pci=hpmmioprefsize=SIZE, pci=assign-busses, "
                "pcie_ports=native, pcie_aspm=off, pcie_port_pm=off, thunderbolt.host_reset=0 "
                "(hotplug-security.md §2.3)",
            )
        if p not in out:
            out.append(p)
    return tuple(out)


def _check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{what}: {value!r} is not true or false", "write true or false")
    return value


def _check_choice(value: object, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise UsageError(f"{what}: {value!r} is not one of {', '.join(choices)}", "fix the profile")
    return str(value)


def driver_branch(facts: HostFacts, resolution: Any | None) -> int | None:
    """The driver branch the files are for: the resolution's plan, else the installed driver."""
    if resolution is not None:
        branch = getattr(resolution.driver, "branch", None)
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


# -- Thunderbolt ----------------------------------------------------------------------------------

_NO_PCIE = ("dponly", "usbonly", "nopcie")
_TB_CONNECTIONS = ("thunderbolt", "usb4")


def _is_peripheral(dev: TbDevice) -> bool:
    # Route 0 ("0-0", "1-0") is the host router itself (sysfs-bus-thunderbolt [K2]).
    return not (dev.sysfs_name or "").endswith("-0")


def _enclosure(
    facts: HostFacts, wanted: str | None, egpu: Gpu | None
) -> tuple[TbDevice | None, str | None]:
    """The Thunderbolt device that carries the eGPU's PCIe tunnel, or None and why not.

    Nothing in sysfs ties a peripheral router to the PCI functions behind it: the Thunderbolt
    bus exposes routers and their `authorized`/`unique_id`, not the tunnels (sysfs-bus-thunderbolt
    [K2]; tunnels are listed only in debugfs). The one kernel link is at the host side: on USB4
    hosts whose ACPI gives a root port `usb4-host-interface`, drivers/thunderbolt/acpi.c
    (tb_acpi_add_link) adds a device link root port -> NHI (`supplier:pci:<nhi>` under the root
    port), which names the domain, not the router. So the device is taken to be the enclosure
    only when (a) the profile pins its UUID, or (b) an external NVIDIA GPU is detected on a
    Thunderbolt/USB4 link and exactly one peripheral is (or may be) authorized: the GPU is
    visible, so its tunnel runs through authorized routers, and with one candidate it is that
    one. Residual assumption: detect's `connection` is right and `authorized` was read while the
    GPU was attached (a daisy chain or a dock makes two candidates, which is refused).
    Anything else (eGPU unplugged, a dock alone) names no device: a dock's UUID must never be
    enrolled as the enclosure.
    """
    peripherals = [d for d in facts.thunderbolt.devices if _is_peripheral(d)]
    if wanted is not None:
        for dev in peripherals:
            if (dev.unique_id or "").lower() == wanted:
                return dev, None
        return None, None
    if egpu is None or egpu.connection not in _TB_CONNECTIONS:
        several = [g.pci_address for g in facts.nvidia_gpus if g.external]
        if egpu is None and len(several) > 1:
            return None, (
                f"{len(several)} eGPUs are attached ({', '.join(several)}): none is authorized "
                "until hotplug.enclosure_unique_id in the profile names its enclosure "
                "(`boltctl list` shows the UUIDs)"
            )
        if egpu is None:
            why = "no eGPU is attached now"
        else:
            why = f"the eGPU's link is '{egpu.connection}', not Thunderbolt/USB4"
        return None, (
            f"{why}, so no Thunderbolt device can be tied to it and none is authorized: "
            "connect the eGPU, or pin hotplug.enclosure_unique_id in the profile, then re-run"
        )
    candidates = [d for d in peripherals if d.authorized is not False]
    if len(candidates) == 1:
        return candidates[0], None
    listed = "; ".join(
        f"{d.vendor or '?'} {d.name or '?'}: {d.unique_id or '?'}" for d in candidates
    )
    return None, (
        f"cannot tell which Thunderbolt device is the eGPU's enclosure "
        f"({listed or 'no authorized device is listed'}), so none is authorized: connect the "
        "eGPU alone, or pin hotplug.enclosure_unique_id in the profile, then re-run"
    )


def _domain_of(facts: HostFacts, dev: TbDevice | None) -> TbDomain | None:
    domains = facts.thunderbolt.domains
    if dev is not None and dev.domain:
        for d in domains:
            if d.name == dev.domain:
                return d
    if len(domains) == 1:
        return domains[0]
    # Several controllers and no link to the enclosure: usable only when they agree.
    levels = {(d.security, d.iommu_dma_protection) for d in domains}
    return domains[0] if len(levels) == 1 and domains else None


def plan_thunderbolt(
    facts: HostFacts, hotplug: Any, egpu: Gpu | None, bolt_available: bool | None
) -> tuple[ThunderboltPlan, tuple[str, ...]]:
    """Decide how the enclosure is authorized: bolt enrolment, a one-UUID udev rule, or nothing.

    Never a blanket rule (hotplug-security.md §1.4). Raises ActionRequired (exit 4) when the
    firmware's security level forbids PCIe tunnels, before anything is rendered (§7 #15).
    """
    connection = hotplug.connection
    if connection == "oculink" or (egpu is not None and egpu.connection in ("oculink", "pcie")):
        return ThunderboltPlan("none"), ("OCuLink/PCIe link: no Thunderbolt authorization needed",)
    if not facts.thunderbolt.domains:
        if connection in _TB_CONNECTIONS and egpu is None:
            return ThunderboltPlan("none"), (
                "no Thunderbolt controller was found (it may be powered down until something is "
                "plugged in: `boltctl power -q`); re-render with the enclosure connected",
            )
        return ThunderboltPlan("none"), ()

    wanted = hotplug.enclosure_unique_id
    if wanted is not None:
        wanted = check_uuid(wanted, "profile hotplug.enclosure_unique_id")
    dev, unknown = _enclosure(facts, wanted, egpu)
    domain = _domain_of(facts, dev)
    security = domain.security if domain else None
    iommu = domain.iommu_dma_protection if domain else None
    via_tb = egpu is None or egpu.connection in (*_TB_CONNECTIONS, "unknown")

    if security in _NO_PCIE and via_tb:
        raise ActionRequired(
            f"Thunderbolt security level is '{security}' on "
            f"{domain.name if domain else 'the controller'}:"
            " the firmware allows no PCIe tunnel, so no eGPU can appear; nothing was written",
            "in the firmware setup (BIOS/UEFI) set Thunderbolt security to 'User Authorization' "
            "(user) or 'Secure Connect' (secure), or enable 'PCIe tunneling' on USB4; then re-run",
        )
    if security in (None, "none"):
        notes = []
        if security == "none":
            notes.append("Thunderbolt security level 'none': the firmware connects every device")
            if iommu is False:
                notes.append(
                    "warning: no IOMMU DMA protection either; any Thunderbolt device can read "
                    "memory (enable VT-d / 'Kernel DMA Protection' in the firmware)"
                )
        return ThunderboltPlan("none", security=security, iommu=iommu), tuple(notes)

    uuid = wanted or (dev.unique_id if dev else None)
    if uuid is None:
        # Enrol nothing and write no udev rule: a guess could authorize a dock or a stranger's
        # device for good. The boot helper then waits for the GPU only.
        return ThunderboltPlan("none", security=security, iommu=iommu), (
            unknown
            or "the enclosure has no unique_id in sysfs; pin hotplug.enclosure_unique_id in the "
            "profile",
        )
    uuid = check_uuid(uuid, "Thunderbolt device unique_id")
    accept = _check_bool(hotplug.accept_no_iommu, "profile hotplug.accept_no_iommu")
    policy_wanted = _check_choice(
        hotplug.thunderbolt_policy,
        ("iommu", "auto", "manual"),
        "profile hotplug.thunderbolt_policy",
    )
    base = {
        "unique_id": uuid,
        "domain": domain.name if domain else None,
        "security": security,
        "iommu": iommu,
    }
    notes: list[str] = []

    use_bolt = bolt_available is not False or security == "secure"
    if security == "secure" and bolt_available is False:
        raise ActionRequired(
            "Thunderbolt security level 'secure' needs bolt for the key challenge; a udev rule "
            "would authorize without the key, so none is written",
            "install bolt (Debian/Ubuntu: apt-get install bolt) and re-run",
        )
    if use_bolt:
        # `iommu` acts like `auto` only while IOMMU protection is active, else like `manual`
        # (bolt-enums.h [B2]): the stricter choice wherever the domain has protection.
        if policy_wanted == "manual":
            policy = "manual"
        elif iommu:
            policy = "iommu"
        elif security == "secure" or accept:
            # secure: bolt stores a key on the device and challenges it on every plug-in [B1].
            policy = "auto"
        else:
            policy = "manual"
            notes.append(
                "no IOMMU DMA protection: the enclosure is enrolled with policy 'manual' (run "
                "`boltctl authorize UUID` after each plug-in); set hotplug.accept_no_iommu: true "
                "to auto-authorize it by UUID alone, which identity cloning defeats [Thunderspy]"
            )
        return ThunderboltPlan("bolt", policy=policy, **base), tuple(notes)

    if policy_wanted == "manual":
        return ThunderboltPlan("none", **base), (
            "profile asks for manual authorization: write 1 to the enclosure's `authorized` "
            "after each plug-in",
        )
    require_iommu = not accept
    if require_iommu and iommu is not True:
        notes.append(
            "the udev rule authorizes the enclosure only while the domain reports "
            "iommu_dma_protection=1, which it does not now: enable VT-d / 'Kernel DMA Protection' "
            "in the firmware, or set hotplug.accept_no_iommu: true to accept the risk"
        )
    if not require_iommu:
        notes.append(
            "warning: the profile accepts Thunderbolt without IOMMU protection; the enclosure is "
            "trusted by UUID alone, which identity cloning defeats (hotplug-security.md §1.5)"
        )
    return ThunderboltPlan("udev", require_iommu=require_iommu, **base), tuple(notes)


# -- building the context -------------------------------------------------------------------------


def build_context(
    facts: HostFacts,
    profile: Any,
    resolution: Any | None,
    mode: str,
    *,
    bolt_available: bool | None = None,
    kernel_params: Iterable[str] = (),
    tool_path: str = DEFAULT_TOOL_PATH,
    venv: str = "/opt/egpu-setup/venv",
    wait_timeout: int = 30,
) -> RenderContext:
    """Validate every input and decide what is rendered. Raises UsageError / ActionRequired."""
    mode = _check_choice(mode, MODES, "mode")
    name = check_profile_name(profile.name)
    hp = profile.hotplug
    runtime_pm_off = _check_bool(hp.runtime_pm_off, "profile hotplug.runtime_pm_off")
    persistenced = _check_bool(hp.persistenced, "profile hotplug.persistenced")
    _check_choice(
        hp.connection, ("thunderbolt", "usb4", "oculink", "any"), "profile hotplug.connection"
    )
    if (
        isinstance(wait_timeout, bool)
        or not isinstance(wait_timeout, int)
        or not 5 <= wait_timeout <= 300
    ):
        raise UsageError(f"wait timeout {wait_timeout!r} is out of range", "use 5 to 300 seconds")

    egpu = facts.egpu
    gpu = PciAddress.parse(egpu.pci_address, "detected eGPU address") if egpu else None
    ids: list[str] = []
    if egpu is not None and egpu.device_id:
        ids.append(check_device_id(egpu.device_id, "detected eGPU device id"))
    for i, dev_id in enumerate(profile.gpu.device_ids):
        dev_id = check_device_id(dev_id, f"profile gpu.device_ids[{i}]")
        if dev_id not in ids:
            ids.append(dev_id)
    if not ids:
        raise UsageError(
            f"profile {name}: no GPU device id and no eGPU detected, "
            "so no rule could match the card",
            "add gpu.device_ids to the profile or connect the eGPU",
        )
    if egpu is not None and egpu.vendor_id and egpu.vendor_id.lower() != NVIDIA_VENDOR:
        raise UsageError(
            f"the eGPU at {gpu.sysfs if gpu else '?'} is not an NVIDIA GPU", "use an NVIDIA GPU"
        )
    # Display mode needs no address here: the boot helper writes Xorg's BusID from the address
    # the eGPU has at that boot (another port means another bus number), or no Xorg file at all
    # when it is absent, so X falls back to the built-in GPU (hotplug-security.md §3.7).

    tb, tb_notes = plan_thunderbolt(facts, hp, egpu, bolt_available)
    notes = list(tb_notes)

    branch = driver_branch(facts, resolution)
    drm_params: tuple[str, ...] = ()
    if mode == "display":
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
            "are set up; "
            "check the session type after logging in again (hotplug-security.md §3.8)"
        )

    family = distro_family(facts)
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

    tool_path = check_path(tool_path, "egpu-setup path")
    if not tool_path.startswith(ROOT_OWNED_PREFIXES):
        notes.append(
            f"egpu-eject runs {tool_path} as root: allow egpu-eject in sudoers only if that file "
            "and every directory above it are root-owned and not writable by the user"
        )

    debian_modules = (facts.os.id or "").lower() == "debian"
    removable = bool(egpu is not None and egpu.removable == "removable")
    internal_nvidia = [g for g in facts.nvidia_gpus if g.external is False]
    if runtime_pm_off and internal_nvidia:
        notes.append(
            f"the internal {internal_nvidia[0].name or 'NVIDIA GPU'} shares the nvidia module: "
            "runtime D3 stays on in the module (battery), only the eGPU's path is kept awake"
        )
    return RenderContext(
        profile=name,
        mode=mode,
        device_ids=tuple(ids),
        gpu=gpu,
        match_removable=removable,
        debian_modules=debian_modules,
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
    )
