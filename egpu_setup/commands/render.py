"""`egpu-setup render`: write the hot-plug configuration for a profile into a directory."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from egpu_setup.commands._options import (
    NonEmptyPath,
    echo_json,
    from_option,
    json_option,
    mode_option,
    profile_option,
)
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.render")


@click.command(
    epilog="""\b
Examples:
  egpu-setup render --profile rtx4090 --out ./egpu-config
  egpu-setup render --profile ./lab-5090.yaml --out /tmp/cfg --mode display
  egpu-setup render --profile rtx4090 --out ./cfg --from ./bug-report-bundle
  diff -r ./cfg/etc /etc                    # what install would change
"""
)
@profile_option("A shipped profile name or a path to a profile YAML file.", required=True)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=NonEmptyPath(file_okay=False, path_type=Path),
    help="Directory to write into; files land at their host paths below it.",
)
@mode_option(
    "compute: leave the display stack alone (default for lab laptops); "
    "display: the eGPU drives the desktop. Default: the profile's mode."
)
@click.option(
    "--pci-realloc",
    is_flag=True,
    help="Add the GRUB drop-in with pci=realloc (doctor's pci-bar-allocation-failed fix).",
)
@from_option
@json_option
def command(
    profile_name: str,
    out_dir: Path,
    mode: str | None,
    pci_realloc: bool,
    from_dir: str | None,
    as_json: bool,
) -> None:
    """Render udev rules, modprobe options, systemd units, helpers and (display mode) Xorg
    configuration for this machine into a directory. Nothing else is changed."""
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.host.machine import open_host
    from egpu_setup.profile.load import load_profile
    from egpu_setup.render.context import detected_cards, profile_card_mismatch
    from egpu_setup.render.files import entry_point_path, render_set, tool_path_exposed
    from egpu_setup.render.sleep import probe_sleep_units
    from egpu_setup.render.tree import open_out, write_links, write_tree

    profile = load_profile(profile_name)
    host = open_host(from_dir)
    facts = detect_host(host)
    bolt = None if host.kind == "recorded" else host.which("boltctl") is not None
    # egpu-eject execs the egpu-setup that rendered it, as install does.
    tool_path = entry_point_path(sys.argv[0])
    result = render_set(
        facts,
        profile,
        None,
        mode or profile.mode,
        bolt_available=bolt,
        bar_allocation_failed=pci_realloc,
        tool_path=tool_path,
        tool_exposed=tool_path_exposed(host, tool_path) if host.kind == "live" else None,
        sleep_units_dir=probe_sleep_units(host),
    )
    out = open_out(out_dir)
    written = write_tree(out, result.files)
    linked = write_links(out, result.links)
    mismatch = profile_card_mismatch(profile, detected_cards(facts))
    notes = [f"{mismatch}: the rules match the detected card only"] if mismatch else []
    notes += result.notes
    for note in notes:
        log.warning("note: %s", note)
    if as_json:
        echo_json(
            {
                "schema": "egpu-setup/render/1",
                "profile": profile.name,
                "mode": mode or profile.mode,
                "files": [
                    {"path": f.path, "written": str(p), "mode": oct(f.mode), "purpose": f.purpose}
                    for f, p in zip(result.files, written, strict=False)
                ],
                "links": [
                    {"path": ln.path, "target": ln.target, "written": str(p), "purpose": ln.purpose}
                    for ln, p in zip(result.links, linked, strict=True)
                ],
                "commands": [
                    {
                        "argv": list(c.argv),
                        "purpose": c.purpose,
                        "after": list(c.after),
                        "consent": c.consent,
                    }
                    for c in result.commands
                ],
                "notes": notes,
            }
        )
        return
    for f, p in zip(result.files, written, strict=False):
        click.echo(f"{p}  ({f.purpose})")
    for ln, p in zip(result.links, linked, strict=True):
        click.echo(f"{p} -> {ln.target}  ({ln.purpose})")
    click.echo("\nAn install runs afterwards:")
    for c in result.commands:
        click.echo(f"  {' '.join(c.argv)}    # {c.purpose}")
