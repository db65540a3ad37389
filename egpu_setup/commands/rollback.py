"""`egpu-setup rollback`: undo what the manifest says egpu-setup did, and only that."""

from __future__ import annotations

import sys
from typing import Any

import click

from egpu_setup.commands._options import echo_json, json_option

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
    Unit links are removed. apt packages are listed, removed only with --packages.
    """
    import os

    from egpu_setup.errors import EgpuSetupError
    from egpu_setup.execute_files import apply_undo, plan_undo
    from egpu_setup.host import LiveHost, RootHost
    from egpu_setup.state import Journal, Manifest, RunLock, StatePaths, new_run_id

    host = RootHost(root_dir) if root_dir else LiveHost()
    paths = StatePaths.for_root(host.root)
    manifest = Manifest.load(paths)
    undo = plan_undo(host, manifest)
    pkgs = [p["name"] for p in manifest.packages]
    venvs = [v["path"] for v in manifest.venvs]
    done = []
    if yes:
        if (undo or (packages and (pkgs or venvs))) and os.geteuid() != 0:
            raise EgpuSetupError("rollback changes system files and needs root", "run it with sudo")
        with RunLock(paths.lock):
            journal = Journal(paths)
            run = new_run_id()
            journal.append({"event": "rollback-begin", "run": run, "paths": [u.path for u in undo]})
            done = apply_undo(host, manifest, undo, force=force)
            if packages:
                _remove_packages(host, manifest, pkgs, venvs)
            journal.append({"event": "rollback-end", "run": run})
            if host.kind == "live" and any(u.action != "kept-edited" for u in done):
                for argv in (["systemctl", "daemon-reload"], ["udevadm", "control", "--reload"]):
                    if host.which(argv[0]):
                        host.run(argv, timeout=60)
    if as_json:
        echo_json(
            {
                "schema": "egpu-setup/rollback/1",
                "applied": yes,
                "files": [u.to_json() for u in (done if yes else undo)],
                "packages": pkgs,
                "venvs": venvs,
                "packages_removed": bool(yes and packages),
            }
        )
        return
    if not undo and not pkgs and not venvs:
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
    if not yes:
        click.echo("Nothing changed; run with --yes to do this.", err=True)
    elif any(u.action == "kept-edited" for u in done):
        sys.exit(1)


def _remove_packages(host: Any, manifest: Any, pkgs: list[str], venvs: list[str]) -> None:
    import os

    from egpu_setup.execute import SIMULATE_ENV
    from egpu_setup.execute_apt import APT_ENV, run_checked
    from egpu_setup.execute_files import remove_tree

    if pkgs:
        argv = ["apt-get", "-y", "-o", "DPkg::Lock::Timeout=600", "remove", *pkgs]
        if os.environ.get(SIMULATE_ENV) == "1":
            argv.insert(1, "-s")
        run_checked(host, argv, env=APT_ENV)
        if "-s" not in argv:
            manifest.packages = []
    for v in venvs:
        remove_tree(host, v)
    manifest.venvs = []
    manifest.save()
