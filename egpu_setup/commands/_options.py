"""Every option that more than one command takes, declared once; the JSON printing they share.

A command takes an option by applying its decorator, as Click composes them
(https://click.palletsprojects.com/en/stable/api/#click.option); the factories below take only
what differs between commands: the help sentence (what the value means to that command), the
Python name it arrives under, whether it is required or repeatable.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from collections.abc import Callable

    from click.shell_completion import CompletionItem

    Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class NonEmptyPath(click.Path):
    """click.Path that also refuses an empty string: `record ''` or `--root ''` would otherwise
    mean the working directory, which nobody typing it meant."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("an empty path.", param, ctx)
        return super().convert(value, param, ctx)


def complete_profile(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Tab completion for --profile: shipped and local profile names, or a file path (Click's
    shell_complete callback: https://click.palletsprojects.com/en/stable/shell-completion/)."""
    from click.shell_completion import CompletionItem

    if "/" in incomplete or incomplete.startswith("."):
        return [CompletionItem(incomplete, type="file")]
    from egpu_setup.profile.search import available

    return [CompletionItem(n) for n in sorted(available()) if n.startswith(incomplete)]


def profile_option(
    help: str,
    dest: str = "profile_name",
    *,
    required: bool = False,
    multiple: bool = False,
    metavar: str = "NAME|FILE",
) -> Decorator:
    """--profile: a shipped or local profile name, or a path to a profile YAML file."""
    return click.option(
        "--profile",
        dest,
        required=required,
        multiple=multiple,
        metavar=metavar,
        shell_complete=complete_profile,
        help=help,
    )


def venv_option(
    help: str, *, default: str | None = None, path_type: type = str, must_be_dir: bool = False
) -> Decorator:
    """--venv: a torch virtual environment (a directory)."""
    return click.option(
        "--venv",
        "venv",
        type=NonEmptyPath(file_okay=False, path_type=path_type) if must_be_dir else None,
        default=default,
        show_default=default is not None,
        metavar="DIR" if must_be_dir else "PATH",
        help=help,
    )


def root_option(help: str, dest: str = "root_dir", *, exists: bool = False) -> Decorator:
    """--root: act on the system image (or root-prefixed tree) at DIR instead of /."""
    return click.option(
        "--root",
        dest,
        type=NonEmptyPath(file_okay=False, exists=True) if exists else None,
        default=None,
        metavar="DIR",
        help=help,
    )


def python_option(
    help: str, dest: str = "python", *, multiple: bool = False, metavar: str = "X.Y"
) -> Decorator:
    """--python: a target Python version (X.Y), or an interpreter's path (metavar PATH)."""
    return click.option("--python", dest, multiple=multiple, metavar=metavar, help=help)


def torch_option(help: str) -> Decorator:
    return click.option("--torch", "torch_spec", default=None, metavar="SPEC", help=help)


def cuda_option(help: str) -> Decorator:
    return click.option("--cuda", default=None, metavar="VARIANT", help=help)


def rocm_option(help: str) -> Decorator:
    return click.option("--rocm", default=None, metavar="VARIANT", help=help)


def index_url_option(help: str) -> Decorator:
    return click.option("--index-url", default=None, metavar="URL", help=help)


def driver_branch_option(help: str) -> Decorator:
    return click.option("--driver-branch", type=int, default=None, metavar="N", help=help)


def mode_option(help: str) -> Decorator:
    return click.option(
        "--mode", type=click.Choice(["compute", "display"]), default=None, help=help
    )


def only_option(parts: str) -> Decorator:
    return click.option("--only", default=None, metavar="PARTS", help=f"Comma list of {parts}.")


def yes_option(help: str, dest: str = "yes") -> Decorator:
    return click.option("--yes", "-y", dest, is_flag=True, help=help)


def enclosure_option(help: str, dest: str = "enclosure", *, multiple: bool = False) -> Decorator:
    """--enclosure: a Thunderbolt device's unique_id (as boltctl lists it)."""
    return click.option("--enclosure", dest, multiple=multiple, metavar="UUID", help=help)


from_option = click.option(
    "--from",
    "from_dir",
    type=NonEmptyPath(file_okay=False, path_type=str),
    default=None,
    help="Read a recorded host bundle (written by `egpu-setup record`) instead of this machine.",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (a stable contract)."
)
# compat/matrix.py select_matrix: the shipped snapshot decides unless a run asks for the overlay
matrix_option = click.option(
    "--matrix",
    "matrix_choice",
    type=click.Choice(["shipped", "updated"]),
    default="shipped",
    show_default=True,
    help="Compatibility data that decides: the snapshot shipped with this egpu-setup (the same "
    "on every machine), or `updated`: it plus what the last `matrix update` read.",
)


def echo_json(data: Any) -> None:
    """Print one JSON document on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=False))
