"""`egpu-setup firstboot`: what a lab image's first-boot unit runs (install/firstboot.py)."""

from __future__ import annotations

import sys

import click

from egpu_setup.commands._options import (
    echo_json,
    enclosure_option,
    json_option,
    profile_option,
    root_option,
    venv_option,
)
from egpu_setup.state.paths import TORCH_VENV

EPILOG = """\b
Examples:
  egpu-setup firstboot --profile lab --venv /opt/egpu-setup/venv     # as the unit runs it
  egpu-setup firstboot --profile lab --enclosure d6010000-0080-8e08-2362-a91cd1b06221
  systemctl status egpu-setup-firstboot.service; cat /var/lib/egpu-setup/firstboot.json
\b
Exit codes: 0 done, or nothing to do yet (no eGPU: it runs again at the next boot and plug-in);
1 verify failed on the eGPU; 2 bad input.
"""


@click.command(epilog=EPILOG)
@profile_option("Profile name or file.", "profile", required=True)
@venv_option("The torch venv verify runs.", default=TORCH_VENV)
@enclosure_option(
    "A Thunderbolt unique_id that may be enrolled (besides the profile's; repeatable).",
    "enclosures",
    multiple=True,
)
@click.option(
    "--wait",
    "wait_s",
    type=click.IntRange(1, 600),
    default=60,
    show_default=True,
    metavar="S",
    help="Seconds to wait for the GPU after enrolling, and for its driver.",
)
@root_option(
    "Act on a root-prefixed tree (sysfs writes land inside DIR; nothing is verified).", exists=True
)
@click.option("--no-verify", "no_verify", is_flag=True, help="Enrol and configure, no verify.")
@json_option
def command(
    profile: str,
    venv: str,
    enclosures: tuple[str, ...],
    wait_s: int,
    root_dir: str | None,
    no_verify: bool,
    as_json: bool,
) -> None:
    """First boot of a lab image: enrol the enclosure under the profile's policy, wait for the
    eGPU, configure for it, verify, and leave /var/lib/egpu-setup/firstboot.json.

    Enrols only a Thunderbolt device the profile pins (hotplug.enclosure_unique_id,
    hotplug.enclosure_unique_ids, or --enclosure), or where the profile opts in
    (hotplug.first_boot_enrol_model) the first device of that model. Without an eGPU it says so
    and exits 0; the marker /var/lib/egpu-setup/firstboot-pending stays until a verify passed.
    """
    from egpu_setup.install.firstboot import FirstbootOptions, run_firstboot

    options = FirstbootOptions(
        profile=profile,
        venv=venv,
        enclosures=enclosures,
        wait_s=wait_s,
        root_dir=root_dir,
        run_verify=not no_verify,
    )
    outcome = run_firstboot(options, say=lambda text: click.echo(text, err=True))
    if as_json:
        echo_json({"outcome": outcome.outcome, "message": outcome.message,
                   "report": outcome.report_path, "enrolled": outcome.enrolled})  # fmt: skip
    else:
        click.echo(f"{outcome.outcome}: {outcome.message}")
        if outcome.report_path:
            click.echo(f"report: {outcome.report_path}")
    if outcome.exit_code:
        sys.exit(outcome.exit_code)
