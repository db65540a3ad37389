"""The verify-after-reboot marker that arms egpu-setup-verify.service for the next boot."""

from __future__ import annotations

import json
import time

from egpu_setup.host.machine import Host
from egpu_setup.state.atomic import atomic_write, remove
from egpu_setup.state.paths import refuse_link

# Host path (under the target root), the ConditionPathExists= of egpu-setup-verify.service
# (templates/systemd/egpu-setup-verify.service.j2): fixed, the unit cannot follow an override.
VERIFY_MARKER = "/var/lib/egpu-setup/verify-after-reboot"
# A lab image's: egpu-setup-firstboot.service runs while it exists (install --root writes it as a
# managed file; `egpu-setup firstboot` removes it once a verify on the eGPU passed).
FIRSTBOOT_MARKER = "/var/lib/egpu-setup/firstboot-pending"


def write_verify_marker(host: Host, run_id: str, reason: str) -> None:
    """Arm egpu-setup-verify.service for the next boot (atomically, under the target root)."""
    data = {"run": run_id, "reason": reason, "time": round(time.time(), 3)}
    # location, not real_path: a link planted as the marker is replaced, never written through
    path = host.location(VERIFY_MARKER)
    refuse_link(path.parent)
    atomic_write(path, (json.dumps(data) + "\n").encode(), 0o644, anchor=host.root)


def remove_verify_marker(host: Host) -> bool:
    """Disarm it (rollback took the unit away); True when there was one (a link in its place
    goes too: what it points to is never touched)."""
    return remove(host.location(VERIFY_MARKER), anchor=host.root)


def remove_firstboot_marker(host: Host) -> bool:
    """First boot is done (a verify passed); True when there was a marker."""
    return remove(host.location(FIRSTBOOT_MARKER), anchor=host.root)
