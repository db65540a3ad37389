"""`egpu-setup doctor`: known eGPU failure modes, with evidence and a fix for each."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from egpu_setup.commands._options import (
    NonEmptyPath,
    echo_json,
    from_option,
    json_option,
    root_option,
    venv_option,
)
from egpu_setup.errors import EXIT_FAILED, UsageError
from egpu_setup.log import get_logger

if TYPE_CHECKING:
    from egpu_setup.doctor.findings import DoctorInput, Finding
    from egpu_setup.doctor.torchcheck import TorchInfo

log = get_logger("egpu_setup.doctor")


_TORCH_INFO_HINT = (
    "pass a report of `egpu-setup verify` (<state>/reports/verify-*.json) "
    "or a torch.json from `egpu-setup record DIR --venv PATH`"
)


def load_torch_info(path: Path, text: str | None = None) -> TorchInfo:
    """Torch facts from a user-named file or a bundle's commands/torch.json (`text`, read inside
    the bundle): a verify report or the small form (egpu_setup/doctor/torchcheck.py)."""
    from egpu_setup.doctor.torchcheck import parse_torch_info
    from egpu_setup.host.machine import LiveHost

    if text is None:
        # Read through the gateway: this is a file on this machine that the user pointed us at.
        text = LiveHost().read(str(path), limit=1024 * 1024)
    if text is None:
        raise UsageError(f"cannot read {path}", _TORCH_INFO_HINT)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})", _TORCH_INFO_HINT) from None
    return parse_torch_info(data, str(path))


@click.command(
    "doctor",
    epilog="""\b
Examples:
  egpu-setup doctor                          # diagnose this machine
  egpu-setup doctor --json | jq '.findings[].id'
  egpu-setup doctor --from ./bundle          # a bundle from `egpu-setup record` or a bug report
  egpu-setup doctor --root /srv/lab-image    # a system image: its kernels, driver hold, files
  egpu-setup doctor --torch-info /var/lib/egpu-setup/reports/verify-<time>.json
  egpu-setup doctor --venv /opt/egpu-setup/venv   # ask that venv's torch directly
""",
)
@json_option
@from_option
@root_option(
    "Diagnose the system image under DIR (its files; no command of this machine).", exists=True
)
@click.option(
    "--torch-info",
    "torch_info_path",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="A verify report (<state>/reports/verify-*.json) or JSON with torch_version/cuda/"
    "arch_list/cuda_available of the target venv (default with --from: DIR/commands/torch.json "
    "when present).",
)
@venv_option(
    "Check the torch build in this venv (runs its Python; this machine only).",
    path_type=Path,
    must_be_dir=True,
)
def command(
    as_json: bool,
    from_dir: str | None,
    root_dir: str | None,
    torch_info_path: Path | None,
    venv: Path | None,
) -> None:
    """Diagnose known eGPU failure modes: each finding has a stable id, evidence and a fix.

    Exits 0 when nothing is an error, 1 otherwise.
    """
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.doctor.collect import collect
    from egpu_setup.doctor.diagnose import diagnose, report_json
    from egpu_setup.host.machine import open_host

    if root_dir is not None and (from_dir is not None or venv is not None):
        raise UsageError(
            "--root diagnoses an image; --from a recording, --venv this machine's venv",
            "give one of --root, --from and --venv",
        )
    host = open_host(from_dir, root_dir)
    bundled = None
    if torch_info_path is None and from_dir is not None:
        # read inside the bundle, like every file of it: a link there cannot reach this machine
        bundled = host.bundle_file("commands/torch.json", 1024 * 1024)
        if bundled is not None:
            torch_info_path = Path(from_dir) / "commands" / "torch.json"
    if venv is not None and (from_dir is not None or torch_info_path is not None):
        raise UsageError(
            "--venv inspects this machine's venv", "drop --from/--torch-info, or drop --venv"
        )
    if venv is not None:
        from egpu_setup.doctor.torchcheck import probe_venv_torch
        from egpu_setup.host.machine import LiveHost

        torch_info: TorchInfo | None = probe_venv_torch(LiveHost(), venv)
    else:
        torch_info = (
            load_torch_info(torch_info_path, bundled) if torch_info_path is not None else None
        )
    facts = detect_host(host)
    inputs = collect(host, facts)
    if torch_info_path is not None:
        inputs = _with_verify_report(inputs, torch_info_path)
    findings = diagnose(facts, inputs, torch_info)
    missing = [name for name, ok in inputs.sources().items() if not ok]
    if missing:
        log.info("not available: %s", ", ".join(missing))
    if as_json:
        echo_json(report_json(findings, inputs))
    else:
        _print(findings, inputs.sources())
    if any(f.severity == "error" for f in findings):
        sys.exit(EXIT_FAILED)


def _with_verify_report(inputs: DoctorInput, path: Path) -> DoctorInput:
    """A verify report named with --torch-info is the one doctor judges (its temperature too),
    not the newest the machine kept."""
    import dataclasses

    from egpu_setup.host.machine import LiveHost

    try:
        data = json.loads(LiveHost().read(str(path), limit=4 * 1024 * 1024) or "")
    except ValueError:
        return inputs
    if not isinstance(data, dict) or data.get("schema") != "egpu-setup/verify/1":
        return inputs
    from egpu_setup.doctor.collect import older_report_note
    from egpu_setup.text import plain

    if (note := older_report_note(LiveHost(), str(path))) is not None:
        click.echo(f"note: {plain(note)}", err=True)
    return dataclasses.replace(inputs, verify_report=data, verify_report_path=str(path))


def _print(findings: tuple[Finding, ...], sources: dict[str, bool]) -> None:
    import textwrap

    from egpu_setup.text import fit, plain, terminal_width

    width = terminal_width()  # None when piped: the evidence lines stay whole
    cols = min(100, width or 100)
    # summary and fix name files and devices of the machine or the bundle (a udev rule's file
    # name, a GPU's name): they pass the sanitizer as the evidence does
    for f in findings:
        click.echo(f"{f.severity.upper():8} {f.id}")
        click.echo(
            textwrap.fill(plain(f.summary), cols, initial_indent="  ", subsequent_indent="  ")
        )
        for line in f.evidence:
            click.echo(fit(f"  | {plain(line)}", width))
        fix = plain(f.fix)
        click.echo(textwrap.fill(fix, cols, initial_indent="  fix: ", subsequent_indent="       "))
        click.echo("")
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")}
    checked = ", ".join(name for name, ok in sources.items() if ok) or "host facts only"
    if not findings:
        click.echo(f"no known problems found (read: {checked})")
    else:
        click.echo(
            fit(
                f"{counts['error']} error(s), {counts['warning']} warning(s), "
                f"{counts['info']} info (read: {checked})",
                width,
            )
        )
