"""Command line: parse options, call one core function, print, map errors to exit codes.

Built on Click (https://click.palletsprojects.com/). Subcommands load lazily, Click's documented
pattern (https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands): the
table below names each command's module and its one-line help, so `egpu-setup --help` lists them
all without importing any, and `detect` imports only commands/detect.py (tests/test_startup.py).
Nothing heavy (torch, requests, jinja2) is on any command's startup path.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

import click

from egpu_setup import __version__
from egpu_setup.errors import EXIT_INTERRUPTED, EXIT_USAGE, Aborted, EgpuSetupError, UsageError
from egpu_setup.host.umask import take_safe_umask

if TYPE_CHECKING:
    from collections.abc import Sequence

# name -> (module under egpu_setup.commands, one-line help shown by `egpu-setup --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "detect": (
        "detect",
        "Show host facts: OS, GPUs (which is the eGPU), NVIDIA driver, Thunderbolt.",
    ),
    "record": ("record", "Write a redacted diagnostics bundle (the --from format)."),
    "doctor": ("doctor", "Diagnose known eGPU failure modes, with evidence and a fix for each."),
    "resolve": (
        "resolve",
        "Show which driver, CUDA variant and torch would be installed, and why.",
    ),
    "install": ("install", "Provision this machine (driver, torch venv, hot-plug config)."),
    "verify": ("verify", "Prove the eGPU trains: torch.cuda checks, bandwidth, AMP smoke run."),
    "render": ("render", "Render the hot-plug configuration files into a directory."),
    "rollback": ("rollback", "Restore every file egpu-setup replaced; remove the ones it created."),
    "eject": ("eject", "Safely detach the eGPU, or say why it is not safe."),
    "profiles": ("profiles", "List, show and check GPU profiles."),
    "matrix": ("matrix", "Show or update the driver/CUDA/torch compatibility data."),
    "bundle": ("bundle", "Build an offline bundle (wheelhouse, .debs) for many laptops."),
    "venv": ("venv", "Make a venv of your own on the verified, root-owned torch (not as root)."),
    "report": ("report", "Merge install/verify reports from many machines into one table."),
    "kernels": (
        "kernels",
        "Check (and have DKMS build) the NVIDIA module for every installed kernel.",
    ),
    "resume-check": (
        "resume_check",
        "After a suspend: is the eGPU authorized, on the bus and bound? Rescan once if not.",
    ),
    "sleep-guard": (
        "sleep_guard",
        "Hold sleep off while a CUDA process uses the eGPU, naming it (run by a unit).",
    ),
    "health": (
        "health",
        "Sample the eGPU's temperature, power, throttling, link and Xids (run by a timer).",
    ),
    "firstboot": (
        "firstboot",
        "A lab image's first boot: enrol the enclosure, wait for the eGPU, verify.",
    ),
    "mok-key": ("mok_key", "Make a lab's Secure Boot module signing key (install --mok-key)."),
}

EPILOG = """\b
Examples:
  egpu-setup install --profile rtx4090 --dry-run   # what would change here
  egpu-setup detect --json                         # host facts for scripts
  egpu-setup resolve --gpu 2b85 --driver 550.163   # what-if, no hardware needed
  egpu-setup verify --device cpu --quick           # the verify path without a GPU
"""


class LazyGroup(click.Group):
    """The top-level group: a subcommand's module is imported when that command is asked for
    (tests/test_startup.py checks that each name in the table has a module with a `command`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)  # the table's order, most used first

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"egpu_setup.commands.{COMMANDS[cmd_name][0]}")
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands' one-line helps from the table: `--help` imports none of them."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_module, text) in COMMANDS.items()])


def _setup_logging(verbose: int, quiet: int) -> None:
    """-v and -q set how much reaches stderr. Without them nothing is configured and `logging`
    is not even imported (egpu_setup/log.py): Python's last-resort handler prints a warning or
    worse as the bare message on stderr, which is what this would set up."""
    if verbose == quiet == 0:
        return
    import logging

    level = logging.WARNING + 10 * (quiet - verbose)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(levelname)s: %(message)s" if verbose else "%(message)s")
    )
    root = logging.getLogger("egpu_setup")
    root.handlers[:] = [handler]
    root.setLevel(max(logging.DEBUG, min(level, logging.CRITICAL)))


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"egpu-setup, version {__version__}")
        ctx.exit(0)


