"""`egpu-setup kernels check`: every installed kernel has an NVIDIA module it can load."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from egpu_setup.commands._options import echo_json, json_option, root_option
from egpu_setup.errors import EXIT_FAILED
from egpu_setup.text import plain


@click.group(
    "kernels",
    epilog="""\b
Examples:
  sudo egpu-setup kernels check              # build what DKMS can, report the rest
  egpu-setup kernels check --no-rebuild      # only look
  sudo egpu-setup kernels check --root /mnt/image --json
""",
)
def command() -> None:
    """The NVIDIA module for every installed kernel (run by the apt hook and at boot)."""


@command.command(
    "check",
    epilog="""\b
Examples:
  sudo egpu-setup kernels check
  egpu-setup kernels check --no-rebuild --json | jq '.kernels[] | select(.state != "ok")'
""",
)
@json_option
@root_option("Check the kernels of the system image under DIR.", "root", exists=True)
@click.option(
    "--rebuild/--no-rebuild",
    default=True,
    show_default=True,
    help="Run `dkms autoinstall -k KVER` for each kernel with headers that lacks the module.",
)
def check(as_json: bool, root: str | None, rebuild: bool) -> None:
    """Check that the NVIDIA module exists for the running and every installed kernel; build
    what DKMS can, and record `nvidia-module-missing-for-kernel` for the rest (doctor shows it).

    Exits 0 when every kernel has its module, 1 otherwise.
    """
    from egpu_setup.execute.kernels import check_kernels, save_check
    from egpu_setup.host.machine import open_host
    from egpu_setup.state.paths import StatePaths

    host = open_host(None, root)
    result = check_kernels(host, rebuild=rebuild)
    if rebuild:
        # only a run that may change the machine keeps its result (--no-rebuild only looks)
        paths = StatePaths.for_root(Path(root or "/"))
        save_check(paths.state_dir, paths.anchor, result)
    if as_json:
        echo_json(result.to_json())
    else:
        for v in result.verdicts:
            mark = " (running)" if v.running else ""
            line = f"{plain(v.release)}{mark}: {v.state}"
            click.echo(line + (f"  fix: {plain(v.fix)}" if v.fix else ""))
        for release in result.built:
            click.echo(f"built the NVIDIA module for {plain(release)}")
        if not result.verdicts:
            click.echo("no NVIDIA driver installed: nothing to check")
    if any(v.state != "ok" for v in result.verdicts):
        sys.exit(EXIT_FAILED)
