"""What an AMD GPU's plan holds besides the firmware package, its udev rule and the torch venv.

amdgpu is part of the kernel and binds the GPU by itself, so there is no driver branch, and
NVIDIA's hot-plug configuration (nouveau blacklist, module options, the units that load the
NVIDIA modules and start nvidia-persistenced, the kernels hook for the NVIDIA module) is not
planned; the AMD eGPU's own udev rule (runtime PM off) is render/amd.py's. What ROCm needs of
the machine is that the user who runs torch may open /dev/kfd and /dev/dri/renderD*, which
belong to the render group (video on older systems): ROCT-Thunk-Interface README (https://github.com/ROCm/ROCT-Thunk-Interface),
and the answers of https://github.com/ROCm/legacy-rocm-build/issues/2232 (both groups, then log
in again). rocminfo without them: "Unable to open /dev/kfd read-write: Permission denied"
(tests/data/real/rocminfo/).
"""

from __future__ import annotations

import re

from egpu_setup.host.machine import Host
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import RunCommand, Step
from egpu_setup.resolve.resolution import Resolution

GROUPS = ("render", "video")
# A login name as useradd(8) accepts it by default (NAME_REGEX of adduser.conf(5)).
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}\$?")


def is_amd_plan(resolution: Resolution) -> bool:
    return resolution.driver.action == "in-kernel"


def group_members(group_file: str | None) -> dict[str, set[str]]:
    """Pure: /etc/group as group -> its listed members (group(5): name:password:GID:members)."""
    out: dict[str, set[str]] = {}
    for line in (group_file or "").splitlines():
        fields = line.split(":")
        if len(fields) == 4:
            out[fields[0]] = {m for m in fields[3].split(",") if m}
    return out


def amd_steps(host: Host, options: PlanOptions, notes: list[str]) -> list[Step]:
    """The sudo user into render and video where they are not in them yet; what a person must
    know (appended to `notes`, the plan's warnings) otherwise."""
    user = options.sudo_user if options.sudo_uid not in (None, 0) else None
    notes.append(
        "amdgpu is part of the kernel and binds the GPU itself: no driver branch and none of "
        "NVIDIA's hot-plug files (modprobe, units); one udev rule keeps the eGPU's runtime PM off"
    )
    if user is None or not _USER.fullmatch(user):
        notes.append(
            "whoever runs torch needs the render and video groups (/dev/kfd is root:render): "
            "`usermod -aG render,video USER`, then log in again"
        )
        return []
    members = group_members(host.read("/etc/group"))
    absent = [g for g in GROUPS if g not in members]
    if absent:
        notes.append(
            f"no {' or '.join(absent)} group on this system: /dev/kfd's group is whatever udev "
            "gives it (`ls -l /dev/kfd`); add the user to that one"
        )
    need = [g for g in GROUPS if g in members and user not in members[g]]
    # One gpasswd per group (shadow-utils: it edits /etc/group and /etc/gshadow under their
    # locks), so the undo executor.undo_argv derives for each, `gpasswd -d USER GROUP`, takes
    # back exactly the membership this step added: a group the user was in already gets no step.
    return [
        RunCommand(
            ("gpasswd", "-a", user, group),
            f"ROCm: {user} may open /dev/kfd and the render nodes from the next login; rollback "
            f"takes {user} out of {group} again",
            skip_if_missing=False,
            for_part="driver",
        )
        for group in need
    ]
