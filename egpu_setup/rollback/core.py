"""Rollback's core: what the manifest says egpu-setup did, undone, and only that.

    plan    = plan_rollback(options)     # read-only: the files, packages, venvs, commands
    outcome = apply_rollback(plan)       # under the run lock; or preview(plan) without --yes

Files edited by someone after egpu-setup wrote them are kept (with a warning) unless forced. What
the restored files feed is rebuilt: the initramfs (modprobe.d), the GRUB config (grub.d); a
Thunderbolt device egpu-setup enrolled in bolt is forgotten again (the undo recorded with it).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from egpu_setup.errors import EgpuSetupError
from egpu_setup.execute.undo import Undo, apply_undo, clean_temp, plan_undo
from egpu_setup.host.machine import Host, LiveHost, RootHost
from egpu_setup.log import get_logger
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths, can, denied

log = get_logger("egpu_setup.rollback")

CHANGED = ("removed", "restored", "unlinked")


@dataclass(frozen=True)
class RollbackOptions:
    yes: bool = False  # do it; without, only say what would happen
    root_dir: str | None = None
    packages: bool = False  # also purge the apt packages and remove the venvs egpu-setup installed
    force: bool = False  # also restore files edited after egpu-setup wrote them


@dataclass(frozen=True)
class FollowUp:
    """A command rollback owes after the files changed back; argv () when none is known."""

    argv: tuple[str, ...]
    reason: str
    status: str  # would-run / done / not-run / failed
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "reason": self.reason,
            "status": self.status,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class RollbackPlan:
    """What the manifest holds when rollback starts. The manifest itself changes as rollback
    goes; the lists here stay what they were, so the text and JSON after --yes say what went."""

    options: RollbackOptions
    host: Host
    paths: StatePaths
    manifest: Manifest
    undo: tuple[Undo, ...]
    packages: tuple[str, ...] = ()  # the packages egpu-setup's runs named and installed
    pulled_in: tuple[str, ...] = ()  # the dependencies apt brought with them
    venvs: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, options: RollbackOptions, host: Host, paths: StatePaths, manifest: Manifest
    ) -> RollbackPlan:
        recorded = manifest.packages
        return cls(
            options,
            host,
            paths,
            manifest,
            tuple(plan_undo(host, manifest)),
            tuple(p["name"] for p in recorded if not p.get("pulled_in")),
            tuple(p["name"] for p in recorded if p.get("pulled_in")),
            tuple(v["path"] for v in manifest.venvs),
        )

    @property
    def recorded(self) -> tuple[list[str], ...]:
        """The undo commands recorded with commands a run ran (`boltctl forget UUID`)."""
        return tuple(c["undo"] for c in self.manifest.commands)

    @property
    def empty(self) -> bool:
        return not (self.undo or self.packages or self.pulled_in or self.venvs or self.recorded)


@dataclass(frozen=True)
class RollbackOutcome:
    plan: RollbackPlan
    applied: bool
    files: tuple[Undo, ...]  # what was done (applied) or would be done
    followups: tuple[FollowUp, ...]
    kept_packages: tuple[tuple[str, str], ...] = ()  # (name, why) that --packages left
    kept_venvs: tuple[tuple[str, str], ...] = ()  # (path, why)

    @property
    def failed(self) -> bool:
        """A follow-up or a file failed: reported, the rest is not undone; exit 1."""
        return self.applied and (
            any(f.status == "failed" for f in self.followups) or bool(self.failed_files)
        )

    @property
    def failed_files(self) -> tuple[Undo, ...]:
        """Files rollback could not undo (a backup missing or corrupt, a read-only or full
        disk) or refused to touch (not a path egpu-setup writes): kept for a later run."""
        return tuple(u for u in self.files if u.action in ("failed", "refused"))

    def error(self) -> EgpuSetupError | None:
        """The `error:`/`hint:` that ends a rollback that left files behind (exit 1)."""
        bad = self.failed_files if self.applied else ()
        if not bad:
            return None
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        first = bad[0]
        if first.action == "refused":
            hint = (
                f"the manifest {self.plan.paths.manifest} lists a path egpu-setup never writes "
                "(or one it cannot read safely): look at it; the other files were undone"
            )
        else:
            hint = (
                "the other files were undone; fix the cause (free space, a read-write "
                "filesystem, the backup) and run rollback again to finish"
            )
        return EgpuSetupError(f"rollback left {first.path}: {first.detail}{more}", hint)

    @property
    def kept_edits(self) -> bool:
        return self.applied and any(u.action == "kept-edited" for u in self.files)

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "schema": "egpu-setup/rollback/1",
            "applied": self.applied,
            "files": [u.to_json() for u in self.files],
            "packages": list(plan.packages),
            "packages_pulled_in": list(plan.pulled_in),
            "packages_kept": [{"name": n, "why": why} for n, why in self.kept_packages],
            "venvs_kept": [{"path": p, "why": why} for p, why in self.kept_venvs],
            "venvs": list(plan.venvs),
            "packages_removed": bool(self.applied and plan.options.packages),
            "commands": [f.to_json() for f in self.followups],
        }


def sudo_hint(root_dir: str | None) -> str:
    return "sudo egpu-setup rollback" + (f" --root {shlex.quote(root_dir)}" if root_dir else "")


# -- what to roll back -----------------------------------------------------------------------------


def plan_rollback(options: RollbackOptions) -> RollbackPlan:
    """Read-only: the state of the target, and what rollback would do to each managed path."""
    host: Host = RootHost(options.root_dir) if options.root_dir else LiveHost()
    paths, manifest = _load(StatePaths.for_root(host.root), host)
    return RollbackPlan.of(options, host, paths, manifest)


def _load(paths: StatePaths, host: Host) -> tuple[StatePaths, Manifest]:
    """(state paths, manifest) to roll back; for a normal user, also say where root's record is.

    A normal user's rollback reads their own state (a venv they installed torch into). When that
    is empty and root's record exists, what is to roll back is root's: `error: … needs root to
    read` with the sudo hint, never an empty "nothing to roll back" (nor a traceback).
    """
    manifest = Manifest.load(paths)  # raises StateAccessError (`error:`/`hint:`) when unreadable
    system = StatePaths.system(host.root)
    if paths != StatePaths.for_user() or not os.path.lexists(system.manifest):
        return paths, manifest  # root's own state, a --root image, or EGPU_SETUP_STATE_DIR
    if manifest.empty:
        if not can(system.manifest, os.R_OK):
            raise denied(system.manifest, "read")
        return system, Manifest.load(system)  # readable: shown; --yes still needs root
    log.warning(
        "this rolls back what you installed as %s (%s); root's changes are recorded in %s: "
        "roll those back with sudo egpu-setup rollback",
        os.environ.get("USER") or os.geteuid(),
        paths.state_dir,
        system.manifest,
    )
    return paths, manifest


def preview(plan: RollbackPlan) -> RollbackOutcome:
    """What --yes would do, and the commands that would follow; nothing changes."""
    would_change = [u.path for u in plan.undo if u.action in CHANGED]
    followups = follow_ups(plan.host, plan.manifest, would_change)
    return RollbackOutcome(plan, False, plan.undo, (*unit_stops(plan), *followups))


# -- the units it removes, stopped first -----------------------------------------------------------

UNIT_DIR = "/etc/systemd/system"


def removed_units(undo: Sequence[Undo]) -> list[str]:
    """The names of egpu-setup's own unit files this rollback deletes, timers first (a timer
    left running would start its service again after that was stopped)."""
    from pathlib import PurePosixPath

    names = [
        PurePosixPath(u.path).name
        for u in undo
        if u.action == "removed"
        and str(PurePosixPath(u.path).parent) == UNIT_DIR
        and u.path.endswith((".service", ".timer"))
    ]
    return sorted(names, key=lambda n: (not n.endswith(".timer"), n))


def unit_stops(plan: RollbackPlan) -> list[FollowUp]:
    """`systemctl stop` and `systemctl disable --no-reload` for the units this rollback removes,
    before their files go: removed files alone leave a started timer firing until the next boot.
    On the running system only, and only when systemd runs it (sd_booted(3): /run/systemd/system/
    exists); under --root only the files go."""
    units = removed_units(plan.undo)
    if plan.host.kind != "live" or not units:
        return []
    why = "stop egpu-setup's units before their files are removed"
    stop = ("systemctl", "stop", "--", *units)
    disable = ("systemctl", "disable", "--no-reload", "--", *units)
    if not plan.host.is_dir("/run/systemd/system") or plan.host.which("systemctl") is None:
        detail = "systemd does not run this system: no unit of it is started"
        return [FollowUp(argv, why, "not-run", detail) for argv in (stop, disable)]
    return [FollowUp(argv, why, "would-run") for argv in (stop, disable)]


def _stop_units(host: Host, todo: list[FollowUp]) -> list[FollowUp]:
    """Run unit_stops' commands; one that fails is said and the files still go (exit 1)."""
    done = []
    for f in todo:
        if f.status == "would-run":
            try:
                res = host.run(list(f.argv), timeout=120)
                ok, why = res.rc == 0, f"exit {res.rc}: {(res.err or res.out).strip()[-200:]}"
            except EgpuSetupError as exc:
                ok, why = False, exc.message
            f = dataclasses.replace(f, status="done" if ok else "failed", detail="" if ok else why)
            if not ok:
                log.warning("%s: %s", " ".join(f.argv), why)
        done.append(f)
    return done


