"""`egpu-setup record DIR`: write a diagnostics bundle that `--from DIR` replays."""

from __future__ import annotations

from pathlib import Path

from egpu_setup.commands import _cli as cli


@cli.command(
    epilog="""\b
Examples:
  sudo egpu-setup record ./egpu-report      # root sees dmesg and lspci capabilities
  egpu-setup detect --from ./egpu-report    # what egpu-setup concludes from it
  egpu-setup record ./r --venv /opt/egpu-setup/venv   # add that venv's torch build
  tar czf egpu-report.tgz egpu-report       # attach to a bug report
"""
)
@cli.argument("directory", type=cli.Path(path_type=Path))
@cli.option("--no-redact", is_flag=True, help="Keep unique ids, UUIDs and serial numbers.")
@cli.option(
    "--venv",
    type=cli.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also record the torch build of this venv (commands/torch.json; runs its Python).",
)
def command(directory: Path, no_redact: bool, venv: Path | None) -> None:
    """Record this machine's GPU-related state into DIRECTORY (redacted by default)."""
    from egpu_setup.doctor.record import record
    from egpu_setup.host.machine import LiveHost

    out = record(LiveHost(), directory, redact=not no_redact, venv=venv)
    cli.echo(str(out))
