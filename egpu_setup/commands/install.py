"""`egpu-setup install`: flags -> InstallOptions -> prepare, then show or apply -> print -> exit.

The stages live in egpu_setup/install/pipeline.py; this module only speaks to the terminal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from egpu_setup.commands._options import (
    NonEmptyPath,
    cuda_option,
    driver_branch_option,
    echo_json,
    enclosure_option,
    from_option,
    index_url_option,
    json_option,
    matrix_option,
    mode_option,
    only_option,
    profile_option,
    rocm_option,
    root_option,
    torch_option,
    venv_option,
    yes_option,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from egpu_setup.detect.facts import TbDevice
    from egpu_setup.install.prepared import Prepared

EPILOG = """\b
Examples:
  egpu-setup install --profile rtx4090 --dry-run        # the plan, what a person must do
  egpu-setup install --profile rtx4090 --dry-run --diff # and every file's diff
  sudo egpu-setup install --profile rtx4090 --yes       # provision this laptop
  egpu-setup install --profile rtx4090 --only torch --cuda cpu --venv ~/torch-venv
  egpu-setup install --profile rx7900xtx --rocm rocm6.4 --dry-run  # an AMD GPU's variant
  sudo egpu-setup install --profile lab.yaml --root /srv/image --from host-bundle/ --yes
  sudo egpu-setup install --profile lab.yaml --root /srv/image --mok-key /root/lab-mok --yes
  egpu-setup install --profile rtx4090 --dry-run --json | jq '.steps[].description'
  sudo egpu-setup install --bundle /media/usb/lab-bundle --bundle-sha256 HEX --yes  # offline
  sudo egpu-setup install --profile rtx4090 --matrix updated --yes  # after `matrix update`
  sudo egpu-setup install --profile rtx4090 --hold-driver --yes  # the driver stays for the term
  sudo egpu-setup install --profile rtx4090 --yes --enclosure 00e8d1a4-3c2b-0e01-ffff-ffffffffffff
