"""`egpu-setup eject`: detach the eGPU safely, or say exactly why it is not safe."""

from __future__ import annotations

import sys

from egpu_setup.commands import _cli as cli
from egpu_setup.commands._options import from_option
from egpu_setup.errors import UsageError
from egpu_setup.text import plain


@cli.command(
    epilog="""\b
Examples:
  sudo egpu-setup eject              # shows what it will do, asks first
  sudo egpu-setup eject --yes        # no question (scripts, the egpu-eject helper)
  egpu-setup eject --from ./bundle   # what eject would do on a recorded host
"""
)
@cli.option("--yes", "-y", "assume_yes", is_flag=True, help="Do it without asking.")
@cli.option(
    "--root",
    "root",
    type=cli.Path(file_okay=False, exists=True),
    default=None,
    help="Act on a system image under DIR (sysfs writes land inside DIR).",
)
@from_option
def command(assume_yes: bool, root: str | None, from_dir: str | None) -> None:
    """Stop GPU users, unload the driver, remove the PCI device and de-authorize the
    Thunderbolt enclosure (only one it can tie to the eGPU); refuses, naming them, while a
    display or a process uses the eGPU."""
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.execute.eject import plan_eject, run_eject
    from egpu_setup.host.machine import open_host

    if from_dir and root:
        raise UsageError("--from and --root cannot be combined", "pick one")
    host = open_host(from_dir, root)
    facts = detect_host(host)
    plan = plan_eject(host, facts)
    # every line names what the machine says (process names, the enclosure's firmware name)
    gpu = plain(f"{plan.gpu.name or 'eGPU'} ({plan.gpu.pci_address})")
    for note in plan.notes:
        cli.echo(f"note: {plain(note)}", err=True)
    if host.kind == "recorded":
        cli.echo(f"eject plan for {gpu} on a recorded host (nothing done):")
        for b in plan.blockers:
            cli.echo(f"  blocked: {plain(b)}")
        for s in plan.steps:
            cli.echo(f"  {plain(s.description)}")
        return
    if not plan.blockers and not assume_yes:
        cli.echo(f"eject {gpu}:", err=True)
        for s in plan.steps:
            cli.echo(f"  {plain(s.description)}", err=True)
        if not sys.stdin.isatty():
            raise UsageError(
                "eject changes the running system and needs confirmation", "re-run with --yes"
            )
        cli.confirm("go ahead?", abort=True, err=True)
    run_eject(host, plan, say=lambda line: cli.echo(plain(line), err=True))
    cli.echo(f"now safe to unplug {gpu}")
