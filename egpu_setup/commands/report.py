"""`egpu-setup report DIR...`: one table from the install/verify reports of a whole lab."""

from __future__ import annotations

from pathlib import Path

import click

from egpu_setup.commands._options import echo_json, json_option
from egpu_setup.errors import EXIT_FAILED, EgpuSetupError, UsageError

EPILOG = """\b
Examples:
  egpu-setup report reports/                      # table of every host under reports/
  egpu-setup report reports/ --html lab.html      # also a self-contained web page
  egpu-setup report /var/lib/egpu-setup/reports   # this machine's own history
  egpu-setup report reports/ --json --strict      # for CI: exit 1 if any host failed
"""


@click.command(epilog=EPILOG)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "--html",
    "html_out",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="Also write a self-contained HTML page to this file.",
)
@click.option("--title", default="egpu-setup fleet report", show_default=True, help="HTML title.")
@click.option("--strict", is_flag=True, help="Exit 1 when any host failed or was not verified.")
@json_option
def command(
    paths: tuple[str, ...], html_out: str | None, title: str, strict: bool, as_json: bool
) -> None:
    """Merge install/verify JSON reports (folders are searched recursively) into one table.

    One row per host: GPU, connection, PCIe link, driver, torch, host-to-device bandwidth,
    the AMP training result and every failed check. The newest report of each kind wins.
    """
    from egpu_setup.fleet.report import collect, render_html, render_text

    report = collect(paths)
    if html_out is not None:
        _write_atomic(Path(html_out), render_html(report, title))
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(render_text(report), nl=False)
    if strict and any(not row.ok for row in report.rows):
        raise EgpuSetupError(
            f"{sum(not r.ok for r in report.rows)} of {len(report.rows)} hosts are not ok",
            "see the failures column; re-run `egpu-setup verify` on those hosts",
            exit_code=EXIT_FAILED,
        )


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder, so a reader never sees half a page."""
    from egpu_setup.state.atomic import atomic_write

    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"--html {path}: folder {folder} does not exist", "create it first")
    try:
        atomic_write(path, text.encode("utf-8"), 0o644)
    except OSError as exc:
        raise UsageError(f"--html {path}: {exc.strerror or exc}", "choose a writable path") from exc
