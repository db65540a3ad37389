"""`egpu-setup resolve`: which driver, CUDA variant and torch would be installed here, and why.

Without `--from` it detects this machine; every what-if flag overrides what was detected, so a lab
can plan a fleet from one laptop (or from CI) with no GPU attached. With all four of --gpu,
--driver, --distro and --python nothing is detected: the answer is about the machine the flags
describe (Linux unless --platform wsl), not this one, and comes without reading it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from egpu_setup.commands._options import (
    cuda_option,
    driver_branch_option,
    echo_json,
    from_option,
    json_option,
    matrix_option,
    profile_option,
    python_option,
    rocm_option,
    torch_option,
)

if TYPE_CHECKING:
    from egpu_setup.detect.facts import HostFacts


@click.command(
    epilog="""\b
Examples:
  egpu-setup resolve                                   # this machine
  egpu-setup resolve --gpu 2b85 --driver 550.163.01    # an RTX 5090 on a 550 driver
  egpu-setup resolve --gpu "GTX 1080 Ti" --distro debian-12 --python 3.11 --json
  egpu-setup resolve --gpu 10de:2684 --platform wsl --driver 572.60
  egpu-setup resolve --gpu "RTX 4090" --distro ubuntu-24.04 --python 3.12 --arch aarch64
  egpu-setup resolve --profile rtx4090 --torch ">=2.9,<2.12" --cuda cu128
  egpu-setup resolve --gpu "RX 7900 XTX" --distro ubuntu-24.04 --python 3.12 --rocm rocm7.2
  egpu-setup resolve --from ./bug-report-bundle
  egpu-setup resolve --matrix updated          # with what the last `matrix update` read
"""
)
@json_option
@from_option
@click.option(
    "--gpu",
    help="The eGPU: PCI id (10de:2b85, 2b85, 1002:744c) or a name ('RTX 5090', 'RX 7900 XTX').",
)
@click.option("--driver", "driver", metavar="VER", help="Installed NVIDIA driver, e.g. 550.163.01.")
@click.option("--distro", metavar="ID-VER", help="Distribution, e.g. ubuntu-24.04, debian-12.")
@python_option(
    "Target Python for the torch venv.",
)
@click.option(
    "--platform",
    type=click.Choice(["linux", "wsl"]),
    help="linux, or wsl (Windows owns the driver).",
)
@click.option(
    "--arch",
    "machine",
    type=click.Choice(["x86_64", "aarch64"], case_sensitive=False),
    help="CPU architecture (uname -m) to plan for: its wheels and packages.",
)
@torch_option("torch version or specifier: 2.9.1, '>=2.7'.")
@cuda_option("Wheel variant: cu126, cu128, cu130, ... or cpu.")
@rocm_option("An AMD GPU's torch ROCm variant: rocm7.1, rocm7.2, ...")
@driver_branch_option("Use exactly this driver branch (580).")
@profile_option("A GPU profile (name or YAML file).")
@matrix_option
def command(
    as_json: bool,
    from_dir: str | None,
    gpu: str | None,
    driver: str | None,
    distro: str | None,
    python: str | None,
    platform: str | None,
    machine: str | None,
    torch_spec: str | None,
    cuda: str | None,
    rocm: str | None,
    driver_branch: int | None,
    profile_name: str | None,
    matrix_choice: str,
) -> None:
    """Show what would be installed (driver, CUDA variant, torch wheel) and why.

    With --gpu, --driver, --distro and --python all given, nothing of this machine is read: the
    answer is for the machine they describe (Linux unless --platform wsl).
    """
    from egpu_setup.resolve.constraints import constraints_from_profile
    from egpu_setup.resolve.resolution import format_resolution
    from egpu_setup.resolve.resolver import resolve

    profile = None
    if profile_name:
        from egpu_setup.profile.load import load_profile

        profile = load_profile(profile_name)
    # Every fact detection would supply is given: plan for the described machine, unread.
    described = None not in (gpu, driver, distro, python)
    facts = None if described and from_dir is None else _facts(from_dir)
    constraints = constraints_from_profile(
        profile,
        gpu=gpu,
        driver=driver,
        distro=distro,
        python=python,
        platform=platform,
        machine=machine.lower() if machine else None,
        torch_spec=torch_spec,
        cuda=cuda,
        rocm=rocm,
        driver_branch=driver_branch,
    )
    from egpu_setup.compat.matrix import select_matrix

    resolution = resolve(facts, profile, constraints, select_matrix(matrix_choice))
    if as_json:
        echo_json(resolution.to_json())
    else:
        click.echo(format_resolution(resolution))


def _facts(from_dir: str | None) -> HostFacts:
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.host.machine import open_host

    return detect_host(open_host(from_dir))
