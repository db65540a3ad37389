"""`egpu-setup rollback`: undo what the manifest says egpu-setup did, and only that."""

from __future__ import annotations

import sys

import click

from egpu_setup.commands._options import echo_json, json_option, root_option, yes_option

EPILOG = """\b
Examples:
  egpu-setup rollback                      # show what would be restored/removed
  sudo egpu-setup rollback --yes           # do it (files only; packages are listed)
  sudo egpu-setup rollback --yes --packages  # also purge the packages and venv it installed
  sudo egpu-setup rollback --root /srv/image --yes --json
"""


@click.command(epilog=EPILOG)
@yes_option("Do it; without --yes only show what would happen.")
@root_option("Roll back the system image at DIR.")
@json_option
@click.option(
    "--packages",
    is_flag=True,
    help="Also purge the apt packages (and the dependencies they brought) and venvs egpu-setup "
    "installed.",
)
@click.option(
    "--force", is_flag=True, help="Also restore files edited after egpu-setup wrote them."
)
def command(yes: bool, root_dir: str | None, as_json: bool, packages: bool, force: bool) -> None:
    """Restore every file egpu-setup replaced, byte for byte; remove the ones it created.

    Files edited by someone after egpu-setup wrote them are kept (with a warning) unless --force.
    Unit links are removed. apt packages are listed, purged only with --packages, with the
    dependencies apt brought for them (one that a package installed since needs stays; a
    package installed since that needs one of egpu-setup's own stops rollback before it
    changes anything). What the
    restored files feed is rebuilt: the initramfs (modprobe.d), the GRUB config (grub.d); a
    Thunderbolt device egpu-setup enrolled in bolt is forgotten again.
    """
    from egpu_setup.rollback.core import (
        RollbackOptions,
        apply_rollback,
        plan_rollback,
        preview,
        rollback_text,
    )

    options = RollbackOptions(yes=yes, root_dir=root_dir, packages=packages, force=force)
    plan = plan_rollback(options)
    outcome = apply_rollback(plan) if yes else preview(plan)
    if as_json:
        echo_json(outcome.to_json())
        error = outcome.error()
        if error is not None:
            raise error
        if outcome.failed:
            sys.exit(1)
        return
    click.echo(rollback_text(outcome))
    error = outcome.error()
    if error is not None:
        raise error  # after the table: which files were undone, and the one that was not
    if plan.empty:
        return
    if not outcome.applied:
        click.echo("Nothing changed; run with --yes to do this.", err=True)
    elif outcome.kept_edits or outcome.failed:
        sys.exit(1)  # the table says which file was kept, or which command failed
