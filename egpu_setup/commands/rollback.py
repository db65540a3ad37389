"""`egpu-setup rollback`: undo what the manifest says egpu-setup did, and only that."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from egpu_setup.commands._options import echo_json, json_option

log = logging.getLogger("egpu_setup.rollback")

EPILOG = """\b
Examples:
  egpu-setup rollback                      # show what would be restored/removed
  sudo egpu-setup rollback --yes           # do it (files only; packages are listed)
  sudo egpu-setup rollback --yes --packages  # also remove the packages and venv it installed
  sudo egpu-setup rollback --root /srv/image --yes --json
"""


@click.command(epilog=EPILOG)
@click.option("--yes", "-y", is_flag=True, help="Do it; without --yes only show what would happen.")
@click.option(
    "--root", "root_dir", default=None, metavar="DIR", help="Roll back the system image at DIR."
)
@json_option
@click.option(
    "--packages", is_flag=True, help="Also remove the apt packages and venvs egpu-setup installed."
)
@click.option(
    "--force", is_flag=True, help="Also restore files edited after egpu-setup wrote them."
)
def command(yes: bool, root_dir: str | None, as_json: bool, packages: bool, force: bool) -> None:
    """Restore every file egpu-setup replaced, byte for byte; remove the ones it created.

    Files edited by someone after egpu-setup wrote them are kept (with a warning) unless --force.
    Unit links are removed. apt packages are listed, removed only with --packages. What the
    restored files feed is rebuilt: the initramfs (modprobe.d), the GRUB config (grub.d); a
    Thunderbolt device egpu-setup enrolled in bolt is forgotten again.
    """
    import os

    from egpu_setup.errors import EgpuSetupError
    from egpu_setup.execute.undo import apply_undo, plan_undo
    from egpu_setup.host.machine import LiveHost, RootHost
    from egpu_setup.state.journal import Journal, new_run_id
    from egpu_setup.state.lock import RunLock
    from egpu_setup.state.paths import StatePaths

    host = RootHost(root_dir) if root_dir else LiveHost()
    paths, manifest = _load(StatePaths.for_root(host.root), host)
    undo = plan_undo(host, manifest)
    pkgs = [p["name"] for p in manifest.packages]
    venvs = [v["path"] for v in manifest.venvs]
    recorded = [c["undo"] for c in manifest.commands]
    done = []
    followups: list[dict[str, Any]] = []
    anything = bool(undo or recorded or (packages and (pkgs or venvs)))
    if yes and anything:
        # a user's own record (a venv in their home) needs no root; system files and apt do
        foreign_venv = packages and any(not _can_remove(host, v) for v in venvs)
        if (undo or recorded or (packages and pkgs) or foreign_venv) and os.geteuid() != 0:
            raise EgpuSetupError(
                "rollback changes system files and needs root", _sudo("rollback", root_dir)
            )
        with RunLock(paths.lock):
            journal = Journal(paths)
            run = new_run_id()
            journal.append({"event": "rollback-begin", "run": run, "paths": [u.path for u in undo]})
            try:
                done = apply_undo(host, manifest, undo, force=force)
            except PermissionError as exc:
                raise EgpuSetupError(
                    f"cannot restore {exc.filename}: permission denied",
                    _sudo("rollback", root_dir),
                ) from exc
            if packages:
                _remove_packages(host, manifest, pkgs, venvs)
            changed = [u.path for u in done if u.action in ("removed", "restored", "unlinked")]
            followups = _follow_up(host, manifest, changed)
            # What an interrupted install still owed was for files that are now gone or restored;
            # the follow-ups above are rollback's own.
            if manifest.pending:
                manifest.pending = []
                manifest.save()
            _disarm_verify(host, changed)
            journal.append({"event": "rollback-end", "run": run})
            if host.kind == "live" and changed:
                for argv in (["systemctl", "daemon-reload"], ["udevadm", "control", "--reload"]):
                    if host.which(argv[0]):
                        host.run(argv, timeout=60)
    else:
        would_change = [u.path for u in undo if u.action in ("removed", "restored", "unlinked")]
        followups = _commands_for(host, manifest, would_change)
    if as_json:
        echo_json(
            {
                "schema": "egpu-setup/rollback/1",
                "applied": yes,
                "files": [u.to_json() for u in (done if yes else undo)],
                "packages": pkgs,
                "venvs": venvs,
                "packages_removed": bool(yes and packages),
                "commands": followups,
            }
        )
        if yes and any(c["status"] == "failed" for c in followups):
            sys.exit(1)
        return
    if not undo and not pkgs and not venvs and not recorded:
        click.echo("Nothing to roll back: egpu-setup has no record of changes here.")
        return
    verb = "" if yes else "would be "
    for u in done if yes else undo:
        what = {"kept-edited": "kept (edited since egpu-setup wrote it)"}.get(
            u.action, verb + u.action
        )
        click.echo(f"{u.path}: {what}")
    if pkgs or venvs:
        state = "removed" if yes and packages else "kept (remove with --packages)"
        if pkgs:
            click.echo(f"apt packages installed by egpu-setup, {state}: {' '.join(pkgs)}")
        if venvs:
            click.echo(f"venvs created by egpu-setup, {state}: {' '.join(venvs)}")
    for c in followups:
        line = f"{' '.join(c['argv']) or 'by hand'}: {c['status'].replace('-', ' ')}"
        click.echo(f"{line} ({c['reason']})" + (f": {c['detail']}" if c["detail"] else ""))
    if not yes:
        click.echo("Nothing changed; run with --yes to do this.", err=True)
    elif any(u.action == "kept-edited" for u in done) or any(
        c["status"] == "failed" for c in followups
    ):
        sys.exit(1)


def _sudo(command: str, root_dir: str | None) -> str:
    import shlex

    return f"sudo egpu-setup {command}" + (f" --root {shlex.quote(root_dir)}" if root_dir else "")


def _can_remove(host: Any, venv: str) -> bool:
    import os

    from egpu_setup.state.paths import can

    return can(host.real_path(venv).parent, os.W_OK | os.X_OK)


def _load(paths: Any, host: Any) -> tuple[Any, Any]:
    """(state paths, manifest) to roll back; for a normal user, also say where root's record is.

    A normal user's rollback reads their own state (a venv they installed torch into). When that
    is empty and root's record exists, what is to roll back is root's: `error: … needs root to
    read` with the sudo hint, never an empty "nothing to roll back" (nor a traceback).
    """
    import os

    from egpu_setup.state.manifest import Manifest
    from egpu_setup.state.paths import StatePaths, can, denied

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


def _os_family(host: Any) -> str | None:
    """The distro family of the target (the renderer's table: render_context.distro_family)."""
    from egpu_setup.detect.facts import HostFacts, OsFacts
    from egpu_setup.detect.osrelease import parse_os_release
    from egpu_setup.render.context import distro_family

    text = host.read("/etc/os-release") or host.read("/usr/lib/os-release") or ""
    rel = parse_os_release(text)
    os_facts = OsFacts(id=rel.get("ID"), id_like=tuple(rel.get("ID_LIKE", "").split()))
    return distro_family(HostFacts(os=os_facts))


def _commands_for(host: Any, manifest: Any, changed: list[str]) -> list[dict[str, Any]]:
    """What must run after these files changed back, and the recorded undo commands.

    Each: {"argv": [...] ([] when no command is known), "reason", "status", "detail"}.
    """
    from egpu_setup.render.context import GRUB_DROPIN_DISTROS, INITRAMFS_COMMANDS

    out: list[dict[str, Any]] = []

    def add(argv: list[str], reason: str, detail: str = "") -> None:
        status = "would-run" if argv else "not-run"
        out.append({"argv": argv, "reason": reason, "status": status, "detail": detail})

    modprobe = any(p.startswith("/etc/modprobe.d/") for p in changed)
    grub = any(p.startswith("/etc/default/grub.d/") for p in changed)
    family = _os_family(host) if modprobe or grub else None
    if modprobe:
        argv = INITRAMFS_COMMANDS.get(family or "")
        add(
            list(argv or ()),
            "the initramfs still holds the modprobe.d files egpu-setup wrote",
            "" if argv else "unknown distribution: rebuild the initramfs with its own tool",
        )
    if grub:
        # only Debian's grub-mkconfig reads grub.d drop-ins (render_context.GRUB_DROPIN_DISTROS)
        known = family in GRUB_DROPIN_DISTROS
        add(
            ["update-grub"] if known else [],
            "the boot menu still has the kernel parameters egpu-setup added",
            "" if known else "regenerate the GRUB configuration with this distribution's tool",
        )
    for c in manifest.commands:
        add(list(c["undo"]), f"undo `{' '.join(c['argv'])}`")
    return out


def _follow_up(host: Any, manifest: Any, changed: list[str]) -> list[dict[str, Any]]:
    """Run what the restored files feed, on the target; say what to run where we cannot.

    Under --root a command runs through chroot only when the image has the tool; otherwise the
    line says what to run there. A failure does not undo the rollback: it is reported, exit 1.
    """
    from egpu_setup.errors import EgpuSetupError

    results = _commands_for(host, manifest, changed)
    for r in results:
        argv = r["argv"]
        if not argv:
            continue
        r["status"] = "done"
        inside = f" in {host.root}" if host.kind == "root" else ""
        if argv[0] == "boltctl" and host.kind != "live":
            r.update(status="not-run", detail="boltd's database is changed on the running system")
        elif host.which(argv[0]) is None:
            run_it = f"chroot {host.root} {' '.join(argv)}" if inside else " ".join(argv)
            r.update(
                status="not-run",
                detail=f"{argv[0]} is not installed{inside or ' here'}: run `{run_it}` once it is",
            )
        else:
            try:
                res = host.run(argv, timeout=1800)
            except EgpuSetupError as exc:
                r.update(status="failed", detail=exc.message)
                continue
            if res.rc != 0:
                tail = ((res.err or res.out).strip().splitlines() or [""])[-1]
                r.update(status="failed", detail=f"exit {res.rc}: {tail[:200]}")
            else:
                _forget_command(manifest, argv)
    for r in results:
        if r["status"] != "done":
            log.warning("%s: %s: %s", " ".join(r["argv"]) or r["reason"], r["status"], r["detail"])
    return results


def _forget_command(manifest: Any, argv: list[str]) -> None:
    before = len(manifest.commands)
    manifest.commands = [c for c in manifest.commands if c["undo"] != argv]
    if len(manifest.commands) != before:
        manifest.save()


def _disarm_verify(host: Any, changed: list[str]) -> None:
    """The verify-after-reboot marker goes with the unit that consumes it."""
    from egpu_setup.state.verify_marker import remove_verify_marker

    if any(p.endswith("/egpu-setup-verify.service") for p in changed) and remove_verify_marker(
        host
    ):
        log.warning("removed the verify-after-reboot marker with its unit")


def _remove_packages(host: Any, manifest: Any, pkgs: list[str], venvs: list[str]) -> None:
    import os

    from egpu_setup.execute.apt import APT_ENV
    from egpu_setup.execute.console import show_line
    from egpu_setup.execute.executor import SIMULATE_ENV
    from egpu_setup.execute.undo import remove_tree

    if pkgs:
        argv = ["apt-get", "-y", "-o", "DPkg::Lock::Timeout=600", "remove", *pkgs]
        if os.environ.get(SIMULATE_ENV) == "1":
            argv.insert(1, "-s")
        host.run_checked(argv, env=APT_ENV, on_line=show_line)
        if "-s" not in argv:
            manifest.packages = []
    for v in venvs:
        remove_tree(host, v)
    manifest.venvs = []
    manifest.save()
