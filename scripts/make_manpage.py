"""Write the man page egpu-setup(1) from Click's own command objects, so page and help never differ.

    python scripts/make_manpage.py             # writes docs/egpu-setup.1
    python scripts/make_manpage.py --check     # exit 1 when docs/egpu-setup.1 is out of date

The wheel installs docs/egpu-setup.1 as share/man/man1/egpu-setup.1; scripts/install.sh links it
into /usr/local/share/man/man1. A test runs --check, so a changed option fails CI until the page
is regenerated.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "egpu-setup.1"


def _roff(text: str) -> str:
    """Escape text for roff: backslashes, and a leading dot or quote that would start a request."""
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _options(cmd: click.Command, ctx: click.Context) -> list[str]:
    """One tagged paragraph per option: the names and metavar, the help with Click's own extras
    ([default: ...], [env var: ...], [required]), as get_help_record builds them for --help."""
    out: list[str] = []
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is not None:
            names, help_text = record
            out += [".TP", f"\\fB{_roff(names)}\\fR", _roff(help_text)]
    return out


def _help(cmd: click.Command) -> str:
    return _roff(inspect.cleandoc(cmd.help or "").replace("\b\n", "").strip())


def _usage(cmd: click.Command, ctx: click.Context) -> str:
    return _roff(" ".join(cmd.collect_usage_pieces(ctx)))


def _epilog(cmd: click.Command) -> list[str]:
    if not cmd.epilog:
        return []
    body = cmd.epilog.replace("\b\n", "").strip("\n")
    return [".PP", ".nf", _roff(body), ".fi"]


def render(version: str) -> str:
    from egpu_setup.cli import cli

    root = click.Context(cli, info_name="egpu-setup", **cli.context_settings)
    lines = [
        f'.TH EGPU-SETUP 1 "" "egpu-setup {version}" "User Commands"',
        ".SH NAME",
        "egpu-setup \\- turn a Linux laptop plus an NVIDIA or AMD eGPU into a verified PyTorch "
        "machine",
        ".SH SYNOPSIS",
        "\\fBegpu-setup\\fR [\\fB-v\\fR|\\fB-q\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        _help(cli),
        ".SH GLOBAL OPTIONS",
        *_options(cli, root),
        ".SH COMMANDS",
    ]
    for name in cli.list_commands(root):
        cmd = cli.get_command(root, name)
        if cmd is None:
            continue
        ctx = click.Context(cmd, info_name=name, parent=root)
        lines += [".SS", f"\\fBegpu-setup {name}\\fR {_usage(cmd, ctx)}", _help(cmd)]
        if isinstance(cmd, click.Group):
            for sub_name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, sub_name)
                if sub is not None:
                    sub_ctx = click.Context(sub, info_name=sub_name, parent=ctx)
                    lines += [
                        ".PP",
                        f"\\fBegpu-setup {name} {sub_name}\\fR {_usage(sub, sub_ctx)}",
                        _help(sub),
                        *_options(sub, sub_ctx),
                    ]
        lines += _options(cmd, ctx) + _epilog(cmd)
    lines += [
        ".SH EXIT STATUS",
        "0 success; 1 a check or step failed; 2 bad usage or input; 3 done, but a reboot is "
        "required; 4 a person must act (firmware setting, MOK enrolment); 5 busy (a lock is "
        "held); 130 interrupted.",
        ".SH FILES",
        "/var/lib/egpu-setup/ (manifest, journal, backups, reports), /run/lock/egpu-setup.lock, "
        "/opt/egpu-setup/venv (torch), /etc/egpu-setup/profiles/ and "
        "~/.config/egpu-setup/profiles/ (local profiles).",
        ".SH SEE ALSO",
        "The README of the source distribution.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    from egpu_setup import __version__

    page = render(__version__)
    if "--check" in sys.argv[1:]:
        current = PAGE.read_text() if PAGE.is_file() else ""
        if current != page:
            print(f"{PAGE} is out of date: run python scripts/make_manpage.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(PAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