\b
Exit codes: 0 done, 1 a step failed, 2 bad input, 3 done but reboot (run again after),
4 a person must act, 5 another run or the package manager holds a lock.
"""


@click.command(epilog=EPILOG)
@profile_option("Profile name or path to a YAML file (default with --bundle: the bundle's).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show the resolution, what a person must do, every step and a summary; change nothing.",
)
@click.option("--diff", "show_diff", is_flag=True, help="Also show each file's unified diff.")
@yes_option("Do not ask for confirmation.")
@json_option
@only_option("driver,torch,config")
@venv_option("torch venv (default /opt/egpu-setup/venv).")
@torch_option("torch version, e.g. 2.9.1 or '>=2.8'.")
@cuda_option("torch variant: cu128, cu126, ... or cpu.")
@rocm_option("An AMD GPU's torch ROCm variant: rocm7.1, rocm7.2, ...")
@driver_branch_option("NVIDIA driver branch, e.g. 550.")
@mode_option("Override the profile's mode.")
@index_url_option("Lab mirror of the torch variant index (replaces it).")
@click.option(
    "--bundle",
    "bundle_dir",
    default=None,
    metavar="DIR",
    help="Install offline from a bundle written by `egpu-setup bundle`.",
)
@click.option(
    "--bundle-sha256",
    "bundle_sha256",
    default=None,
    metavar="HEX",
    envvar="EGPU_SETUP_BUNDLE_SHA256",
    show_envvar=True,
    help="The sha256 of the bundle's manifest.json that `egpu-setup bundle` printed: nothing "
    "in the bundle is trusted until it matches.",
)
@root_option("Install into the system image at DIR.")
@from_option
@click.option(
    "--force",
    is_flag=True,
    help="Replace files edited since egpu-setup wrote them (backed up); go ahead despite another "
    "GPU manager or a profile for another card.",
)
@click.option(
    "--lock-timeout",
    type=click.IntRange(0, 86400),
    default=600,
    show_default=True,
    help="Seconds to wait for the package manager's lock.",
)
@click.option(
    "--download-timeout",
    type=click.IntRange(10, 86400),
    default=3600,
    show_default=True,
    help="Seconds torch's download and install may take in all; a connection silent for 60 s "
    "(or this, when less) is given up on.",
)
@enclosure_option("The Thunderbolt enclosure to enrol (and pin) when the eGPU is not yet visible.")
@click.option(
    "--verify/--no-verify",
    "run_verify",
    default=True,
    help="Run `verify --quick` after installing torch.",
)
@click.option(
    "--mok-key",
    "mok_key",
    type=NonEmptyPath(file_okay=False, exists=True),
    default=None,
    metavar="DIR",
    help="With --root: sign the image's DKMS module with the lab's key in DIR (mok.key, mok.der, "
    "mok.hash; `egpu-setup mok-key new DIR`); first boot queues its enrolment.",
)
@click.option(
    "--hold-driver/--no-hold-driver",
    "hold_driver",
    default=None,
    help="Hold the NVIDIA driver packages at the installed versions for the term (apt pin and "
    "unattended-upgrades blacklist; rollback releases it). Default: the profile's driver.hold.",
)
@matrix_option
def command(
    profile_name: str | None,
    dry_run: bool,
    show_diff: bool,
    yes: bool,
    as_json: bool,
    only: str | None,
    venv: str | None,
    torch_spec: str | None,
    cuda: str | None,
    rocm: str | None,
    driver_branch: int | None,
    mode: str | None,
    index_url: str | None,
    bundle_dir: str | None,
    bundle_sha256: str | None,
    root_dir: str | None,
    from_dir: str | None,
    force: bool,
    lock_timeout: int,
    download_timeout: int,
    enclosure: str | None,
    run_verify: bool,
    mok_key: str | None,
    hold_driver: bool | None,
    matrix_choice: str,
) -> None:
    """Provision this machine: NVIDIA driver, torch venv, hot-plug configuration.

    Shows the plan first (asks unless --yes); a second run changes nothing.
    `egpu-setup rollback` undoes the files; see README "What egpu-setup changes".
    """
    from egpu_setup.install.options import InstallOptions
    from egpu_setup.install.pipeline import apply, prepare
    from egpu_setup.install.show import outcome_json, outcome_text, plan_json

    options = InstallOptions(
        profile=profile_name,
        dry_run=dry_run,
        yes=yes,
        as_json=as_json,
        only=only,
        venv=venv,
        torch_spec=torch_spec,
        cuda=cuda,
        rocm=rocm,
        driver_branch=driver_branch,
        mode=mode,
        index_url=index_url,
        bundle_dir=bundle_dir,
        bundle_sha256=bundle_sha256,
        root_dir=root_dir,
        from_dir=from_dir,
        force=force,
        lock_timeout=lock_timeout,
        download_timeout=download_timeout,
        run_verify=run_verify,
        matrix=matrix_choice,
        enclosure=enclosure,
        mok_key=mok_key,
        hold_driver=hold_driver,
    )
    prepared = prepare(options)
    if dry_run:
        if as_json:
            echo_json(plan_json(prepared))
        else:
            _show(prepared, show_diff)
        return
    from egpu_setup.install.enrol import enrol_stage

    ask = None if yes or not sys.stdin.isatty() else _ask_enclosure
    prepared = enrol_stage(prepared, ask=ask, say=_warn, replan=prepare)
    outcome = apply(prepared, warn=_warn, confirm=lambda run: _confirm(run, show_diff))
    if as_json:
        echo_json(outcome_json(outcome))
    else:
        click.echo(_fitted(outcome_text(outcome)))
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


def _warn(text: str) -> None:
    click.echo(f"warning: {text}", err=True)


def _show(run: Prepared, show_diff: bool = False) -> None:
    from egpu_setup.install.show import plan_text

    for w in run.warnings:
        _warn(w)
    click.echo(_fitted(plan_text(run, diff=show_diff)))


def _fitted(text: str) -> str:
    """The plan wrapped to the terminal (not when piped); the file diffs after their separator
    stay as diff wrote them."""
    from egpu_setup.install.show import DIFF_SEPARATOR
    from egpu_setup.text import fit, terminal_width

    head, sep, diffs = text.partition(DIFF_SEPARATOR)
    return fit(head, terminal_width()) + sep + diffs


def _confirm(run: Prepared, show_diff: bool = False) -> None:
    """The plan, then a yes from a person at a terminal (Aborted otherwise: exit 130)."""
    from egpu_setup.errors import UsageError

    _show(run, show_diff)
    if not sys.stdin.isatty():
        raise UsageError("confirmation needed and stdin is not a terminal", "pass --yes")
    click.confirm("Apply this plan?", abort=True, err=True)


def _ask_enclosure(devices: Sequence[TbDevice]) -> TbDevice | None:
    """Which waiting Thunderbolt device is the enclosure: a person picks one, or none."""
    from egpu_setup.install.enrol import describe

    click.echo("No eGPU is visible. These Thunderbolt devices wait for authorization:", err=True)
    for i, dev in enumerate(devices, 1):
        click.echo(f"  {i}. {describe(dev)}", err=True)
    click.echo("Enrol only your eGPU enclosure: it gets a PCIe tunnel (DMA) from now on.", err=True)
    answer = click.prompt(
        f"Enrol which? [1-{len(devices)}, Enter: none]",
        default="",
        show_default=False,
        err=True,
    ).strip()
    if answer.isdigit() and 1 <= int(answer) <= len(devices):
        return devices[int(answer) - 1]
    return None
