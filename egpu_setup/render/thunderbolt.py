"""How the enclosure gets its PCIe tunnel: bolt enrolment, a one-UUID udev rule, or nothing.

Never a blanket rule that authorizes every device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egpu_setup.detect.facts import Gpu, HostFacts, TbDevice, TbDomain
from egpu_setup.errors import ActionRequired
from egpu_setup.render.checks import check_bool, check_choice, check_uuid


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


def bolt_policy(
    wanted: str, iommu: bool | None, security: str | None, accept_no_iommu: bool
) -> tuple[str, tuple[str, ...]]:
    """The bolt policy to enrol an enclosure with, and what to say about it.

    `iommu` acts like `auto` only while IOMMU protection is active, else like `manual`
    (bolt-enums.h [B2]): the stricter choice wherever the domain has protection."""
    if wanted == "manual":
        return "manual", ()
    if iommu:
        return "iommu", ()
    if security == "secure" or accept_no_iommu:
        # secure: bolt stores a key on the device and challenges it on every plug-in [B1].
        return "auto", ()
    return "manual", (
        "no IOMMU DMA protection: the enclosure is enrolled with policy 'manual' (run "
        "`boltctl authorize UUID` after each plug-in); set hotplug.accept_no_iommu: true "
        "to auto-authorize it by UUID alone, which identity cloning defeats [Thunderspy]",
    )


def domain_of(facts: HostFacts, dev: TbDevice | None) -> TbDomain | None:
    """The Thunderbolt domain `dev` hangs off (the only one, or all agreeing), else None."""
    return _domain_of(facts, dev)


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
    accept = check_bool(hotplug.accept_no_iommu, "profile hotplug.accept_no_iommu")
    policy_wanted = check_choice(
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
        policy, why = bolt_policy(policy_wanted, iommu, security, accept)
        return ThunderboltPlan("bolt", policy=policy, **base), (*notes, *why)

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
