"""The configuration planner: rendered files, unit links, managed links, and the commands they owe.

A command whose trigger file an earlier run wrote but which never succeeded is owed
(`Manifest.pending_commands`) and planned again even though its files no longer differ.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from egpu_setup.detect.facts import HostFacts
from egpu_setup.host.machine import Host
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import CreateLink, EnableUnit, RunCommand, Step, WriteFile
from egpu_setup.plan.triggers import owes_rebuild
from egpu_setup.render.files import HostCommand, RenderedFile, RenderedLink
from egpu_setup.state.manifest import Manifest

_OUR_MARK = "egpu-setup"  # rendered files carry a header naming us (docs/design.md, "The pipeline")


def unified_diff(path: str, old: str | None, new: str) -> str:
    a = (old or "").splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    lines = difflib.unified_diff(a, b, f"a{path}" if old is not None else "/dev/null", f"b{path}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _file_part(path: str) -> str:
    return "driver" if path.startswith("/etc/modprobe.d/") else "config"


def _not_a_link(host: Host, path: str) -> bool:
    """A regular file (or directory) where we would put a symlink: it is somebody's."""
    return host.readlink(path) is None and (host.exists(path) or host.is_dir(path))


def link_steps(links: Iterable[RenderedLink], host: Host, options: PlanOptions) -> list[Step]:
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
    rendered: Iterable[RenderedFile],
    host: Host,
    options: PlanOptions,
    manifest: Manifest | None,
    commands: Sequence[HostCommand],
    facts: HostFacts,
) -> tuple[list[Step], list[Step], list[Step]]:
    """(file writes, unit links, the commands they owe) for the parts asked for."""
    files: list[Step] = []
    units: list[Step] = []
    for rf in rendered:
        part = _file_part(rf.path)
        if part not in options.only:
            continue
        write = _write_step(rf, part, host, options, manifest)
        if write is not None:
            files.append(write)
        unit = _unit_step(rf, host, options)
        if unit is not None:
            units.append(unit)
    changed = {s.path for s in files if isinstance(s, WriteFile)}
    cmds = _command_steps(commands, changed, bool(units), host, options, manifest, facts)
    return files, units, cmds


def _write_step(
    rf: RenderedFile, part: str, host: Host, options: PlanOptions, manifest: Manifest | None
) -> WriteFile | None:
    """The write that makes the file what was rendered, or None when it already is."""
    current = host.read_bytes(rf.path)
    if current == rf.content.encode() and _mode_of(host, rf.path) in (None, rf.mode):
        return None
    ours = manifest is not None and manifest.is_ours(rf.path, current)
    known = manifest is not None and rf.path in manifest.files
    # not ours: edited after our last write, or somebody else's file without our header
    foreign = (current is not None and not ours and (known or _OUR_MARK not in _head(current))) or (
        known and host.readlink(rf.path) is not None
    )  # our file swapped for a link
    old_text = current.decode("utf-8", errors="replace") if current is not None else None
    return WriteFile(
        path=rf.path,
        content=rf.content,
        mode=rf.mode,
        purpose=rf.purpose,
        action="create" if current is None else "replace",
        diff=unified_diff(rf.path, old_text, rf.content),
        conflict=foreign and not options.force,
        for_part=part,
    )


def _unit_step(rf: RenderedFile, host: Host, options: PlanOptions) -> EnableUnit | None:
    """`systemctl enable` of a rendered unit, as the wants/ links its [Install] section names."""
    if not rf.path.startswith("/etc/systemd/system/") or not rf.path.endswith(
        (".service", ".timer", ".path")
    ):
        return None
    unit = rf.path.rsplit("/", 1)[1]
    links = tuple(
        f"/etc/systemd/system/{target}.wants/{unit}"
        for target in _wanted_by(rf.content)
        if host.readlink(f"/etc/systemd/system/{target}.wants/{unit}") != rf.path
    )
    if not links:
        return None
    blocked = any(_not_a_link(host, link) for link in links) and not options.force
    return EnableUnit(unit, rf.path, links, conflict=blocked)


def _command_steps(
    commands: Sequence[HostCommand],
    changed: set[str],
    units_change: bool,
    host: Host,
    options: PlanOptions,
    manifest: Manifest | None,
    facts: HostFacts,
) -> list[Step]:
    """The commands due: those whose trigger files change, and those an earlier run still owes."""
    live = options.target == "live"
    # argv tuples an earlier run wrote a trigger for but never finished (Manifest.pending)
    owed = set(manifest.pending_commands()) if manifest is not None else set()
    cmds: list[Step] = []
    for cmd in commands:
        argv = tuple(cmd.argv)
        if argv[:2] == ("systemctl", "enable"):
            continue  # done as EnableUnit links: works in a chroot and rolls back exactly
        after = cmd.after
        reload_for_links = argv[:2] == ("systemctl", "daemon-reload") and units_change
        is_owed = owes_rebuild(argv, owed)
        if after and not changed & set(after) and not reload_for_links and not is_owed:
            continue
        reloads = argv[0] in ("udevadm", "systemctl", "boltctl")
        part = "driver" if any(a.startswith("/etc/modprobe.d/") for a in after) else "config"
        if part not in options.only:
            continue
        if reloads and not live:
            continue  # nothing runs in an image: the services read the files at boot
        cmds.append(
            RunCommand(
                argv,
                cmd.purpose,
                live_only=reloads,
                for_part=part,
                triggers=after,
                owed=is_owed and not changed & set(after),
                consent=cmd.consent,
            )
        )
    return cmds


def _head(data: bytes) -> str:
    return data[:2048].decode("utf-8", errors="replace")


def _mode_of(host: Host, path: str) -> int | None:
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
