"""Command line: parse options, call one core function, print, map errors to exit codes.

Commands are imported only when invoked, so `egpu-setup --help` and `detect` stay fast:
`--help` imports Click and this module's command table, nothing else (tests/test_startup.py),
and nothing heavy (torch, requests, jinja2) is on any command's startup path.
"""

from __future__ import annotations

import importlib
import sys

import click

from egpu_setup import __version__
from egpu_setup.errors import EXIT_INTERRUPTED, EgpuSetupError

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
    "report": ("report", "Merge install/verify reports from many machines into one table."),
    "firstboot": (
        "firstboot",
        "A lab image's first boot: enrol the enclosure, wait for the eGPU, verify.",
    ),
}

EPILOG = """\b
Examples:
  egpu-setup install --profile rtx4090 --dry-run   # what would change here
  egpu-setup detect --json                         # host facts for scripts
  egpu-setup resolve --gpu 2b85 --driver 550.163   # what-if, no hardware needed
  egpu-setup verify --device cpu --quick           # the verify path without a GPU
"""


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (the table above lists them all;
    tests/test_startup.py checks that each names a module with a `command`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"egpu_setup.commands.{COMMANDS[name][0]}")
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _setup_logging(verbose: int, quiet: int) -> None:
    import logging  # here, not at the top: `--help` and `--version` never get this far

    level = logging.WARNING + 10 * (quiet - verbose)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(levelname)s: %(message)s" if verbose else "%(message)s")
    )
    root = logging.getLogger("egpu_setup")
    root.handlers[:] = [handler]
    root.setLevel(max(logging.DEBUG, min(level, logging.CRITICAL)))


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="egpu-setup")
@click.option("-v", "--verbose", count=True, help="More detail on stderr (repeat for debug).")
@click.option("-q", "--quiet", count=True, help="Less on stderr.")
def cli(verbose: int, quiet: int) -> None:
    """Turn a Linux laptop plus an NVIDIA eGPU into a verified PyTorch machine."""
    _setup_logging(verbose, quiet)


def fail(exc: EgpuSetupError) -> None:
    """Print an expected error the house way and exit with its code."""
    from egpu_setup.text import plain

    click.echo(f"error: {plain(exc.message)}", err=True)
    for line in (getattr(exc, "stderr_tail", "") or "").splitlines()[-15:]:
        click.echo(f"  | {plain(line)}", err=True)  # what the failed command said
    if exc.hint:
        click.echo(f"hint: {plain(exc.hint)}", err=True)
    sys.exit(exc.exit_code)


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


def main() -> None:
    """Console entry point."""
    try:
        # With standalone_mode=False click returns (not raises) the code of ctx.exit(N).
        rc = cli.main(prog_name="egpu-setup", standalone_mode=False)
        if isinstance(rc, int) and not isinstance(rc, bool):
            sys.exit(rc)
    except EgpuSetupError as exc:
        fail(exc)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        cmd = exc.ctx.command_path if exc.ctx else "egpu-setup"
        click.echo(f"hint: see `{cmd} --help`", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
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
