"""The driver hold carried out: the driver packages dpkg's status names once the apt step is
done, pinned at their versions through the managed-file writer (so the manifest records both
files and rollback removes them)."""

from __future__ import annotations

from egpu_setup.detect.dpkg_status import driver_packages
from egpu_setup.execute.files import Context, write_managed
from egpu_setup.plan.installed import dpkg_entries
from egpu_setup.plan.steps import HoldDriver
from egpu_setup.render.hold import hold_files


def hold(ctx: Context, step: HoldDriver) -> tuple[str, str]:
    """Write the pin file and the unattended-upgrades drop-in for the driver as installed now
    (or, releasing, with nothing in them: still egpu-setup's files, so rollback removes them)."""
    if step.release:
        for path, content, _purpose in hold_files({}, step.profile, step.mode, release=True):
            write_managed(ctx, path, content.encode(), 0o644)
        return "done", "driver hold released" + ("" if step.for_good else " for the apt step")
    held = driver_packages(dpkg_entries(ctx.host), step.named)
    for path, content, _purpose in hold_files(held, step.profile, step.mode):
        write_managed(ctx, path, content.encode(), 0o644)
    versions = ", ".join(sorted(set(held.values())))
    return "done", f"driver held at {versions}: {', '.join(held)}"
