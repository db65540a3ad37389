"""Command line: parse options, call one core function, print, map errors to exit codes.

Commands are imported only when invoked, so `egpu-setup --help` and `detect` stay fast:
`--help` imports this module's command table and the command-line kit (commands/_cli.py),
nothing else (tests/test_startup.py), and nothing heavy (torch, requests, jinja2) is on any
command's startup path.
"""

from __future__ import annotations

import importlib
import os
import sys

from egpu_setup import __version__
from egpu_setup.commands import _cli as cli_kit
from egpu_setup.errors import EXIT_INTERRUPTED, Aborted, EgpuSetupError

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


class LazyGroup(cli_kit.Group):
    """The top-level group: its subcommands are imported on first use (the table above lists
    them all; tests/test_startup.py checks that each names a module with a `command`)."""

    def list_commands(self) -> list[str]:
        return list(COMMANDS)

    def get_command(self, name: str) -> cli_kit.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"egpu_setup.commands.{COMMANDS[name][0]}")
        command: cli_kit.Command = module.command
        return command

    def short_helps(self) -> list[tuple[str, str]]:
        return [(name, help_text) for name, (_module, help_text) in COMMANDS.items()]


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


@cli_kit.option("--version", is_flag=True, help="Show the version and exit.")
@cli_kit.option("-v", "--verbose", count=True, help="More detail on stderr (repeat for debug).")
@cli_kit.option("-q", "--quiet", count=True, help="Less on stderr.")
def _options(verbose: int, quiet: int, version: bool) -> None:
    """Turn a Linux laptop plus an NVIDIA eGPU into a verified PyTorch machine."""
    if version:  # as Click's version option: it wins over any command after it
        cli_kit.echo(f"egpu-setup, version {__version__}")
        raise SystemExit(0)
    _setup_logging(verbose, quiet)


cli = LazyGroup("egpu-setup", _options, EPILOG)


def fail(exc: EgpuSetupError) -> None:
    """Print an expected error the house way and exit with its code."""
    from egpu_setup.text import plain

    echo = cli_kit.echo
    echo(f"error: {plain(exc.message)}", err=True)
    for line in (getattr(exc, "stderr_tail", "") or "").splitlines()[-15:]:
        echo(f"  | {plain(line)}", err=True)  # what the failed command said
    if exc.hint:
        echo(f"hint: {plain(exc.hint)}", err=True)
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
    echo = cli_kit.echo
    if os.environ.get("_EGPU_SETUP_COMPLETE"):  # bash asking what to complete (scripts/install.sh)
        from egpu_setup.commands._complete import answer

        sys.exit(answer(cli, os.environ))
    try:
        rc = cli.main(sys.argv[1:], "egpu-setup")
        if isinstance(rc, int) and not isinstance(rc, bool):
            sys.exit(rc)
    except EgpuSetupError as exc:
        fail(exc)
    except (KeyboardInterrupt, Aborted):
        echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug: say where the details are, never a bare traceback
        path = _crash_log(exc)
        echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
        echo(
            f"hint: please report it with the crash log {path}"
            if path
            else "hint: please report it",
            err=True,
        )
        sys.exit(70)
