"""`egpu-setup mok-key new DIR`: a lab's Secure Boot module signing key (install/mok_key.py)."""

from __future__ import annotations

import sys

import click

from egpu_setup.commands._options import NonEmptyPath, echo_json, json_option


@click.group(
    "mok-key",
    epilog="""\b
Examples:
  sudo egpu-setup mok-key new /root/lab-mok        # asks for the one-time password twice
  printf '%s\\n' "$PW" | sudo egpu-setup mok-key new /root/lab-mok --password-stdin
  sudo egpu-setup install --profile lab --root /srv/image --mok-key /root/lab-mok --yes
""",
)
def command() -> None:
    """The lab's key DKMS signs an image's NVIDIA module with (install --root --mok-key)."""


@command.command(
    "new",
    epilog="""\b
Examples:
  sudo egpu-setup mok-key new /root/lab-mok
  printf '%s\\n' "$PW" | sudo egpu-setup mok-key new /root/lab-mok --password-stdin --json
\b
DIR gets mok.key (the private key, 0600), mok.der (its certificate, what each laptop enrols) and
mok.hash (the SHA-512 hash of the one-time password typed at MokManager; the password itself is
kept nowhere). Keep DIR: every image built with it is trusted by a laptop that enrolled it once.
\b
Exit codes: 0 made, 1 openssl failed, 2 bad input (DIR not empty, a bad password).
""",
)
@click.argument("directory", metavar="DIR", type=NonEmptyPath(file_okay=True))
@click.option(
    "--password-stdin",
    "from_stdin",
    is_flag=True,
    help="Read the one-time password from stdin's first line instead of asking for it.",
)
@click.option(
    "--name",
    default="egpu-setup lab module signing key",
    show_default=True,
    metavar="TEXT",
    help="The certificate's common name, as MokManager and `mokutil --list-enrolled` show it.",
)
@json_option
def new(directory: str, from_stdin: bool, name: str, as_json: bool) -> None:
    """Make a lab's module signing key, its certificate and the one-time password's hash in DIR
    (a new or empty directory, made 0700)."""
    from egpu_setup.install.mok_key import check_name, check_password, new_lab_key

    check_name(name)
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(
            "one-time MokManager password", hide_input=True, confirmation_prompt=True, err=True
        )
    lab = new_lab_key(directory, check_password(password), name)
    if as_json:
        echo_json(
            {
                "schema": "egpu-setup/mok-key/1",
                "directory": lab.directory,
                "certificate_sha256": lab.cert_sha256,
            }
        )
    else:
        click.echo(f"made the lab's key in {lab.directory} (certificate sha256 {lab.cert_sha256})")
        click.echo(f"next: egpu-setup install --root IMAGE --mok-key {lab.directory}")
