"""What `install --root IMAGE` adds to the plan so that the image finishes the job by itself.

An image is built on one machine and booted, as copies, on many, with nobody at the keyboard.
Besides the driver, torch and configuration:

- egpu-setup itself in the image (image/tool.py), and Python with venv for it and for torch;
- the first-boot unit's marker /var/lib/egpu-setup/firstboot-pending (egpu-setup firstboot
  removes it once a verify on the eGPU passed), and a profile that is not shipped in the
  package, copied to /etc/egpu-setup/profiles/ so the unit finds it by name;
- Debian's own nvidia-persistenced.service masked: it fails at every boot without the GPU
  ("Failed to query NVIDIA devices"), and egpu-setup-persistenced.service, which Conflicts= with
  it, is started when the eGPU appears instead;
- the seal, last: /etc/machine-id "uninitialized" so every copy makes its own id at its first
  boot (machine-id(5); an empty file is not a first boot), and /var/lib/dbus/machine-id a link
  to it: dbus-daemon's postinst (`dbus-uuidgen --ensure`) leaves a random id there, which
  systemd would copy to every machine made from the image.

All of these are managed steps: `egpu-setup rollback --root IMAGE` takes them back exactly.
Reports of the build go to /var/lib/egpu-setup/build-reports/, not reports/, where a fleet
collects each machine's own (install/report.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from egpu_setup.detect.facts import HostFacts
from egpu_setup.host.machine import Host, LiveHost
from egpu_setup.image.tool import ToolChoice
from egpu_setup.plan.steps import AptInstall, CreateLink, Plan, Step, WriteFile
from egpu_setup.plan.triggers import defer_like
from egpu_setup.profile.types import Profile
from egpu_setup.render.context import FirstBoot
from egpu_setup.state.verify_marker import FIRSTBOOT_MARKER

MACHINE_ID = "/etc/machine-id"
DBUS_MACHINE_ID = "/var/lib/dbus/machine-id"
UNINITIALIZED = "uninitialized\n"
DEBIAN_PERSISTENCED = "/etc/systemd/system/nvidia-persistenced.service"
PROFILES_DIR = "/etc/egpu-setup/profiles"


def firstboot_for(profile: Profile, enclosure: str | None) -> FirstBoot:
    return FirstBoot(profile.name, (enclosure,) if enclosure else ())


def finish_plan(
    plan: Plan,
    tool: ToolChoice,
    target: Host,
    facts: HostFacts,
    profile: Profile,
    only: frozenset[str],
    lock_timeout: int,
) -> Plan:
    """The plan with egpu-setup's own venv (and Python for it) early, and an image's marker,
    profile, mask and seal last."""
    from egpu_setup.image.tool import venv_package_step

    early = list(tool.steps)
    warnings = [tool.note] if tool.note else []
    if target.kind != "root":
        return insert_early(append(plan, [], warnings), early)
    if "torch" in only and any(s.kind == "pip-install" for s in plan.steps):
        venv = venv_package_step(target, facts.os.id, lock_timeout)
        if venv is not None:
            early.insert(0, venv)  # torch's venv is made by the image's python3 too
    late, said = image_steps(target, facts, profile, only)
    return append(insert_early(plan, early), late, [*warnings, *said])


def insert_early(plan: Plan, steps: Sequence[Step]) -> Plan:
    """`steps` right after the driver's package steps, before files, commands and torch: the
    tool's venv and Python must exist before anything that uses them, and after the archive
    components the packages may come from."""
    if not steps:
        return plan
    todo = list(plan.steps)
    at = 0
    while at < len(todo) and todo[at].part_name == "driver" and todo[at].kind != "reboot-needed":
        at += 1
    have = {s.packages for s in todo if isinstance(s, AptInstall)}
    new: list[Step] = []
    for step in steps:  # python3-venv once, whether the tool or torch asked for it
        if isinstance(step, AptInstall):
            if step.packages in have:
                continue
            have.add(step.packages)
        new.append(step)
    new = defer_like(todo, new)  # before the plan's trigger run (plan/triggers.py)
    return Plan(tuple(todo[:at] + new + todo[at:]), plan.warnings, plan.notes)


def append(plan: Plan, steps: Sequence[Step], warnings: Sequence[str] = ()) -> Plan:
    return Plan((*plan.steps, *steps), (*plan.warnings, *warnings), plan.notes)


def image_steps(
    target: Host, facts: HostFacts, profile: Profile, only: frozenset[str]
) -> tuple[list[Step], list[str]]:
    """The marker, the profile copy, the mask and the seal (last), each only when it differs
    from what the image has; and warnings."""
    from egpu_setup.render.headers import add_header

    steps: list[Step] = []
    warnings: list[str] = []
    if "config" in only:
        marker = add_header(
            "# egpu-setup-firstboot.service runs while this file exists; `egpu-setup firstboot`\n"
            "# removes it once a verify on the eGPU passed.\n",
            profile.name,
            profile.mode,
        )
        steps += _write(target, FIRSTBOOT_MARKER, marker, 0o644, "arm the first-boot unit")
        steps += _profile_copies(target, profile)
        if profile.hotplug.persistenced:
            steps += _link(
                target,
                DEBIAN_PERSISTENCED,
                "/dev/null",
                "mask Debian's nvidia-persistenced.service, which fails at every boot without the "
                "GPU; egpu-setup-persistenced.service starts when the eGPU appears",
            )
    steps += _write(
        target,
        MACHINE_ID,
        UNINITIALIZED,
        0o444,
        "seal: every machine made from the image makes its own machine-id at its first boot",
    )
    steps += _link(
        target,
        DBUS_MACHINE_ID,
        MACHINE_ID,
        "seal: D-Bus reads the machine's own id (dbus-daemon's postinst left a fixed one)",
    )
    hostname = (target.read("/etc/hostname") or "").strip()
    if hostname and hostname == os.uname().nodename:
        warnings.append(
            f"the image's /etc/hostname is this build host's ({hostname}): every machine made "
            "from it gets that name; set the image's own (or let your provisioning set it)"
        )
    return steps, warnings


def _write(host: Host, path: str, content: str, mode: int, purpose: str) -> list[Step]:
    from egpu_setup.plan.config import unified_diff

    current = host.read_bytes(path)
    if current == content.encode():
        return []
    old = current.decode("utf-8", errors="replace") if current is not None else None
    return [
        WriteFile(
            path=path,
            content=content,
            mode=mode,
            purpose=purpose,
            action="create" if current is None else "replace",
            diff=unified_diff(path, old, content),
        )
    ]


def _link(target: Host, path: str, to: str, purpose: str) -> list[Step]:
    if target.readlink(path) == to:
        return []
    # the file in the way is kept in backups/ and comes back with rollback (execute/files.py)
    return [CreateLink(path, to, purpose)]


def _profile_copies(target: Host, profile: Profile) -> list[Step]:
    """The profile's own files (and those it extends) that the package does not ship, under
    /etc/egpu-setup/profiles/ in the image: the first-boot unit names the profile."""
    from egpu_setup.render.headers import add_header

    steps: list[Step] = []
    if profile.origin == "package":
        return steps
    build = LiveHost()
    for path in profile.chain or (profile.path,):
        name = path.rsplit("/", 1)[-1]
        if not name.endswith((".yaml", ".yml")) or _shipped(path):
            continue
        text = build.read(path)
        if text is None:
            continue
        stem = name.rsplit(".", 1)[0]
        body = add_header(text, profile.name, profile.mode)
        steps += _write(
            target, f"{PROFILES_DIR}/{stem}.yaml", body, 0o644, f"profile {stem} for the first boot"
        )
    return steps


def _shipped(path: str) -> bool:
    from importlib.resources import files

    package = str(files("egpu_setup.profile_files"))
    return path.startswith(package.rstrip("/") + "/")
