"""`egpu-setup report DIR...`: one table from the install/verify reports of a whole lab."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from egpu_setup.commands._options import NonEmptyPath, echo_json, json_option
from egpu_setup.errors import EXIT_FAILED, EgpuSetupError, UsageError
from egpu_setup.text import plain

EPILOG = """\b
Examples:
  egpu-setup report reports/                      # table of every host under reports/
  egpu-setup report reports/ --html lab.html      # also a self-contained web page
  egpu-setup report /var/lib/egpu-setup/reports   # this machine's own history
  egpu-setup report reports/ --json --strict      # for CI: exit 1 unless every machine is ok
  egpu-setup report ci-reports/ --strict --cpu-ok  # CI runners verify on the CPU by design
  egpu-setup report reports/ --since 2026-09-01   # health over the term that began then
"""


@click.command(epilog=EPILOG)
@click.argument("paths", nargs=-1, required=True, type=NonEmptyPath(path_type=str))
@click.option(
    "--html",
    "html_out",
    type=NonEmptyPath(dir_okay=False, path_type=str),
    default=None,
    help="Also write a self-contained HTML page to this file.",
)
@click.option("--title", default="egpu-setup fleet report", show_default=True, help="HTML title.")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 unless every machine is ok: verified on its eGPU, nothing failed, no report "
    "claiming another machine.",
)
@click.option(
    "--cpu-ok",
    is_flag=True,
    help="Count a machine verified on the CPU only (`verify --device cpu`) as ok: for CI "
    "runners and machines without an eGPU by design.",
)
@click.option(
    "--since",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    default=None,
    metavar="YYYY-MM-DD",
    help="The term's first day: peak temperature, throttle time and Xids from the health "
    "sampler over the days from this one on (default: every day the machines kept).",
)
@json_option
def command(
    paths: tuple[str, ...],
    html_out: str | None,
    title: str,
    strict: bool,
    cpu_ok: bool,
    since: datetime | None,
    as_json: bool,
) -> None:
    """Merge install/verify JSON reports (folders are searched recursively) into one table.

    One row per machine: a machine is the folder the Ansible role collected its reports into
    (<dest>/<inventory_hostname>/, with identity.json), and the machine id its reports record;
    never the hostname alone. Each row shows the device verify ran on, the GPU, link and its
    ceiling, host-to-device GB/s and TFLOPS against what the link and the profile allow, the
    torch really installed, the newest report's time and age, and every failure with its
    message. A report that claims another machine than its folder's is set aside and makes
    that row "suspect". The HTML page draws the bandwidth and TFLOPS of every machine.

    With the health sampler's health.json and the kernels check's kernels.json beside the
    reports, each row also shows the term's peak temperature against the profile's limit,
    the time throttled, the Xid events and which kernels lack the NVIDIA module; a second
    table groups the machines by the Thunderbolt enclosure their eGPU sat in and flags a
    box whose link was degraded on every machine it met.
    """
    from egpu_setup.fleet.html import render_html
    from egpu_setup.fleet.rows import collect
    from egpu_setup.fleet.text import render_text

    report = collect(paths, cpu_ok=cpu_ok, since=since.date() if since else None)
    if html_out is not None:
        _write_atomic(Path(html_out), render_html(report, title))
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(render_text(report), nl=False)
    bad = report.not_ok
    if strict and bad:
        names = ", ".join(r.machine for r in bad[:5]) + (" …" if len(bad) > 5 else "")
        cpu = [r for r in bad if r.status == "cpu only"]
        hint = "see the failures under each row; re-run `egpu-setup verify` on those machines"
        if cpu and len(cpu) == len(bad):
            hint = "they were verified on the CPU only: verify on the eGPU, or pass --cpu-ok"
        raise EgpuSetupError(
            f"{len(bad)} of {len(report.rows)} machines are not ok: {plain(names)}",
            hint,
            exit_code=EXIT_FAILED,
        )


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder, so a reader never sees half a page; through
    the one writer (state/output.py): the folder's owner gets the page, a link at it is
    refused."""
    from egpu_setup.state.output import OutputTree

    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"--html {path}: folder {folder} does not exist", "create it first")
    try:
        out = OutputTree.open(folder, what="--html")
        out.write(out.path / path.name, text.encode("utf-8"), 0o644)
    except OSError as exc:
        raise UsageError(f"--html {path}: {exc.strerror or exc}", "choose a writable path") from exc
