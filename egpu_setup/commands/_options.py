"""Options shared by several commands, and the JSON/table printing they share."""

from __future__ import annotations

import json

from egpu_setup.commands import _cli as cli

TYPE_CHECKING = False  # typing costs 2 ms of every start; these names are for mypy only
if TYPE_CHECKING:
    from typing import Any

    from egpu_setup.commands._cli import Completion

from_option = cli.option(
    "--from",
    "from_dir",
    type=cli.Path(file_okay=False, path_type=str),
    default=None,
    help="Read a recorded host bundle (written by `egpu-setup record`) instead of this machine.",
)
json_option = cli.option("--json", "as_json", is_flag=True, help="Print JSON (a stable contract).")
# compat/matrix.py select_matrix: the shipped snapshot decides unless a run asks for the overlay
matrix_option = cli.option(
    "--matrix",
    "matrix_choice",
    type=cli.Choice(["shipped", "updated"]),
    default="shipped",
    show_default=True,
    help="Compatibility data that decides: the snapshot shipped with this egpu-setup (the same "
    "on every machine), or `updated`: it plus what the last `matrix update` read.",
)


def complete_profile(incomplete: str) -> list[Completion]:
    """Tab completion for --profile: the names of shipped and local profiles, or a file path."""
    if "/" in incomplete or incomplete.startswith("."):
        return [("file", incomplete)]
    from egpu_setup.profile.search import available

    return [("plain", name) for name in sorted(available()) if name.startswith(incomplete)]


def echo_json(data: Any) -> None:
    """Print one JSON document on stdout."""
    cli.echo(json.dumps(data, indent=2, sort_keys=False))
