"""What a person must do, said before anything changes: another GPU manager to undo first, the
Secure Boot key to enrol at the console after the driver is built.

Both are computed when the plan is made, so `install --dry-run` shows them; `apply` refuses a
blocking manager (exit 4) before any change unless --force, and stops with exit 4 after the
automatic steps when the module signing key still waits for a person.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import ActionRequired, EgpuSetupError
from egpu_setup.host.machine import Host
from egpu_setup.plan.steps import AptInstall, Plan
from egpu_setup.profile.types import HotplugOptions


@dataclass(frozen=True)
class PersonAction:
    """One thing a person must do. `when`: "before" (install refuses until it is done, or
    --force) or "after" (the run does its automatic steps first, then stops with exit 4)."""

    id: str
    when: str
    summary: str
    steps: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "when": self.when,
            "summary": self.summary,
            "steps": list(self.steps),
        }


# -- another GPU manager ---------------------------------------------------------------------------


def manager_actions(
    target: Host, mode: str, only: frozenset[str]
) -> tuple[list[PersonAction], list[str]]:
    """(what must be undone first, warnings) for the GPU managers configured on the target.

    Blocking only when the plan sets up the driver or the configuration: a `--only torch` run
    (a CI box, a laptop away from its eGPU) is told, not stopped."""
    from egpu_setup.doctor.collect import probe_manager_files
    from egpu_setup.doctor.managers import manager_states

    actions: list[PersonAction] = []
    warnings: list[str] = []
    for state in manager_states(probe_manager_files(target)):
        m = state.manager
        if state.blocks(mode) and only & {"driver", "config"}:
            why = (
                "it conflicts with display mode (two tools writing the display configuration)"
                if state.effect == "display"
                else "the NVIDIA driver cannot drive the eGPU while it is so"
                if state.effect == "disables-nvidia"
                else "it manages the same eGPU with its own boot units and Xorg configuration"
            )
            actions.append(
                PersonAction(
                    f"competing-gpu-manager:{m.id}",
                    "before",
                    f"{state.summary()}: {why}",
                    (f"undo it: {state.undo(mode)}", "then run this command again"),
                )
            )
        elif state.blocks(mode) or (state.effect == "x-on-nvidia" and mode == "compute"):
            warnings.append(
                f"{state.summary()}: to undo it, {state.undo(mode)} (`egpu-setup doctor` has "
                "the details)"
            )
    return actions, warnings


def refuse_blocking(actions: tuple[PersonAction, ...], force: bool, warn: Any) -> None:
    """Exit 4 before any change while something must be undone first; --force goes on."""
    before = [a for a in actions if a.when == "before"]
    if not before:
        return
    if force:
        for a in before:
            warn(f"going ahead although {a.summary} (--force)")
        return
    first = before[0]
    more = f" (and {len(before) - 1} more, shown by --dry-run)" if len(before) > 1 else ""
    raise ActionRequired(
        f"{first.summary}; nothing was changed{more}",
        f"{first.steps[0]}, then run this command again (or pass --force to install anyway)",
    )


# -- Secure Boot: the DKMS module signing key ------------------------------------------------------

# Where DKMS keeps the key it signs modules with. Debian (dkms >= 3.0.4): /var/lib/dkms/mok.pub,
# made on the first build; Ubuntu: shim-signed's MOK.der, made by `update-secureboot-policy
# --new-key` when missing (dkms.in prepare_mok, https://github.com/dkms-project/dkms/blob/
# 04154266549a7b3723f8e7a18515b59c34e921b1/dkms.in; README "Module signing").
DKMS_KEY = "/var/lib/dkms/mok.pub"
UBUNTU_KEY = "/var/lib/shim-signed/mok/MOK.der"
# a lab's own key, which `install --root --mok-key` puts first in DKMS's way (install/mok_key.py)
LAB_CERT = "/etc/egpu-setup/mok/mok.der"
LAB_HASH = "/etc/egpu-setup/mok/mok.hash"
MOK_KEYS = (LAB_CERT, DKMS_KEY, UBUNTU_KEY)

# The console steps, as the dkms README ("Secure Boot") and the Debian wiki give them:
# https://github.com/dkms-project/dkms/blob/04154266549a7b3723f8e7a18515b59c34e921b1/README.md,
# https://wiki.debian.org/SecureBoot
_ENROL = (
    "reboot; in the blue MokManager screen choose 'Enroll MOK', 'Continue', 'Yes', type that "
    "password, and let it reboot"
)


def parse_test_key(text: str | None) -> str:
    """`mokutil --test-key FILE` -> not-enrolled / pending / enrolled / unknown.

    Its exit status cannot tell them apart: 0 for "is already enrolled", "is already in the
    enrollment request" (imported, waiting for MokManager) and "is already in db"; 1 only for
    "is not enrolled" (mokutil src/mokutil.c test_key, print_skip_message:
    https://github.com/lcp/mokutil/blob/9ae73db13e2bf0c610b0dcced5410fd6dc61f68a/src/mokutil.c).
    So the text decides."""
    low = (text or "").lower()
    if "is not enrolled" in low:
        return "not-enrolled"
    if "enrollment request" in low:
        return "pending"
    if "already enrolled" in low or "already in db" in low:
        return "enrolled"
    return "unknown"


def signing_key(facts: HostFacts, target: Host) -> str:
    """The key DKMS signs with here: one that exists, else the distribution's default."""
    for key in MOK_KEYS:
        if target.exists(key):
            return key
    ids = {(facts.os.id or "").lower(), *facts.os.id_like}
    return UBUNTU_KEY if "ubuntu" in ids else DKMS_KEY


def key_state(target: Host, key: str) -> str:
    """missing / not-enrolled / pending / enrolled / unknown (no mokutil, or an image, whose
    key each machine enrols at its own console)."""
    if not target.exists(key):
        return "missing"
    if target.kind == "root":
        return "unknown"
    # a recording replays commands/mokutil-test-key.txt; the live host runs it (read-only)
    text = target.command("mokutil-test-key", ["mokutil", "--test-key", key], timeout=30.0)
    return parse_test_key(text)


def has_dkms_driver(plan: Plan, target: Host) -> bool:
    """The plan installs a driver whose module DKMS builds; or, planning no driver, such a
    driver is installed (a plan that installs one replaces it)."""
    return bool(dkms_packages(plan, target))


def dkms_packages(plan: Plan, target: Host) -> tuple[str, ...]:
    """The driver packages whose module DKMS builds: the planned ones, or, planning none, the
    installed ones.

    Ubuntu's linux-modules-nvidia-* are prebuilt and signed by Canonical's key, which the
    firmware already trusts: a plan with them needs no enrolment."""
    from egpu_setup.plan.installed import installed_packages

    planned = [
        p
        for s in plan.steps
        if isinstance(s, AptInstall) and s.part_name == "driver"
        for p in s.packages
    ]
    if planned:
        if any(p.startswith("linux-modules-nvidia-") for p in planned):
            return ()
        return tuple(p for p in planned if _is_dkms_nvidia(p)) or tuple(planned)
    return tuple(p for p in installed_packages(target) if _is_dkms_nvidia(p))


def _is_dkms_nvidia(package: str) -> bool:
    # Debian: nvidia-kernel-dkms, nvidia-open-kernel-dkms; Ubuntu and NVIDIA's repository:
    # nvidia-dkms-<branch>[-open]
    return package.startswith("nvidia-dkms-") or (
        package.startswith("nvidia") and package.endswith("kernel-dkms")
    )


def mok_action(facts: HostFacts, plan: Plan, target: Host) -> tuple[PersonAction | None, str]:
    """(the console steps, the key) when Secure Boot is on and a DKMS-built module must be
    signed by a key the firmware does not trust yet; (None, key) otherwise."""
    key = signing_key(facts, target)
    if not facts.os.secure_boot or target.kind == "root" or not has_dkms_driver(plan, target):
        return None, key
    state = key_state(target, key)
    if state == "enrolled":
        return None, key
    import_step = f"run `sudo mokutil --import {key}` and choose a one-time password"
    steps: list[str] = []
    if state == "missing":
        steps.append(f"DKMS creates the signing key {key} when it builds the module (this run)")
    if state != "pending":
        steps.append(import_step)
    steps += [_ENROL, "run this command again: it checks the key and goes on"]
    summary = (
        f"Secure Boot is on: the NVIDIA module DKMS builds is signed with {key}, which the "
        "firmware must trust before the module loads"
    )
    if state == "pending":
        summary += " (the key is imported and waits for MokManager)"
    elif state == "unknown":
        summary += " (whether it is enrolled could not be checked: mokutil --test-key)"
    return PersonAction("mok-enrolment", "after", summary, tuple(steps)), key


def require_enrolled_key(target: Host, key: str) -> None:
    """Exit 4 with the console steps when the key exists and is not enrolled yet.

    Called after the automatic steps (DKMS made the key with its first build), so the reboot
    into MokManager is also the one the new driver needs."""
    state = key_state(target, key)
    if state == "not-enrolled":
        raise ActionRequired(
            f"Secure Boot is on and the module signing key {key} is not enrolled: the NVIDIA "
            "module will not load until it is (everything else is done)",
            f"run `sudo mokutil --import {key}`, choose a one-time password, reboot, pick "
            "'Enroll MOK' in the blue MokManager screen, then run this command again",
        )
    if state == "pending":
        raise ActionRequired(
            f"Secure Boot is on and the module signing key {key} waits for enrolment at the "
            "console (everything else is done)",
            "reboot, pick 'Enroll MOK' in the blue MokManager screen and type the password "
            "chosen at import, then run this command again",
        )


def mok_status(host: Host, secure_boot: bool | None) -> str | None:
    """The first-boot report's `mok`: "mok-needed" while Secure Boot is on and the key DKMS
    signed the installed NVIDIA module with is not enrolled (or only imported, waiting for
    MokManager), "mok-enrolled" once it is; None where no key is in question (Secure Boot off
    or unknown, no DKMS-built driver, no key yet) or mokutil cannot tell."""
    from egpu_setup.plan.installed import installed_packages

    if not secure_boot or not any(_is_dkms_nvidia(p) for p in installed_packages(host)):
        return None
    key = next((k for k in MOK_KEYS if host.exists(k)), None)
    if key is None:
        return None
    state = key_state(host, key)
    return {"enrolled": "mok-enrolled", "not-enrolled": "mok-needed", "pending": "mok-needed"}.get(
        state
    )


# -- a lab image (--root): what each laptop that boots it will need --------------------------------

# Every laptop booting the image asks for these, not the build machine, so they are shown and never
# stop the build: `when` = "each-laptop".
EACH_LAPTOP = "each-laptop"


def _distro(facts: HostFacts) -> str:
    """ "Debian 12": the image's distribution, as its os-release names it."""
    name = (facts.os.id or "this distribution").capitalize()
    return f"{name} {facts.os.version_id}" if facts.os.version_id else name


def image_actions(
    facts: HostFacts, plan: Plan, hotplug: HotplugOptions, target: Host, only: frozenset[str]
) -> list[PersonAction]:
    """What a person must do at each laptop that boots an image built with --root, said by the
    dry run before anything is built: the Secure Boot key, the enclosure, the firmware."""
    if target.kind != "root":
        return []
    actions: list[PersonAction] = []
    dkms = dkms_packages(plan, target) if "driver" in only else ()
    lab = any(getattr(s, "path", None) == LAB_CERT for s in plan.steps) or target.exists(LAB_CERT)
    if dkms and lab:
        actions.append(_lab_key_action(dkms))
    elif dkms:
        key = signing_key(facts, target)
        actions.append(
            PersonAction(
                "mok-enrolment",
                EACH_LAPTOP,
                f"where Secure Boot is on: {', '.join(dkms)} is built by DKMS inside the image "
                f"and its module signed with {key}, a key made at build time and the same on "
                "every copy; the firmware of each laptop must trust it before the module loads",
                (
                    f"at the laptop: `sudo mokutil --import {key}` with a one-time password",
                    _ENROL,
                    "instead: turn Secure Boot off in the firmware setup, or build the image "
                    f"from a distribution whose archive ships the module prebuilt and signed "
                    f"({_distro(facts)}'s has none; Ubuntu's linux-modules-nvidia-<branch>-"
                    "<flavour> are signed by Canonical's key, which shim trusts)",
                ),
            )
        )
    if "config" in only and not hotplug.pinned_enclosures:
        actions += _unpinned_enrol_actions(hotplug)
    if "config" in only and not hotplug.pinned_enclosures and not hotplug.unpinned_enrol:
        actions.append(
            PersonAction(
                "enclosure-to-pin",
                EACH_LAPTOP,
                "where Thunderbolt security is 'user' or 'secure': the first-boot unit enrols "
                "no enclosure, since the profile pins none, and its report says not-enrolled",
                (
                    "at the laptop: `boltctl list`, then `sudo boltctl enroll --policy iommu "
                    "UUID` for the enclosure",
                    "instead: pin hotplug.enclosure_unique_ids (the lab's enclosures) in the "
                    "profile, or opt in to hotplug.first_boot_enrol_model or "
                    "hotplug.first_boot_enrol (the first device of that model, of those ids, or "
                    "the first seen is trusted for what it claims)",
                ),
            )
        )
    if "config" in only:
        iommu = (
            "without it the enclosure is enrolled with policy 'manual' (authorized by hand at "
            "each plug-in)"
            if not hotplug.accept_no_iommu
            else "the profile accepts the risk (hotplug.accept_no_iommu)"
        )
        actions.append(
            PersonAction(
                "firmware-settings",
                EACH_LAPTOP,
                "the image cannot set the firmware: Thunderbolt security and IOMMU DMA "
                "protection are each laptop's own",
                (
                    "in the firmware setup: Thunderbolt security 'User Authorization' (user) or "
                    "'Secure Connect' (secure), never 'DisplayPort only'/'USB only', which allow "
                    "no PCIe tunnel",
                    "turn on the IOMMU (VT-d / AMD-Vi, 'Kernel DMA Protection') so "
                    f"/sys/bus/thunderbolt/devices/domain0/iommu_dma_protection reads 1; {iommu}",
                ),
            )
        )
    return actions


def _unpinned_enrol_actions(hotplug: HotplugOptions) -> list[PersonAction]:
    """The enclosure policy of a profile that pins none and opts in to enrolling one by what it
    claims (install/enrol.py choose): each says whom first boot trusts, and under which guard."""
    guard = (
        "the profile accepts a domain without IOMMU DMA protection (hotplug.accept_no_iommu)"
        if hotplug.accept_no_iommu
        else "only where the domain has IOMMU DMA protection"
    )
    instead = "instead: pin hotplug.enclosure_unique_ids (the lab's enclosures)"
    first = "at the laptop: connect the lab's enclosure before any other Thunderbolt device"
    out: list[PersonAction] = []
    if hotplug.first_boot_enrol_model:
        out.append(
            PersonAction(
                "enclosure-by-model",
                EACH_LAPTOP,
                "the first-boot unit enrols the first unauthorized Thunderbolt device that "
                f"calls itself '{hotplug.first_boot_enrol_model}' "
                f"(hotplug.first_boot_enrol_model), by its unique id, {guard}",
                (f"{first} (anything claiming that name first is trusted)", instead),
            )
        )
    if hotplug.first_boot_enrol_ids:
        ids = ", ".join(hotplug.first_boot_enrol or [])
        out.append(
            PersonAction(
                "enclosure-by-id",
                EACH_LAPTOP,
                "the first-boot unit enrols the first unauthorized Thunderbolt device whose "
                f"vendor:device ids are {ids} (hotplug.first_boot_enrol), by its unique id, "
                f"{guard}",
                (f"{first} (anything reporting those ids first is trusted)", instead),
            )
        )
    if hotplug.first_boot_first_seen:
        out.append(
            PersonAction(
                "enclosure-first-seen",
                EACH_LAPTOP,
                "the first-boot unit enrols the first unauthorized Thunderbolt device it sees, "
                f"whatever it is (hotplug.first_boot_enrol: first-seen), by its unique id, {guard}",
                (f"{first} (any device plugged in first is trusted)", instead),
            )
        )
    return out


def _lab_key_action(dkms: tuple[str, ...]) -> PersonAction:
    """The one console step left with the lab's key (--mok-key): first boot has queued it."""
    return PersonAction(
        "mok-enrolment",
        EACH_LAPTOP,
        f"where Secure Boot is on: {', '.join(dkms)} is built by DKMS inside the image and its "
        f"module signed with the lab's key ({LAB_CERT}, from --mok-key); the first-boot unit "
        f"queues its enrolment (`mokutil --import {LAB_CERT} --hash-file {LAB_HASH}`) and "
        "reports mok-needed until it is enrolled",
        (
            "at the laptop, once, at the boot after the first: in the blue MokManager screen "
            "choose 'Enroll MOK', 'Continue', 'Yes', type the lab's one-time password, and let "
            "it reboot (MokManager waits a few seconds for a key before it boots on)",
            "after that, images built with the same --mok-key need no step at that laptop",
            "instead: turn Secure Boot off in the firmware setup",
        ),
    )


def queue_lab_key(host: Host, secure_boot: bool | None) -> str | None:
    """First boot: queue the lab's key for MokManager (`mokutil --import CERT --hash-file HASH`,
    the one-time password's hash chosen at build time, so nobody types it here) while Secure
    Boot is on and the key is not enrolled nor already queued. What was done, in words; None
    when nothing was to do."""
    if not secure_boot or not (host.exists(LAB_CERT) and host.exists(LAB_HASH)):
        return None
    if key_state(host, LAB_CERT) != "not-enrolled":
        return None
    argv = ["mokutil", "--import", LAB_CERT, "--hash-file", LAB_HASH]
    try:
        res = host.run(argv, timeout=60.0)
    except EgpuSetupError as exc:
        return f"mokutil --import did not run: {exc.message}"
    if res.rc != 0:
        tail = (res.err or res.out).strip().splitlines()[-1:] or [f"exit {res.rc}"]
        return f"mokutil --import {LAB_CERT} failed: {tail[0]}"
    return (
        f"queued the lab's key {LAB_CERT} for enrolment: confirm it in MokManager at the next "
        "boot ('Enroll MOK', the lab's one-time password)"
    )
