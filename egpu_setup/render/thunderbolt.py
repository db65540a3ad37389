"""How the enclosure gets its PCIe tunnel: bolt enrolment, a one-UUID udev rule, or nothing.

Never a blanket rule that authorizes every device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from egpu_setup.detect.facts import Gpu, HostFacts, TbDevice, TbDomain
from egpu_setup.errors import ActionRequired
from egpu_setup.profile.types import HotplugOptions
from egpu_setup.render.checks import check_bool, check_choice, check_uuid


@dataclass(frozen=True)
class ThunderboltPlan:
    """How this enclosure gets its PCIe tunnel (Linux admin-guide/thunderbolt.rst; bolt)."""

    kind: str  # "none" (not Thunderbolt / nothing to do), "bolt", "udev"
    unique_id: str | None = None
    domain: str | None = None
    security: str | None = None
    iommu: bool | None = None
    policy: str | None = None  # bolt policy: iommu / auto / manual
    require_iommu: bool = True  # udev fallback: match only on IOMMU-protected domains
    # bolt already stores this enclosure with a policy: nothing to enrol (and nothing to say
    # about the policy it would get)
    stored: bool = False


_NO_PCIE = ("dponly", "usbonly", "nopcie")


_TB_CONNECTIONS = ("thunderbolt", "usb4")

# How the note starts when no eGPU is visible because its tunnel waits for authorization:
# install says what it will enrol instead (install/enrol.py notes), in one statement.
WAITING = "no eGPU is visible while Thunderbolt devices wait for authorization"


def _enclosure(
    facts: HostFacts, wanted: str | None, egpu: Gpu | None
) -> tuple[TbDevice | None, str | None]:
    """The Thunderbolt device that carries the eGPU's PCIe tunnel, or None and why not.

    Nothing in sysfs ties a peripheral router to the PCI functions behind it: the Thunderbolt
    bus exposes routers and their `authorized`/`unique_id`, not the tunnels (Linux
    Documentation/ABI/testing/sysfs-bus-thunderbolt; tunnels are listed only in debugfs). The
    one kernel link is at the host side: on USB4 hosts whose ACPI gives a root port `usb4-host-
    interface`, drivers/thunderbolt/acpi.c (tb_acpi_add_link) adds a device link root port ->
    NHI (`supplier:pci:<nhi>` under the root port), which names the domain, not the router. So
    the device is taken to be the enclosure only when (a) the profile pins its UUID, or (b) an
    external NVIDIA GPU is detected on a Thunderbolt/USB4 link and exactly one peripheral is (or
    may be) authorized: the GPU is visible, so its tunnel runs through authorized routers, and
    with one candidate it is that one. Residual assumption: detect's `connection` is right and
    `authorized` was read while the GPU was attached (a daisy chain or a dock makes two
    candidates, which is refused). Anything else (eGPU unplugged, a dock alone) names no device:
    a dock's UUID must never be enrolled as the enclosure.
    """
    peripherals = list(facts.tb_peripherals)
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
        waiting = [d for d in peripherals if d.authorized is False and d.unique_id]
        if egpu is None and waiting:
            listed = "; ".join(
                f"{d.vendor or '?'} {d.name or '?'} ({d.unique_id})" for d in waiting
            )
            return None, (
                f"{WAITING} ({listed}): the rules name no enclosure until one is enrolled or "
                "pinned (hotplug.enclosure_unique_id, or install --enclosure UUID)"
            )
        if egpu is None:
            why = "no eGPU is attached now"
        else:
            why = f"the eGPU's link is '{egpu.connection}', not Thunderbolt/USB4"
        return None, (
            f"{why}, so no Thunderbolt device can be tied to it and none is authorized: "
            "connect the eGPU, or pin hotplug.enclosure_unique_id in the profile, then re-run"
        )
    found = facts.enclosure_of(egpu)
    if found is not None:
        return found, None
    candidates = [d for d in peripherals if d.authorized is not False]
    listed = "; ".join(
        f"{d.vendor or '?'} {d.name or '?'}: {d.unique_id or '?'}" for d in candidates
    )
    return None, (
        f"cannot tell which Thunderbolt device is the eGPU's enclosure "
        f"({listed or 'no authorized device is listed'}), so none is authorized: connect the "
        "eGPU alone, or pin hotplug.enclosure_unique_id in the profile, then re-run"
    )


def _stored_policy(facts: HostFacts, uuid: str) -> str | None:
    """The policy bolt stores for this enclosure (boltctl list), None when it stores none."""
    for d in facts.thunderbolt.devices:
        if (d.unique_id or "").lower() == uuid and d.policy:
            return d.policy
    return None


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


def bolt_policy(
    wanted: str, iommu: bool | None, security: str | None, accept_no_iommu: bool
) -> tuple[str, tuple[str, ...]]:
    """The bolt policy to enrol an enclosure with (the strictest the domain allows), and what to
    say about it; plan_thunderbolt and the enrolment in the install flow share it.

    Policy `iommu` acts like `auto` only while IOMMU protection is active, else like `manual`
    (bolt's bolt-enums.h, BOLT_POLICY_IOMMU): the stricter choice wherever the domain has
    protection. At level 'secure' bolt stores a key on the device and challenges it on every
    plug-in, so `auto` is safe there."""
    if wanted == "manual":
        return "manual", ()
    if iommu:
        return "iommu", ()
    if security == "secure" or accept_no_iommu:
        return "auto", ()
    return "manual", (
        "no IOMMU DMA protection: the enclosure is enrolled with policy 'manual' (run "
        "`boltctl authorize UUID` after each plug-in); set hotplug.accept_no_iommu: true "
        "to auto-authorize it by UUID alone, which identity cloning defeats (Thunderspy)",
    )


def domain_of(facts: HostFacts, dev: TbDevice | None) -> TbDomain | None:
    """The Thunderbolt domain `dev` hangs off (the only one, or all agreeing), else None."""
    return _domain_of(facts, dev)


def plan_thunderbolt(
    facts: HostFacts, hotplug: HotplugOptions, egpu: Gpu | None, bolt_available: bool | None
) -> tuple[ThunderboltPlan, tuple[str, ...]]:
    """Decide how the enclosure is authorized: bolt enrolment, a one-UUID udev rule, or nothing.

    Never a blanket rule. Raises ActionRequired (exit 4) when the firmware's security level
    forbids PCIe tunnels, before anything is rendered.
    """
    skip = _no_authorization_needed(facts, hotplug, egpu)
    if skip is not None:
        return skip
    wanted = hotplug.enclosure_unique_id
    if wanted is not None:
        wanted = check_uuid(wanted, "profile hotplug.enclosure_unique_id")
    dev, unknown = _enclosure(facts, wanted, egpu)
    domain = _domain_of(facts, dev)
    security = domain.security if domain else None
    iommu = domain.iommu_dma_protection if domain else None
    if security in _NO_PCIE and (egpu is None or egpu.connection in (*_TB_CONNECTIONS, "unknown")):
        raise ActionRequired(
            f"Thunderbolt security level is '{security}' on "
            f"{domain.name if domain else 'the controller'}:"
            " the firmware allows no PCIe tunnel, so no eGPU can appear; nothing was written",
            "in the firmware setup (BIOS/UEFI) set Thunderbolt security to 'User Authorization' "
            "(user) or 'Secure Connect' (secure), or enable 'PCIe tunneling' on USB4; then re-run",
        )
    if security in (None, "none"):
        return ThunderboltPlan("none", security=security, iommu=iommu), _open_notes(security, iommu)
    uuid = wanted or (dev.unique_id if dev else None)
    if uuid is None:
        # Enrol nothing and write no udev rule: a guess could authorize a dock or a stranger's
        # device for good. The boot helper then waits for the GPU only.
        return ThunderboltPlan("none", security=security, iommu=iommu), (
            unknown
            or "the enclosure has no unique_id in sysfs; pin hotplug.enclosure_unique_id in the "
            "profile",
        )
    base = ThunderboltPlan(
        "none",
        unique_id=check_uuid(uuid, "Thunderbolt device unique_id"),
        domain=domain.name if domain else None,
        security=security,
        iommu=iommu,
    )
    accept = check_bool(hotplug.accept_no_iommu, "profile hotplug.accept_no_iommu")
    policy = check_choice(
        hotplug.thunderbolt_policy,
        ("iommu", "auto", "manual"),
        "profile hotplug.thunderbolt_policy",
    )
    if security == "secure" and bolt_available is False:
        raise ActionRequired(
            "Thunderbolt security level 'secure' needs bolt for the key challenge; a udev rule "
            "would authorize without the key, so none is written",
            "install bolt (Debian/Ubuntu: apt-get install bolt) and re-run",
        )
    use_bolt = bolt_available is not False or security == "secure"
    stored = _stored_policy(facts, uuid) if use_bolt else None
    if stored:
        # boltd already has this enclosure with a policy: nothing to enrol (render and install
        # plan the same commands)
        return replace(base, kind="bolt", policy=stored, stored=True), ()
    if use_bolt:
        return _by_bolt(base, policy, accept)
    return _by_udev(base, policy, accept)


def _no_authorization_needed(
    facts: HostFacts, hotplug: HotplugOptions, egpu: Gpu | None
) -> tuple[ThunderboltPlan, tuple[str, ...]] | None:
    """No Thunderbolt in the way (OCuLink, a plain slot, no controller): nothing to authorize."""
    connection = hotplug.connection
    if connection == "oculink" or (egpu is not None and egpu.connection in ("oculink", "pcie")):
        return ThunderboltPlan("none"), ("OCuLink/PCIe link: no Thunderbolt authorization needed",)
    if facts.thunderbolt.domains:
        return None
    if connection in _TB_CONNECTIONS and egpu is None:
        return ThunderboltPlan("none"), (
            "no Thunderbolt controller was found (it may be powered down until something is "
            "plugged in: `boltctl power -q`); re-render with the enclosure connected",
        )
    return ThunderboltPlan("none"), ()


def _open_notes(security: str | None, iommu: bool | None) -> tuple[str, ...]:
    """Level 'none' (or unknown): the firmware authorizes by itself; say what that means."""
    if security != "none":
        return ()
    notes = ["Thunderbolt security level 'none': the firmware connects every device"]
    if iommu is False:
        notes.append(
            "warning: no IOMMU DMA protection either; any Thunderbolt device can read "
            "memory (enable VT-d / 'Kernel DMA Protection' in the firmware)"
        )
    return tuple(notes)


def _by_bolt(
    base: ThunderboltPlan, wanted: str, accept: bool
) -> tuple[ThunderboltPlan, tuple[str, ...]]:
    """Enrolment in boltd with the policy bolt_policy chooses."""
    policy, notes = bolt_policy(wanted, base.iommu, base.security, accept)
    return replace(base, kind="bolt", policy=policy), notes


def _by_udev(
    base: ThunderboltPlan, wanted: str, accept: bool
) -> tuple[ThunderboltPlan, tuple[str, ...]]:
    """Without bolt: a udev rule for this one UUID, only while IOMMU protection is on unless
    the profile accepts the risk; or nothing, when the profile wants manual authorization."""
    if wanted == "manual":
        return base, (
            "profile asks for manual authorization: write 1 to the enclosure's `authorized` "
            "after each plug-in",
        )
    require_iommu = not accept
    if require_iommu and base.iommu is not True:
        note = (
            "the udev rule authorizes the enclosure only while the domain reports "
            "iommu_dma_protection=1, which it does not now: enable VT-d / 'Kernel DMA Protection' "
            "in the firmware, or set hotplug.accept_no_iommu: true to accept the risk"
        )
    elif not require_iommu:
        note = (
            "warning: the profile accepts Thunderbolt without IOMMU protection; the enclosure is "
            "trusted by UUID alone, which identity cloning defeats (Thunderspy)"
        )
    else:
        return replace(base, kind="udev", require_iommu=True), ()
    return replace(base, kind="udev", require_iommu=require_iommu), (note,)
