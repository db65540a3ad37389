"""Enrolling the enclosure, one core for `install` and a lab image's first boot.

On a fresh laptop no GPU is visible until the enclosure's PCIe tunnel is authorized: the
Thunderbolt device is connected with `authorized` = 0 (Documentation/admin-guide/thunderbolt.rst,
"Security levels and how to use them"). Which device to authorize is never guessed:

- `choose` (pure) picks a device only when the lab's policy names it: a UUID the profile pins
  (`hotplug.enclosure_unique_id`, `hotplug.enclosure_unique_ids`) or given as `--enclosure`; or,
  only when the profile opts in (a stated risk), the first unauthorized device of a model it
  names (`hotplug.first_boot_enrol_model` by sysfs vendor and name, `hotplug.first_boot_enrol`
  by the DROM's vendor:device ids) or, with `first_boot_enrol: first-seen`, the first one seen.
  Otherwise a person picks one (install, interactively) or
  none is enrolled, and the devices are listed by vendor, name and UUID.
- `apply_enrolment` authorizes it through the Host: `boltctl enroll --policy P UUID` where bolt
  can enrol (`bolt_can_enrol`, which the render plan asks too; stored in boltd's database,
  undone by `egpu-setup rollback`: the executor records `boltctl forget UUID`), else the sysfs
  write `authorized` = 1, which lasts until the device is unplugged (the udev rule install
  renders for that UUID then authorizes it at every plug-in).
- `wait_for_egpu` then waits, bounded, for the GPU behind the tunnel to appear.

Never more than the one device chosen, never a blanket rule.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from egpu_setup.detect.facts import HostFacts, TbDevice
from egpu_setup.errors import ActionRequired, UsageError
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger
from egpu_setup.profile.types import HotplugOptions, Profile

if TYPE_CHECKING:
    from egpu_setup.install.prepared import Prepared
    from egpu_setup.state.paths import StatePaths

log = get_logger("egpu_setup.install")

TB_DEVICES = "/sys/bus/thunderbolt/devices"
ENROL_WAIT_S = 60  # the GPU shows up within seconds of the tunnel; generous for a cold enclosure
POLL_S = 1.0


@dataclass(frozen=True)
class EnrolPolicy:
    """Which unauthorized device may be enrolled without asking anyone."""

    pinned: tuple[str, ...] = ()  # UUIDs, lower case
    first_of_model: str | None = None  # "Razer Core X": the profile's opt-in (a risk)
    first_of_ids: tuple[tuple[str, str], ...] = ()  # (vendor_id, device_id): also an opt-in
    first_seen: bool = False  # any model: the widest opt-in, still one device by its UUID

    @classmethod
    def of(cls, hotplug: HotplugOptions, extra: Sequence[str] = ()) -> EnrolPolicy:
        from egpu_setup.render.checks import check_uuid

        given = tuple(check_uuid(u, "--enclosure") for u in extra)
        return cls(
            tuple(dict.fromkeys((*given, *hotplug.pinned_enclosures))),
            hotplug.first_boot_enrol_model,
            hotplug.first_boot_enrol_ids,
            hotplug.first_boot_first_seen,
        )


@dataclass(frozen=True)
class Choice:
    """The device to enrol (None: none) and why, in words."""

    device: TbDevice | None
    how: str  # pinned / model / ids / first-seen / asked / none
    reason: str


def describe(dev: TbDevice) -> str:
    """ "Sonnet Technologies, Inc. eGFX Breakaway Box 750ex (00e8d1a4-...)"."""
    name = " ".join(p for p in (dev.vendor, dev.name) if p) or dev.sysfs_name or "unnamed device"
    return f"{name} ({dev.unique_id or 'no unique_id'})"


def candidates(facts: HostFacts) -> tuple[TbDevice, ...]:
    """Connected Thunderbolt peripherals whose tunnels are not authorized, with a unique_id (a
    host router, route 0, is never one: sysfs-bus-thunderbolt)."""
    return tuple(
        d
        for d in facts.thunderbolt.devices
        if d.authorized is False and d.unique_id and not (d.sysfs_name or "").endswith("-0")
    )


def needs_enrolment(facts: HostFacts) -> bool:
    """No NVIDIA GPU is visible, and a Thunderbolt device waits for authorization."""
    return not facts.nvidia_gpus and bool(candidates(facts))


def _model(dev: TbDevice) -> tuple[str, ...]:
    full = " ".join(p for p in (dev.vendor, dev.name) if p)
    return tuple(s.casefold() for s in (full, dev.name or "") if s)


# how a device was chosen without being pinned or picked by a person: trusted for what it claims
UNPINNED = ("model", "ids", "first-seen")


def _ids(dev: TbDevice) -> str:
    return f"0x{int(dev.vendor_id or '0', 16):x}:0x{int(dev.device_id or '0', 16):x}"


def choose(devices: Sequence[TbDevice], policy: EnrolPolicy) -> Choice:
    """The device the policy names, else none (pure; module docstring). Pinned first; then, in
    sysfs order, the first of the named model, of the listed ids, or any (first-seen)."""
    for dev in devices:
        if (dev.unique_id or "").lower() in policy.pinned:
            return Choice(dev, "pinned", f"{describe(dev)} is pinned")
    in_order = sorted(devices, key=lambda d: d.sysfs_name or "")
    if policy.first_of_model:
        want = policy.first_of_model.casefold()
        for dev in in_order:
            if want in _model(dev):
                return Choice(
                    dev,
                    "model",
                    f"{describe(dev)} is the first {policy.first_of_model} seen "
                    "(hotplug.first_boot_enrol_model: trusted for its claimed model name)",
                )
    for dev in in_order:
        if (dev.vendor_id, dev.device_id) in policy.first_of_ids:
            return Choice(
                dev,
                "ids",
                f"{describe(dev)} is the first device with ids {_ids(dev)} seen "
                "(hotplug.first_boot_enrol: trusted for the ids it reports)",
            )
    if policy.first_seen and in_order:
        return Choice(
            in_order[0],
            "first-seen",
            f"{describe(in_order[0])} is the first unauthorized device seen "
            "(hotplug.first_boot_enrol: first-seen: trusted for being first)",
        )
    listed = "; ".join(describe(d) for d in devices) or "none"
    return Choice(None, "none", f"unauthorized Thunderbolt devices: {listed}")


def unpinned_refusal(choice: Choice, facts: HostFacts, hotplug: HotplugOptions) -> str | None:
    """Why a device chosen by its claimed model (not pinned, not picked by a person) is not
    enrolled: only where the domain's IOMMU DMA protection is on (sysfs iommu_dma_protection,
    Documentation/admin-guide/thunderbolt.rst "DMA protection utilizing IOMMU"), since anything
    that claims the model name gets DMA; unless the profile accepts that risk
    (hotplug.accept_no_iommu). None: it may be enrolled."""
    from egpu_setup.render.thunderbolt import domain_of

    if choice.how not in UNPINNED or choice.device is None or hotplug.accept_no_iommu:
        return None
    domain = domain_of(facts, choice.device)
    if domain is not None and domain.iommu_dma_protection:
        return None
    where = domain.name if domain else "its domain"
    key = "hotplug.first_boot_enrol_model" if choice.how == "model" else "hotplug.first_boot_enrol"
    return (
        f"{describe(choice.device)} is chosen by {key}, but {where} has no "
        f"IOMMU DMA protection ({TB_DEVICES}/{where}/iommu_dma_protection is not 1), so a device "
        "trusted by its claimed name is not enrolled; turn on the IOMMU in the firmware, pin "
        "hotplug.enclosure_unique_ids, or set hotplug.accept_no_iommu: true to accept the risk"
    )


def notes(facts: HostFacts, policy: EnrolPolicy) -> list[str]:
    """What a dry run says about enrolment (nothing when no device waits)."""
    if not needs_enrolment(facts):
        return []
    devices = candidates(facts)
    choice = choose(devices, policy)
    if choice.device is not None:
        return [
            f"no eGPU is visible: install enrols {describe(choice.device)} ({choice.how}), "
            f"waits up to {ENROL_WAIT_S} s for the GPU, then plans again"
        ]
    listed = "; ".join(describe(d) for d in devices)
    return [
        f"no eGPU is visible and {len(devices)} Thunderbolt device(s) wait for authorization "
        f"({listed}): install asks which one is the enclosure to enrol; with --yes only a "
        "pinned hotplug.enclosure_unique_id or --enclosure UUID is enrolled"
    ]


def bolt_can_enrol(host: Host) -> bool | None:
    """Whether `boltctl enroll` can authorize the enclosure on `host`; else the one-UUID udev
    rule does (and, for the enrolment now, the sysfs write). The one place this is decided: the
    render plan (install/inputs.py) and apply_enrolment ask it.

    An image (--root) cannot enroll: boltd is not running in a chroot, so the rule it carries
    must authorize the enclosure on first boot, bolt or not. A recording cannot say (None: the
    render plan infers it from the recorded facts)."""
    if host.kind == "root":
        return False
    if host.kind == "recorded":
        return None
    return host.which("boltctl") is not None


def apply_enrolment(
    host: Host, paths: StatePaths, dev: TbDevice, facts: HostFacts, hotplug: HotplugOptions
) -> str:
    """Authorize `dev` (and store it where bolt runs); what was done, in words."""
    from egpu_setup.render.thunderbolt import bolt_policy, domain_of

    if not dev.unique_id or not dev.sysfs_name:
        raise UsageError(f"{describe(dev)} has no unique_id or sysfs name", "re-plug it")
    domain = domain_of(facts, dev)
    security = domain.security if domain else None
    iommu = domain.iommu_dma_protection if domain else None
    if bolt_can_enrol(host):
        policy, said = bolt_policy(
            hotplug.thunderbolt_policy, iommu, security, hotplug.accept_no_iommu
        )
        for line in said:
            log.warning("%s", line)
        _run_enrol(host, paths, ("boltctl", "enroll", "--policy", policy, dev.unique_id))
        return f"enrolled {describe(dev)} in bolt with policy {policy}"
    if security == "secure":
        raise ActionRequired(
            f"{describe(dev)}: security level 'secure' needs bolt for the key challenge",
            "install bolt (Debian/Ubuntu: apt-get install bolt), then run again",
        )
    host.write_attr(f"{TB_DEVICES}/{dev.sysfs_name}/authorized", "1")
    return f"authorized {describe(dev)} ({TB_DEVICES}/{dev.sysfs_name}/authorized = 1)"


def _run_enrol(host: Host, paths: StatePaths, argv: tuple[str, ...]) -> None:
    """Through the executor, under the run lock: journaled, and rollback forgets it again."""
    from egpu_setup.execute.executor import ExecOptions, execute
    from egpu_setup.plan.steps import Plan, RunCommand
    from egpu_setup.state.lock import RunLock

    step = RunCommand(argv, "authorize and store the enclosure", skip_if_missing=False)
    with RunLock(paths.lock, paths.anchor):
        execute(Plan((step,)), host, paths, ExecOptions.from_env())


def wait_for_egpu(
    host: Host,
    timeout_s: float,
    *,
    detect: Callable[[Host], HostFacts] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> HostFacts | None:
    """Facts with an NVIDIA GPU visible, detected within timeout_s; None when none appeared."""
    from egpu_setup.detect.probe import detect_host

    probe = detect or detect_host
    deadline = time.monotonic() + timeout_s
    while True:
        facts = probe(host)
        if facts.nvidia_gpus:
            return facts
        if time.monotonic() >= deadline:
            return None
        sleep(POLL_S)


def with_enclosure(profile: Profile, uuid: str | None) -> Profile:
    """The profile with --enclosure as its pinned enclosure (it ties the rendered rules too)."""
    if not uuid:
        return profile
    from egpu_setup.render.checks import check_uuid

    pinned = check_uuid(uuid, "--enclosure")
    return dataclasses.replace(
        profile, hotplug=dataclasses.replace(profile.hotplug, enclosure_unique_id=pinned)
    )


def enrol_stage(
    prepared: Prepared,
    *,
    ask: Callable[[Sequence[TbDevice]], TbDevice | None] | None,
    say: Callable[[str], None],
    replan: Callable[[Any], Prepared],
    wait_s: float = ENROL_WAIT_S,
) -> Prepared:
    """Before a real install on the running system: enrol the enclosure when no eGPU is
    visible because its tunnel waits for authorization, wait for the GPU and plan again.

    `ask` lets a person pick (None with --yes: only the policy decides); `replan` is prepare."""
    facts = prepared.facts
    if prepared.target.kind != "live" or not needs_enrolment(facts):
        return prepared
    policy = EnrolPolicy.of(prepared.profile.hotplug)
    devices = candidates(facts)
    choice = choose(devices, policy)
    if choice.device is None and ask is not None:
        picked = ask(devices)
        if picked is not None:
            choice = Choice(picked, "asked", f"{describe(picked)} was chosen")
    refused = unpinned_refusal(choice, facts, prepared.profile.hotplug)
    if refused:
        say(f"no eGPU is visible; enrolled nothing: {refused}")
        return prepared
    if choice.device is None:
        say(f"no eGPU is visible; enrolled nothing ({choice.reason}): pass --enclosure UUID")
        return prepared
    say(
        apply_enrolment(
            prepared.target, prepared.paths, choice.device, facts, prepared.profile.hotplug
        )
    )
    seen = wait_for_egpu(prepared.target, wait_s)
    if seen is None:
        say(
            f"no NVIDIA GPU appeared within {wait_s:g} s after enrolling "
            f"{describe(choice.device)}: is it the enclosure, and is the card powered?"
        )
    options = dataclasses.replace(prepared.options, enclosure=choice.device.unique_id)
    return replan(options)
