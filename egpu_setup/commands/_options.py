"""Options shared by several commands, and the JSON/table printing they share."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # at run time only when a shell asks to complete: 4-9 ms off every start
    from click.shell_completion import CompletionItem

from_option = click.option(
    "--from",
    "from_dir",
    type=click.Path(file_okay=False, path_type=str),
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


def complete_profile(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Tab completion for --profile: the names of shipped and local profiles, or a file path."""
    from click.shell_completion import CompletionItem

    if "/" in incomplete or incomplete.startswith("."):
        return [CompletionItem(incomplete, type="file")]
    from egpu_setup.profile.search import available

    return [CompletionItem(name) for name in sorted(available()) if name.startswith(incomplete)]


def echo_json(data: Any) -> None:
    """Print one JSON document on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=False))