# -- doing it --------------------------------------------------------------------------------------


def apply_rollback(plan: RollbackPlan) -> RollbackOutcome:
    """Restore and remove under the run lock, then run what the restored files feed."""
    from egpu_setup.state.journal import Journal, new_run_id
    from egpu_setup.state.lock import RunLock

    options, host, manifest = plan.options, plan.host, plan.manifest
    removable = plan.packages or plan.pulled_in or plan.venvs
    if not (plan.undo or plan.recorded or (options.packages and removable)):
        return RollbackOutcome(plan, True, (), ())  # nothing it may do: said, not done
    _require_root(plan)
    with RunLock(plan.paths.lock, plan.paths.anchor):
        if options.packages:
            from egpu_setup.rollback.purge import check_purge, finish_interrupted

            finish_interrupted(host)  # else apt sees no package a killed install left unpacked
            check_purge(host, plan.packages)  # before anything else changes: refused as a whole
        journal = Journal(plan.paths)
        run = new_run_id()
        journal.append(
            {"event": "rollback-begin", "run": run, "paths": [u.path for u in plan.undo]}
        )
        clean_temp(host, manifest)  # what a killed install or rollback left next to its targets
        stops = _stop_units(host, unit_stops(plan))
        try:
            done = apply_undo(host, manifest, list(plan.undo), force=options.force)
        except PermissionError as exc:
            raise EgpuSetupError(
                f"cannot restore {exc.filename}: permission denied", sudo_hint(options.root_dir)
            ) from exc
        changed = [u.path for u in done if u.action in CHANGED]
        followups = _run_follow_ups(host, manifest, follow_ups(host, manifest, changed))
        # What an interrupted install still owed was for files that are now gone or restored;
        # the follow-ups above are rollback's own.
        if manifest.pending:
            manifest.pending = []
            manifest.save()
        _disarm_verify(host, changed)
        if host.kind == "live" and changed:
            for argv in (["systemctl", "daemon-reload"], ["udevadm", "control", "--reload"]):
                if host.which(argv[0]):
                    host.run(argv, timeout=60)
        # last: what the files owed is done even if apt fails, and a venv removed here may
        # hold the modules this run would still import
        kept: tuple[Kept, Kept] = ((), ())
        if options.packages:
            kept = _remove_packages(host, manifest, plan.venvs)
        journal.append({"event": "rollback-end", "run": run})
    return RollbackOutcome(plan, True, tuple(done), (*stops, *followups), *kept)


