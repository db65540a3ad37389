"""`egpu-setup resume-check`: the eGPU after a suspend (run by egpu-setup-resume.service)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from egpu_setup.commands._options import echo_json, json_option, root_option, venv_option
from egpu_setup.errors import EXIT_FAILED
from egpu_setup.state.paths import TORCH_VENV
from egpu_setup.text import plain


@click.command(
    "resume-check",
    epilog="""\b
Examples:
  sudo egpu-setup resume-check                  # after a resume: is the eGPU back?
  sudo egpu-setup resume-check --before-sleep   # what the sleep unit records
  sudo egpu-setup resume-check --json | jq .findings
""",
)
@json_option
@root_option("Check the system image under DIR (its sysfs copy), not this machine.", "root")
@click.option(
    "--before-sleep",
    is_flag=True,
    help="Record the eGPU, its enclosure and the CUDA processes on it in "
    "/run/egpu-setup/sleep.json (egpu-setup-sleep.service runs this before every sleep).",
)
@venv_option(
    "The torch venv `verify --quick` runs in when a CUDA process used the eGPU.",
    default=TORCH_VENV,
)
def command(as_json: bool, root: str | None, before_sleep: bool, venv: str) -> None:
    """After a resume: check the enclosure is still authorized and the eGPU is on the bus with
    its driver bound; rescan the PCI bus once if not; run `verify --quick` when a CUDA process
    was using the eGPU before the sleep. The result is kept in <state>/resume.json.

    Exits 0 when the eGPU is back (or there is none), 1 when it is not or verify failed.
    """
    from egpu_setup.host.machine import open_host
    from egpu_setup.install.resume import (
        check_after_resume,
        probe_sleep_record,
        save_check,
        save_sleep_record,
    )
    from egpu_setup.state.paths import StatePaths

    host = open_host(None, root)
    if before_sleep:
        record = probe_sleep_record(host)
        save_sleep_record(host, record)
        if as_json:
            echo_json(record.to_json())
        for user in record.cuda:
            click.echo(f"CUDA on the eGPU before the sleep: {plain(user)}")
        return
    check = check_after_resume(host, venv)
    paths = StatePaths.for_root(Path(root or "/"))
    save_check(paths.state_dir, paths.anchor, check)
    if as_json:
        echo_json(check.to_json())
    elif check.record.gpu is None:
        click.echo("no eGPU recorded before the sleep or detected now: nothing to check")
    else:
        state = check.state
        click.echo(
            f"eGPU {check.record.gpu}: {'on the bus' if state.present else 'gone'}, driver "
            f"{plain(state.driver or 'none')}"
            + ("" if state.authorized is None else f", enclosure authorized: {state.authorized}")
            + (" (after a PCI rescan)" if check.rescanned else "")
        )
        if check.verify_ok is not None:
            click.echo(f"verify --quick: {'passed' if check.verify_ok else 'FAILED'}")
        for f in check.findings:
            click.echo(f"{f.severity}: {f.id}: {plain(f.summary)}\n  fix: {plain(f.fix)}")
    if not check.ok:
        sys.exit(EXIT_FAILED)
