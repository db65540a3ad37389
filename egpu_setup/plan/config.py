"""The configuration planner: rendered files, unit links, managed links, and the commands they owe.

A command whose trigger file an earlier run wrote but which never succeeded is owed
(`Manifest.pending_commands`) and planned again even though its files no longer differ.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import CreateLink, EnableUnit, RunCommand, Step, WriteFile

_OUR_MARK = "egpu-setup"  # rendered files carry a header naming us (DESIGN.md, "render")


def unified_diff(path: str, old: str | None, new: str) -> str:
    a = (old or "").splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    lines = difflib.unified_diff(a, b, f"a{path}" if old is not None else "/dev/null", f"b{path}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _file_part(path: str) -> str:
    return "driver" if path.startswith("/etc/modprobe.d/") else "config"


def _not_a_link(host: Any, path: str) -> bool:
    """A regular file (or directory) where we would put a symlink: it is somebody's."""
    return host.readlink(path) is None and (host.exists(path) or host.is_dir(path))


def link_steps(links: Iterable[Any], host: Any, options: PlanOptions) -> list[Step]:
    if "config" not in options.only:
        return []
    return [
        CreateLink(
            link.path,
            link.target,
            link.purpose,
            conflict=_not_a_link(host, link.path) and not options.force,
        )
        for link in links
        if host.readlink(link.path) != link.target
    ]


def config_steps(
    rendered: Iterable[Any],
    host: Any,
    options: PlanOptions,
    manifest: Any,
    commands: Sequence[Any],
    facts: Any,
) -> tuple[list[Step], list[Step], list[Step]]:
    files: list[Step] = []
    units: list[Step] = []
    cmds: list[Step] = []
    live = options.target == "live"
    changed: set[str] = set()
    for rf in rendered:
        part = _file_part(rf.path)
        if part not in options.only:
            continue
        current = host.read_bytes(rf.path)
        if current != rf.content.encode() or _mode_of(host, rf.path) not in (None, rf.mode):
            ours = manifest is not None and manifest.is_ours(rf.path, current)
            known = manifest is not None and rf.path in manifest.files
            # not ours: edited after our last write, or somebody else's file without our header
            foreign = (
                current is not None and not ours and (known or _OUR_MARK not in _head(current))
            ) or (known and host.readlink(rf.path) is not None)  # our file swapped for a link
            old_text = current.decode("utf-8", errors="replace") if current is not None else None
            files.append(
                WriteFile(
                    path=rf.path,
                    content=rf.content,
                    mode=rf.mode,
                    purpose=rf.purpose,
                    action="create" if current is None else "replace",
                    diff=unified_diff(rf.path, old_text, rf.content),
                    conflict=foreign and not options.force,
                    for_part=part,
                )
            )
            changed.add(rf.path)
        if rf.path.startswith("/etc/systemd/system/") and rf.path.endswith(
            (".service", ".timer", ".path")
        ):
            unit = rf.path.rsplit("/", 1)[1]
            links = tuple(
                f"/etc/systemd/system/{target}.wants/{unit}"
                for target in _wanted_by(rf.content)
                if host.readlink(f"/etc/systemd/system/{target}.wants/{unit}") != rf.path
            )
            if links:
                blocked = any(_not_a_link(host, link) for link in links) and not options.force
                units.append(EnableUnit(unit, rf.path, links, conflict=blocked))
    # argv tuples an earlier run wrote a trigger for but never finished (state.Manifest); the
    # getattr default keeps a manifest without that record working
    owed_fn = getattr(manifest, "pending_commands", None)
    owed = {tuple(a) for a in (owed_fn() if callable(owed_fn) else ())}
    for cmd in commands:
        argv = tuple(cmd.argv)
        if argv[:2] == ("systemctl", "enable"):
            continue  # done as EnableUnit links: works in a chroot and rolls back exactly
        after = tuple(getattr(cmd, "after", ()) or ())
        reload_for_links = argv[:2] == ("systemctl", "daemon-reload") and bool(units)
        is_owed = argv in owed
        if after and not changed & set(after) and not reload_for_links and not is_owed:
            continue
        reloads = argv[0] in ("udevadm", "systemctl", "boltctl")
        if argv[0] == "boltctl" and _bolt_already_stored(facts, argv):
            continue
        part = "driver" if any(a.startswith("/etc/modprobe.d/") for a in after) else "config"
        if part not in options.only:
            continue
        if reloads and not live:
            continue  # nothing runs in an image: the services read the files at boot
        consent = bool(getattr(cmd, "consent", False))
        cmds.append(
            RunCommand(
                argv,
                cmd.purpose,
                live_only=reloads,
                for_part=part,
                triggers=after,
                owed=is_owed and not changed & set(after),
                consent=consent,
            )
        )
    return files, units, cmds


def _bolt_already_stored(facts: Any, argv: tuple[str, ...]) -> bool:
    uid = argv[-1]
    devices = getattr(getattr(facts, "thunderbolt", None), "devices", ()) or ()
    return any(d.unique_id == uid and d.policy for d in devices)


def _head(data: bytes) -> str:
    return data[:2048].decode("utf-8", errors="replace")


def _mode_of(host: Any, path: str) -> int | None:
    try:
        return host.real_path(path).stat().st_mode & 0o7777
    except OSError:
        return None


def _wanted_by(unit_text: str) -> list[str]:
    out: list[str] = []
    section = None
    for line in unit_text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Install]" and line.startswith("WantedBy="):
            out += line.split("=", 1)[1].split()
    return out
