"""`egpu-setup venv PATH`: a user's own venv on the verified torch (install/user_venv.py)."""

from __future__ import annotations

import click

from egpu_setup.commands._options import NonEmptyPath, echo_json, json_option

EPILOG = """\b
Examples:
  egpu-setup venv ~/venvs/thesis              # as yourself, never with sudo
  ~/venvs/thesis/bin/pip install transformers # your packages go into your venv
  egpu-setup verify --venv ~/venvs/thesis     # check it
"""


@click.command("venv", epilog=EPILOG)
@click.argument("path", type=NonEmptyPath(file_okay=False))
@json_option
def command(path: str, as_json: bool) -> None:
    """Make a venv of your own that imports the verified, root-owned torch.

    Nothing is copied: the venv adds the torch venv's site-packages after its own, so what you
    pip install goes into your venv and wins, while torch (and the CUDA libraries it loads) stay
    pinned at the verified versions through the venv's pip.conf. With ipykernel in the venv a
    Jupyter kernel spec is installed for it. Run as the user who will own it; root is refused.
    Exit 0 when made, 2 when there is no verified torch venv, PATH is not empty, the Python
    differs from the torch venv's, or it is run as root.
    """
    from egpu_setup.install.user_venv import make_user_venv, summary

    made = make_user_venv(path)
    if as_json:
        echo_json(made.to_json())
    else:
        click.echo(summary(made))