def _require_root(plan: RollbackPlan) -> None:
    """A user's own record (a venv in their home) needs no root; system files and apt do."""
    options = plan.options
    foreign_venv = options.packages and any(not _can_remove(plan.host, v) for v in plan.venvs)
    needs_root = (
        plan.undo or plan.recorded or (options.packages and (plan.packages or plan.pulled_in))
    )
    if (needs_root or foreign_venv) and os.geteuid() != 0:
        raise EgpuSetupError(
            "rollback changes system files and needs root", sudo_hint(options.root_dir)
        )


def _can_remove(host: Host, venv: str) -> bool:
    return can(host.real_path(venv).parent, os.W_OK | os.X_OK)


def _os_family(host: Host) -> str | None:
    """The distro family of the target (the renderer's table: render.context.distro_family)."""
    from egpu_setup.detect.facts import HostFacts, OsFacts
    from egpu_setup.detect.osrelease import parse_os_release
    from egpu_setup.render.context import distro_family

    text = host.read("/etc/os-release") or host.read("/usr/lib/os-release") or ""
    rel = parse_os_release(text)
    os_facts = OsFacts(id=rel.get("ID"), id_like=tuple(rel.get("ID_LIKE", "").split()))
    return distro_family(HostFacts(os=os_facts))


def follow_ups(host: Host, manifest: Manifest, changed: Sequence[str]) -> list[FollowUp]:
    """What must run after these files changed back, and the recorded undo commands."""
    from egpu_setup.render.context import GRUB_DROPIN_DISTROS, INITRAMFS_COMMANDS

    out: list[FollowUp] = []

    def add(argv: Sequence[str], reason: str, detail: str = "") -> None:
        out.append(FollowUp(tuple(argv), reason, "would-run" if argv else "not-run", detail))

    modprobe = any(p.startswith("/etc/modprobe.d/") for p in changed)
    grub = any(p.startswith("/etc/default/grub.d/") for p in changed)
    family = _os_family(host) if modprobe or grub else None
    if modprobe:
        argv = INITRAMFS_COMMANDS.get(family or "")
        add(
            argv or (),
            "the initramfs still holds the modprobe.d files egpu-setup wrote",
            "" if argv else "unknown distribution: rebuild the initramfs with its own tool",
        )
    if grub:
        # only Debian's grub-mkconfig reads grub.d drop-ins (render.context.GRUB_DROPIN_DISTROS)
        known = family in GRUB_DROPIN_DISTROS
        add(
            ["update-grub"] if known else [],
            "the boot menu still has the kernel parameters egpu-setup added",
            "" if known else "regenerate the GRUB configuration with this distribution's tool",
        )
    from egpu_setup.execute.executor import undo_argv

    for c in manifest.commands:
        if undo_argv(c["argv"]) != c["undo"]:
            # only the undo egpu-setup derives from what it ran (`boltctl forget UUID`) is run
            # as root: a manifest naming another command is not obeyed
            out.append(
                FollowUp(
                    tuple(c["undo"]),
                    f"recorded as the undo of `{' '.join(c['argv'])}`",
                    "failed",
                    "not the undo egpu-setup derives from that command: not run",
                )
            )
            continue
        add(c["undo"], f"undo `{' '.join(c['argv'])}`")
    return out


