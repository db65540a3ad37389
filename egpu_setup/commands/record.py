"""`egpu-setup record DIR`: write a diagnostics bundle that `--from DIR` replays."""

from __future__ import annotations

from pathlib import Path

import click

from egpu_setup.commands._options import NonEmptyPath, venv_option


@click.command(
    epilog="""\b
Examples:
  sudo egpu-setup record ./egpu-report      # root sees dmesg and lspci capabilities
  egpu-setup detect --from ./egpu-report    # what egpu-setup concludes from it
  egpu-setup record ./r --venv /opt/egpu-setup/venv   # add that venv's torch build
  tar czf egpu-report.tgz egpu-report       # attach to a bug report
"""
)
@click.argument("directory", type=NonEmptyPath(path_type=Path))
@click.option("--no-redact", is_flag=True, help="Keep unique ids, UUIDs and serial numbers.")
@venv_option(
    "Also record the torch build of this venv (commands/torch.json; runs its Python).",
    path_type=Path,
    must_be_dir=True,
)
def command(directory: Path, no_redact: bool, venv: Path | None) -> None:
    """Record this machine's GPU-related state into DIRECTORY (redacted by default)."""
    from egpu_setup.doctor.record import record
    from egpu_setup.host.machine import LiveHost

    out = record(LiveHost(), directory, redact=not no_redact, venv=venv)
    click.echo(str(out))
