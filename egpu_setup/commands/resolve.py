"""`egpu-setup resolve`: which driver, CUDA variant and torch would be installed here, and why.

Without `--from` it detects this machine; every what-if flag overrides what was detected, so a lab
can plan a fleet from one laptop (or from CI) with no GPU attached."""

from __future__ import annotations

import click

from egpu_setup.commands._options import complete_profile, echo_json, from_option, json_option


@click.command(
    epilog="""\b
Examples:
  egpu-setup resolve                                   # this machine
  egpu-setup resolve --gpu 2b85 --driver 550.163.01    # an RTX 5090 on a 550 driver
  egpu-setup resolve --gpu "GTX 1080 Ti" --distro debian-12 --python 3.11 --json
  egpu-setup resolve --gpu 10de:2684 --platform wsl --driver 572.60
  egpu-setup resolve --profile rtx4090 --torch ">=2.9,<2.12" --cuda cu128
  egpu-setup resolve --from ./bug-report-bundle
"""
)
@json_option
@from_option
@click.option("--gpu", help="The eGPU: PCI id (10de:2b85 or 2b85) or a name ('RTX 5090').")
@click.option("--driver", "driver", metavar="VER", help="Installed NVIDIA driver, e.g. 550.163.01.")
@click.option("--distro", metavar="ID-VER", help="Distribution, e.g. ubuntu-24.04, debian-12.")
@click.option("--python", "python", metavar="X.Y", help="Target Python for the torch venv.")
@click.option(
    "--platform",
    type=click.Choice(["linux", "wsl"]),
    help="linux, or wsl (Windows owns the driver).",
)
@click.option(
    "--torch", "torch_spec", metavar="SPEC", help="torch version or specifier: 2.9.1, '>=2.7'."
)
@click.option("--cuda", metavar="VARIANT", help="Wheel variant: cu126, cu128, cu130, ... or cpu.")
@click.option(
    "--driver-branch", type=int, metavar="N", help="Use exactly this driver branch (580)."
)
@click.option(
    "--profile",
    "profile_name",
    shell_complete=complete_profile,
    metavar="NAME",
    help="A GPU profile (name or YAML file).",
)
def command(
    as_json: bool,
    from_dir: str | None,
    gpu: str | None,
    driver: str | None,
    distro: str | None,
    python: str | None,
    platform: str | None,
    torch_spec: str | None,
    cuda: str | None,
    driver_branch: int | None,
    profile_name: str | None,
) -> None:
    """Show what would be installed (driver, CUDA variant, torch wheel) and why."""
    from egpu_setup.resolve.constraints import constraints_from_profile
    from egpu_setup.resolve.resolver import resolve

    profile = None
    if profile_name:
        from egpu_setup.profile.load import load_profile

        profile = load_profile(profile_name)
    facts = _facts(from_dir)
    constraints = constraints_from_profile(
        profile,
        gpu=gpu,
        driver=driver,
        distro=distro,
        python=python,
        platform=platform,
        torch_spec=torch_spec,
        cuda=cuda,
        driver_branch=driver_branch,
    )
    resolution = resolve(facts, profile, constraints)
    if as_json:
        echo_json(resolution.to_json())
    else:
        click.echo(format_resolution(resolution))


def _facts(from_dir: str | None):  # -> HostFacts
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.host.machine import open_host

    return detect_host(open_host(from_dir))


def format_resolution(r) -> str:  # r: Resolution
    """The human view: three lines of answer, then why, then warnings."""
    d, t = r.driver, r.torch
    lines = []
    if r.gpu is None:
        lines.append("GPU      none known")
    else:
        ident = f" [{r.gpu.pci_id}]" if r.gpu.pci_id else ""
        lines.append(
            f"GPU      {r.gpu.name}{ident}, {r.gpu.architecture or 'architecture unknown'}, "
            f"compute capability {r.gpu.compute_capability or 'unknown'}"
        )
    if d.action == "keep":
        drv = f"keep {d.installed} ({d.flavour or 'unknown'} modules)"
    elif d.action == "host-managed":
        who = "the Windows host" if r.platform == "wsl" else "you"
        drv = f"managed by {who}" + (f", installed {d.installed}" if d.installed else "")
        if d.branch and r.platform != "wsl":
            drv += f", suggested branch {d.branch}"
    else:
        where = "NVIDIA CUDA repo" if d.source == "nvidia-repo" else f"{r.archive} archive"
        drv = f"{d.action} branch {d.branch} ({d.flavour} modules) from the {where}"
        if d.installed:
            drv += f", replacing {d.installed}"
    if d.minimum:
        drv += f"; needs >= {d.minimum}"
    lines.append(f"Driver   {drv}")
    if d.packages:
        lines.append(f"         apt install {' '.join(d.packages)}")
    if d.apt_components:
        lines.append(f"         apt components: {' '.join(d.apt_components)}")
    if d.repo is not None:
        lines.append(f"         repo {d.repo.url} (key {d.repo.fingerprint})")
    lines.append(f"Torch    {t.version}+{t.variant} for Python {r.python} ({r.platform})")
    lines.append(f"         pip install --index-url {t.index_url} {' '.join(t.requirements)}")
    if r.reasons:
        lines.append("")
        lines.append("Why")
        lines.extend(f"  - {reason}" for reason in r.reasons)
    if r.warnings:
        lines.append("")
        lines.append("Warnings")
        lines.extend(f"  ! {w}" for w in r.warnings)
    return "\n".join(lines)