def _run_follow_ups(host: Host, manifest: Manifest, todo: list[FollowUp]) -> list[FollowUp]:
    """Run what the restored files feed, on the target; say what to run where we cannot.

    Under --root a command runs through chroot only when the image has the tool; otherwise the
    line says what to run there. A failure does not undo the rollback: it is reported, exit 1.
    """
    results = [_run_one(host, manifest, f) if f.argv and f.status != "failed" else f for f in todo]
    for r in results:
        if r.status != "done":
            log.warning("%s: %s: %s", " ".join(r.argv) or r.reason, r.status, r.detail)
    return results


def _run_one(host: Host, manifest: Manifest, f: FollowUp) -> FollowUp:
    argv = list(f.argv)
    inside = f" in {host.root}" if host.kind == "root" else ""
    if argv[0] == "boltctl" and host.kind != "live":
        return dataclasses.replace(
            f, status="not-run", detail="boltd's database is changed on the running system"
        )
    if argv[:2] == ["gpasswd", "-d"] and not _still_member(host, argv[2], argv[3]):
        # the run that recorded it was killed before gpasswd -a, or someone took the user out
        # since: the membership install added is not there, so nothing is left to take back
        _forget_command(manifest, argv)
        return dataclasses.replace(
            f, status="done", detail=f"{argv[2]} is not in {argv[3]} (any more): nothing to undo"
        )
    if host.which(argv[0]) is None:
        run_it = f"chroot {host.root} {' '.join(argv)}" if inside else " ".join(argv)
        return dataclasses.replace(
            f,
            status="not-run",
            detail=f"{argv[0]} is not installed{inside or ' here'}: run `{run_it}` once it is",
        )
    try:
        res = host.run(argv, timeout=1800)
    except EgpuSetupError as exc:
        return dataclasses.replace(f, status="failed", detail=exc.message)
    if res.rc != 0:
        tail = ((res.err or res.out).strip().splitlines() or [""])[-1]
        return dataclasses.replace(f, status="failed", detail=f"exit {res.rc}: {tail[:200]}")
    _forget_command(manifest, argv)
    return dataclasses.replace(f, status="done")


def _still_member(host: Host, user: str, group: str) -> bool:
    from egpu_setup.plan.amd import group_members

    return user in group_members(host.read("/etc/group")).get(group, set())


def _forget_command(manifest: Manifest, argv: list[str]) -> None:
    if manifest.forget_command(argv):
        manifest.save()


def _disarm_verify(host: Host, changed: Sequence[str]) -> None:
    """The verify-after-reboot marker goes with the unit that consumes it."""
    from egpu_setup.state.verify_marker import remove_verify_marker

    unit_gone = any(p.endswith("/egpu-setup-verify.service") for p in changed)
    if unit_gone and remove_verify_marker(host):
        log.warning("removed the verify-after-reboot marker with its unit")


