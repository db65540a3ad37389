"""The driver's dpkg triggers run once: the initramfs built one time per install, with the files.

Installing the driver, apt runs dpkg several times and ends with `dpkg --configure --pending`
(apt.conf(5), DPkg::ConfigurePending). initramfs-tools is interested in the `update-initramfs`
trigger (deb-triggers(5)); kmod, udev, dmsetup and the driver's glx-alternative packages
activate it, and one activated again after dpkg processed it in the middle of that run builds
the initramfs again: three builds in one lab image's driver step (docs/testing.md, "Why the lab
image's initramfs is built more than once"), then a fourth for the nouveau blacklist.

So the driver's apt step passes dpkg `--no-triggers`, which dpkg(1) documents as: "Do not run
any triggers in this run, but activations will still be recorded. [...] Use of this option may
leave packages in the improper triggers-awaited and triggers-pending states. This can be fixed
later by running: dpkg --configure --pending." The plan runs exactly that once, after the
files (the modprobe.d drop-ins the initramfs copies), and the initramfs rebuild the blacklist
asks for becomes an activation of the same trigger (`dpkg-trigger --no-await`,
dpkg-trigger(1)), so that one run builds the initramfs once, with the drop-ins in it.

A run killed between the apt step and the trigger run leaves packages triggers-pending:
`dpkg_interrupted` (plan/installed.py) sees them and the next run starts with
`dpkg --configure -a`, which runs them. The rebuild stays owed (Manifest.pending_commands)
until the trigger run has succeeded, so a run killed after the activation and before the build
plans the rebuild again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from egpu_setup.host.machine import Host
from egpu_setup.plan.steps import AptInstall, RunCommand, Step

# dpkg(1), --no-triggers: "This can be fixed later by running: dpkg --configure --pending."
TRIGGER_RUN = ("dpkg", "--configure", "--pending")
# the initramfs rebuild as an activation: update-initramfs itself does this from a maintainer
# script ("deferring update (trigger activated)", /usr/sbin/update-initramfs in initramfs-tools)
INITRAMFS_REBUILD = ("update-initramfs", "-u")
INITRAMFS_TRIGGER = ("dpkg-trigger", "--no-await", "update-initramfs")


def defer_triggers(steps: Sequence[Step]) -> list[Step]:
    """The driver's apt steps with dpkg's triggers deferred to the plan's one trigger run."""
    return [
        dataclasses.replace(s, defer_triggers=True)
        if isinstance(s, AptInstall) and s.for_part == "driver"
        else s
        for s in steps
    ]


def defer_like(plan: Sequence[Step], steps: Sequence[Step]) -> list[Step]:
    """`steps`, to go between the driver's apt step and the trigger run (an image's
    python3-venv), with their apt steps deferring too when the driver's does: an apt-get
    between them would otherwise run the pending triggers, and build the initramfs, before the
    files are written."""
    if not any(isinstance(s, AptInstall) and s.defer_triggers for s in plan):
        return list(steps)
    return [dataclasses.replace(s, defer_triggers=True) if isinstance(s, AptInstall) else s
            for s in steps]  # fmt: skip


def owes_rebuild(argv: tuple[str, ...], owed: set[tuple[str, ...]]) -> bool:
    """Whether an earlier run owes the initramfs rebuild `argv`, in either of its forms."""
    forms = {argv}
    if argv == INITRAMFS_REBUILD:
        forms |= {INITRAMFS_TRIGGER, TRIGGER_RUN}
    return bool(forms & owed)


def run_triggers_once(host: Host, before: Sequence[Step], commands: Sequence[Step]) -> list[Step]:
    """`commands` (those the files owe) with, when an apt step in `before` deferred its
    triggers, the initramfs rebuild turned into an activation and the one trigger run last
    (owed, like the rebuild, until it has succeeded)."""
    if not any(isinstance(s, AptInstall) and s.defer_triggers for s in before):
        return list(commands)
    out: list[Step] = []
    owed: tuple[str, ...] = ()
    for c in commands:
        # without initramfs-tools there is no trigger to activate, and the rebuild is skipped
        if isinstance(c, RunCommand) and c.argv == INITRAMFS_REBUILD and host.which(c.argv[0]):
            owed = c.triggers
            c = dataclasses.replace(
                c,
                argv=INITRAMFS_TRIGGER,
                reason=c.reason + ", built by the trigger run below (once, not twice)",
                skip_if_missing=False,
            )
        out.append(c)
    out.append(
        RunCommand(
            TRIGGER_RUN,
            "the dpkg triggers the driver's apt step deferred, run once, after the files they read",
            skip_if_missing=False,
            for_part="driver",
            triggers=owed,
        )
    )
    return out
