"""`egpu-setup verify`: prove the eGPU trains (torch runs only in a child process)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from egpu_setup.commands._options import (
    echo_json,
    json_option,
    profile_option,
    python_option,
    venv_option,
)
from egpu_setup.errors import EgpuSetupError
from egpu_setup.log import get_logger

if TYPE_CHECKING:
    from egpu_setup.verify.session import VerifyOptions

log = get_logger("egpu_setup.verify")

EPILOG = """\b
Examples:
  egpu-setup verify                          # the eGPU, in /opt/egpu-setup/venv
  egpu-setup verify --quick --json           # short run, JSON for scripts
  egpu-setup verify --device cpu --quick     # the CPU path (CI, away from the eGPU)
  egpu-setup verify --venv ~/venvs/torch     # another venv
  egpu-setup verify --profile rtx4090        # judge against the profile's expectations
  egpu-setup verify --burn-in 10             # add a 10-minute stability run
  egpu-setup verify --skip amp               # skip a step that hung last time
"""


def _split_skip(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    return tuple(s.strip() for v in values for s in v.split(",") if s.strip())


@click.command("verify", epilog=EPILOG)
@json_option
@venv_option("Venv to verify (default /opt/egpu-setup/venv).")
@python_option("Interpreter to verify instead of a venv.", metavar="PATH")
@click.option(
    "--device",
    default="auto",
    show_default=True,
    metavar="auto|cuda|cuda:N|cpu",
    help="auto: the eGPU; cuda: any CUDA GPU; cpu: the CPU path (bf16 autocast).",
)
@click.option("--quick", is_flag=True, help="Shorter budgets, smaller sizes.")
@click.option(
    "--timeout", "timeout_s", type=float, metavar="S", help="Hard limit for the torch child."
)
@click.option(
    "--burn-in", "burn_in", type=float, default=0.0, metavar="MINUTES", help="Add a stability run."
)
@profile_option("Take expectations from this GPU profile.", "profile")
@click.option(
    "--skip",
    multiple=True,
    callback=_split_skip,
    metavar="STEP[,STEP]",
    help="Skip steps: allocation, bandwidth, matmul, amp, throughput, burn-in, ddp.",
)
def command(
    as_json: bool,
    venv: str | None,
    python: str | None,
    device: str,
    quick: bool,
    timeout_s: float | None,
    burn_in: float,
    profile: str | None,
    skip: tuple[str, ...],
) -> None:
    """Prove the eGPU trains: driver, torch.cuda, identity, link, bandwidth, matmul, AMP.

    torch runs in the target venv as a child process with a hard timeout, so a GPU that hangs
    cannot hang this command; the step it hung in is reported, also on the next run after a
    lock-up. Each check is printed as soon as it is known; every step has a time budget, so a
    slow machine measures less rather than running longer. The report is saved under the state
    directory (/var/lib/egpu-setup/reports/) and its path printed on stderr.
    Exit 0 when every check passed (warnings and info allowed), 1 when one failed or no CUDA
    device was verified, 2 for bad options or a missing interpreter, 5 when another verify runs.
    """
    from egpu_setup.verify.live import LivePrinter
    from egpu_setup.verify.session import VerifyOptions, run_verify, state_dir, target_python

    options = VerifyOptions(
        python=python,
        venv=venv,
        device=device,
        quick=quick,
        timeout_s=timeout_s,
        burn_in_minutes=burn_in,
        profile=profile,
        skip=skip,
    )
    printer = None
    if not as_json:
        # the interpreter is validated (exit 2) before anything is printed
        label = _python_label(options, target_python)
        printer = LivePrinter(label, sys.stdout, sys.stdout.isatty())
    report = run_verify(options, on_event=printer.on_event if printer else None)
    path = None
    try:
        path = report.save(state_dir())
    except OSError as exc:
        log.warning("could not save the report: %s", exc)
    if printer is not None:
        printer.finish(report)
    else:
        echo_json(report.to_json())
    if path is not None:
        click.echo(f"report: {path}", err=True)
    if not report.ok:
        fails = report.failures
        what = "; ".join(f"{c.id}: {c.detail}" for c in fails[:3]) or f"the run {report.outcome}"
        gpu_missing = options.device != "cpu" and not any(
            c.id == "cuda-available" and c.status == "pass" for c in report.checks
        )
        head = "no CUDA device verified" if gpu_missing else "verify failed"
        hint = next((c.hint for c in fails if c.hint), None)
        raise EgpuSetupError(f"{head}: {what}", hint, exit_code=1)


def _python_label(
    options: VerifyOptions, target_python: Callable[[VerifyOptions], tuple[str, bool]]
) -> str:
    try:
        return target_python(options)[0]
    except EgpuSetupError:
        return options.python or options.venv or "?"  # run_verify raises it properly