@click.group(
    "egpu-setup",
    cls=LazyGroup,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@click.option("-v", "--verbose", count=True, help="More detail on stderr (repeat for debug).")
@click.option("-q", "--quiet", count=True, help="Less on stderr.")
def cli(verbose: int, quiet: int) -> None:
    """Turn a Linux laptop plus an NVIDIA or AMD eGPU into a verified PyTorch machine."""
    _setup_logging(verbose, quiet)


def fail(exc: EgpuSetupError) -> None:
    """Print an expected error the house way and exit with its code."""
    from egpu_setup.text import fit, plain, terminal_width

    width = terminal_width(err=True)  # wrapped on a terminal; piped, one line each for scripts
    click.echo(fit(f"error: {plain(exc.message)}", width), err=True)
    for line in (getattr(exc, "stderr_tail", "") or "").splitlines()[-15:]:
        click.echo(fit(f"  | {plain(line)}", width), err=True)  # what the failed command said
    if exc.hint:
        click.echo(fit(f"hint: {plain(exc.hint)}", width), err=True)
    sys.exit(exc.exit_code)


def _usage_error(exc: click.UsageError) -> EgpuSetupError:
    """Click's message for bad usage, as the house's error and hint (exit 2): the hint names
    the help of the command that refused it."""
    path = exc.ctx.command_path if exc.ctx is not None else "egpu-setup"
    message = exc.format_message()
    if isinstance(exc, click.exceptions.NoArgsIsHelpError) or message == "Missing command.":
        names = ", ".join(COMMANDS) if exc.ctx is None or exc.ctx.parent is None else None
        hint = f"one of {names}; see `{path} --help`" if names else f"see `{path} --help`"
        return EgpuSetupError("Missing command.", hint, exit_code=EXIT_USAGE)
    return EgpuSetupError(message, f"see `{path} --help`", exit_code=EXIT_USAGE)


def _check_completion_request(request: str) -> None:
    """Click exits 1 without a word for a shell it does not complete for; say what it takes."""
    from click.shell_completion import get_completion_class

    shell, _, action = request.partition("_")
    if get_completion_class(shell) is None or action not in ("source", "complete"):
        fail(
            UsageError(
                f"_EGPU_SETUP_COMPLETE={request!r} is not a completion request",
                "bash_source, zsh_source or fish_source prints the shell's script; "
                "unset the variable to run egpu-setup",
            )
        )


def _crash_log(exc: BaseException) -> str | None:
    """Write a Markdown crash log (versions, platform, traceback); return its path."""
    import platform
    import tempfile
    import traceback

    text = (
        f"# egpu-setup {__version__} crash\n\n- python: {sys.version.split()[0]}\n"
        f"- platform: {platform.platform()}\n- argv: {sys.argv}\n\n```\n"
        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        + "```\n"
    )
    try:
        fd, path = tempfile.mkstemp(prefix="egpu-setup-crash-", suffix=".md")
        with open(fd, "w") as f:
            f.write(text)
        return path
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point. Click runs with standalone_mode=False so that every failure, Click's
    own usage errors included, is printed as `error:` + `hint:` with the exit codes of
    docs/design.md; `_EGPU_SETUP_COMPLETE` (shell completion) is answered by Click before that."""
    take_safe_umask()  # a caller's umask 000 never makes what a run creates writable by all
    request = os.environ.get("_EGPU_SETUP_COMPLETE")
    if request:
        _check_completion_request(request)
    try:
        rc = cli.main(
            list(sys.argv[1:] if argv is None else argv),
            prog_name="egpu-setup",
            complete_var="_EGPU_SETUP_COMPLETE",
            standalone_mode=False,
        )
        if isinstance(rc, int) and not isinstance(rc, bool):
            sys.exit(rc)
    except EgpuSetupError as exc:
        fail(exc)
    except click.UsageError as exc:
        fail(_usage_error(exc))
    except click.ClickException as exc:  # a file Click could not open: bad input
        fail(EgpuSetupError(exc.format_message(), "see `egpu-setup --help`", exit_code=EXIT_USAGE))
    except (KeyboardInterrupt, Aborted, click.Abort):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug: say where the details are, never a bare traceback
        path = _crash_log(exc)
        click.echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
        click.echo(
            f"hint: please report it with the crash log {path}"
            if path
            else "hint: please report it",
            err=True,
        )
        sys.exit(70)