Kept = tuple[tuple[str, str], ...]  # (package or venv, why)


def _remove_packages(host: Host, manifest: Manifest, venvs: Sequence[str]) -> tuple[Kept, Kept]:
    """Purge the recorded packages (rollback/purge.py), remove the venvs; what stays is
    kept in the manifest for a later rollback, and returned with the reason: (packages, venvs)."""
    from egpu_setup.execute.apt import DPKG_WRITES
    from egpu_setup.execute.files import make_durable
    from egpu_setup.execute.undo import remove_empty_dirs, remove_tree
    from egpu_setup.rollback.purge import purge

    kept: Kept = ()
    if manifest.packages:
        named = [p["name"] for p in manifest.packages if not p.get("pulled_in")]
        deps = [p["name"] for p in manifest.packages if p.get("pulled_in")]
        # apt-get purge drops a package's auto-installed mark before dpkg starts: a purge killed
        # then leaves the dependency installed and looking installed by hand, which must not
        # make the next rollback keep it (a mark the admin set since stays a reason to keep)
        purging = {p["name"] for p in manifest.packages if p.get("purging")}
        for p in manifest.packages:
            if p.get("pulled_in"):
                p["purging"] = True
        manifest.save()
        done = purge(host, named, deps, purging)
        # dpkg fsyncs its status, not the removal of the files: on disk before the manifest
        # forgets the packages
        make_durable(host, DPKG_WRITES)
        log.info("purged %d packages egpu-setup installed", len(done.purged))
        kept = done.kept
        stay = {name for name, _why in kept}
        manifest.packages = [p for p in manifest.packages if p["name"] in stay]
        for p in manifest.packages:  # this purge ended: what it kept, it kept for its reason
            p.pop("purging", None)
    created: list[str] = []
    running = _running_venv(host)
    kept_venvs: Kept = ()
    for v in venvs:
        if running is not None and os.path.realpath(v) == running:
            why = f"the egpu-setup running this rollback lives in it: rm -rf {v} afterwards"
            kept_venvs += ((v, why),)
            continue
        if remove_tree(host, v):
            entry = next((e for e in manifest.venvs if e["path"] == v), {})
            created += entry.get("created_dirs") or []
    remove_empty_dirs(host, created)  # after every venv: two may share a parent
    manifest.venvs = [e for e in manifest.venvs if e["path"] in dict(kept_venvs)]
    manifest.save()
    for name, why in kept + kept_venvs:
        log.warning("kept %s: %s", name, why)
    return kept, kept_venvs


def _running_venv(host: Host) -> str | None:
    """The venv of the egpu-setup running now, on the machine it is rolling back."""
    import sys

    return os.path.realpath(sys.prefix) if host.kind == "live" else None


# -- in words --------------------------------------------------------------------------------------


def rollback_text(outcome: RollbackOutcome) -> str:
    """One line per path, the packages and venvs, the follow-up commands."""
    plan = outcome.plan
    if plan.empty:
        return "Nothing to roll back: egpu-setup has no record of changes here."
    verb = "" if outcome.applied else "would be "
    lines = []
    for u in outcome.files:
        what = {"kept-edited": "kept (edited since egpu-setup wrote it)"}.get(
            u.action, verb + u.action
        )
        if u.action in ("failed", "refused"):
            what = f"{u.action}: {u.detail}"
        lines.append(f"{u.path}: {what}")
    if plan.options.packages:
        purged, removed = verb + "purged", verb + "removed"
        but = " but for those kept below" if outcome.kept_packages else ""
    else:
        purged = removed = "kept (rollback --packages takes them)"
        but = ""
    if plan.packages:
        lines.append(f"apt packages installed by egpu-setup, {purged}: {' '.join(plan.packages)}")
    if plan.pulled_in:
        lines.append(f"the {len(plan.pulled_in)} packages apt brought with them, {purged}{but}")
    if plan.venvs:
        lines.append(f"venvs created by egpu-setup, {removed}: {' '.join(plan.venvs)}")
    for name, why in outcome.kept_packages + outcome.kept_venvs:
        lines.append(f"kept {name}: {why}")
    for f in outcome.followups:
        line = f"{' '.join(f.argv) or 'by hand'}: {f.status.replace('-', ' ')}"
        lines.append(f"{line} ({f.reason})" + (f": {f.detail}" if f.detail else ""))
    return "\n".join(lines)
