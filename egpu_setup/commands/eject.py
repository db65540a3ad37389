"""`egpu-setup eject`: detach the eGPU safely, or say exactly why it is not safe."""

from __future__ import annotations

import sys

import click

from egpu_setup.commands._options import from_option, root_option, yes_option
from egpu_setup.errors import UsageError
from egpu_setup.text import plain


@click.command(
    epilog="""\b
Examples:
  sudo egpu-setup eject              # shows what it will do, asks first
  sudo egpu-setup eject --yes        # no question (scripts, the egpu-eject helper)
  egpu-setup eject --from ./bundle   # what eject would do on a recorded host
"""
)
@yes_option("Do it without asking.", "assume_yes")
@root_option("Act on a system image under DIR (sysfs writes land inside DIR).", "root", exists=True)
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
        click.echo(f"note: {plain(note)}", err=True)
    if host.kind == "recorded":
        click.echo(f"eject plan for {gpu} on a recorded host (nothing done):")
        for b in plan.blockers:
            click.echo(f"  blocked: {plain(b)}")
        for s in plan.steps:
            click.echo(f"  {plain(s.description)}")
        return
    if not plan.blockers and not assume_yes:
        click.echo(f"eject {gpu}:", err=True)
        for s in plan.steps:
            click.echo(f"  {plain(s.description)}", err=True)
        if not sys.stdin.isatty():
            raise UsageError(
                "eject changes the running system and needs confirmation", "re-run with --yes"
            )
        click.confirm("go ahead?", abort=True, err=True)
    run_eject(host, plan, say=lambda line: click.echo(plain(line), err=True))
    click.echo(f"now safe to unplug {gpu}")
