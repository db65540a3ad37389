"""`egpu-setup bundle`: download once what `install --bundle` needs on many laptops, offline."""

from __future__ import annotations

from pathlib import Path

import click

from egpu_setup.commands._options import (
    cuda_option,
    echo_json,
    index_url_option,
    json_option,
    matrix_option,
    only_option,
    profile_option,
    python_option,
    torch_option,
)
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.bundle")

EPILOG = """\b
Examples:
  sudo egpu-setup bundle --profile rtx4090 --out /srv/lab-bundle
  sudo egpu-setup bundle --profile rtx4090 --out lab --python 3.11 --python 3.12 \\
      --distro debian-12 --distro ubuntu-24.04
  egpu-setup bundle --profile rtx4090 --out cpu-bundle --cuda cpu --only torch,tool
  sudo egpu-setup bundle --profile lab.yaml --out lab --index-url https://mirror.lab/whl/cu128
\b
It prints the pin: the sha256 of the bundle's manifest.json (also in DIR/manifest.sha256).
Carry it to the laptops apart from the bundle (the inventory, a profile repository), then on
each laptop (no network needed):
  sudo egpu-setup install --bundle /srv/lab-bundle --bundle-sha256 HEX --yes
Running it again with the same inputs downloads nothing and keeps the same pin.
"""

PARTS = ("torch", "driver", "tool")


def _parts_of(text: str | None) -> frozenset[str]:
    from egpu_setup.plan.options import parse_only

    return parse_only(text, PARTS)


@click.command(epilog=EPILOG)
@profile_option("Profile name or path to a YAML file.", required=True)
@click.option(
    "--out", "out", required=True, metavar="DIR", help="Bundle directory (created or updated)."
)
@python_option("Target Python (repeatable).", "pythons", multiple=True)
@click.option(
    "--distro",
    "distros",
    multiple=True,
    metavar="ID-VER",
    help="Target distribution, e.g. debian-12 (repeatable; default: this machine's).",
)
@cuda_option("torch variant: cu128, ... or cpu.")
@torch_option("torch version, 2.9.1.")
@index_url_option("Lab mirror of the torch variant index.")
@only_option("torch,driver,tool")
@click.option("--refresh", is_flag=True, help="Download again even when the inputs are unchanged.")
@json_option
@matrix_option
def command(
    profile_name: str,
    out: str,
    pythons: tuple[str, ...],
    distros: tuple[str, ...],
    cuda: str | None,
    torch_spec: str | None,
    index_url: str | None,
    only: str | None,
    refresh: bool,
    as_json: bool,
    matrix_choice: str,
) -> None:
    """Build an offline bundle: torch wheelhouse with hashes, driver .debs, the tool, a manifest.

    Resolves every --python x --distro pair with the same resolver `install` uses (no hardware
    needed), then downloads: torch through the variant's index alone, its dependencies through
    this machine's pip configuration, the driver's .debs inside a debootstrap root of each
    distribution (needs root), and egpu-setup's own wheel for Ansible's `bundle` source.
    """
    from egpu_setup.bundle.builder import Builder, BuildOptions
    from egpu_setup.bundle.targets import host_distro, resolve_targets
    from egpu_setup.compat.index_url import check_index_url
    from egpu_setup.errors import UsageError
    from egpu_setup.host.machine import LiveHost
    from egpu_setup.profile.load import load_profile

    parts = _parts_of(only)
    if index_url:
        check_index_url(index_url)
    target_dir = Path(out)
    if target_dir.exists() and not target_dir.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory", "pass a directory")
    if (
        target_dir.is_dir()
        and any(target_dir.iterdir())
        and not (target_dir / "manifest.json").exists()
    ):
        raise UsageError(
            f"--out {out}: a non-empty directory that is not a bundle",
            "pass a new or empty directory, or an existing bundle to update",
        )
    profile = load_profile(profile_name)
    host = LiveHost()
    targets = resolve_targets(
        profile,
        list(pythons),
        list(distros) or [host_distro(host)],
        cuda=cuda,
        torch_spec=torch_spec,
        matrix_choice=matrix_choice,
    )
    report = Builder(
        host, profile, targets, BuildOptions(target_dir, index_url, parts, refresh)
    ).build()
    if as_json:
        echo_json(
            {"schema": "egpu-setup/bundle-build/1", "out": str(target_dir), **report.to_json()}
        )
        return
    click.echo(
        f"Bundle {target_dir}: {', '.join(report.targets)}; {report.files} files, "
        f"{report.total_bytes / 1e6:.1f} MB ({report.seconds:.1f} s)"
    )
    if report.downloaded:
        click.echo(f"  downloaded: {', '.join(report.downloaded)}")
    if report.reused:
        click.echo(f"  up to date: {', '.join(report.reused)}")
    click.echo(
        f"  pin: {report.manifest_sha256}  (the sha256 of manifest.json, also in "
        f"{target_dir / 'manifest.sha256'}; install with --bundle-sha256 {report.manifest_sha256})"
    )
