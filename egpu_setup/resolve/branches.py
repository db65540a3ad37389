"""Driver branches that could serve the GPU: which module flavour each has, in preference order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from egpu_setup.compat.matrix import (
    Architecture,
    Distro,
    Matrix,
)
from egpu_setup.compat.versions import (
    DriverVersion,
    latest_of_branch,
)
from egpu_setup.resolve.constraints import Constraints, branch_ok
from egpu_setup.resolve.target import Target


def flavour_for(
    arch: Architecture | None, branch: int, wanted: str, matrix: Matrix
) -> Literal["open", "proprietary"] | None:
    """The kernel-module flavour for `branch` on this architecture, or None if none works."""
    proprietary_ok = branch < matrix.open_only_from_branch
    if arch is not None and arch.needs_open:
        return None if wanted == "proprietary" else "open"
    if arch is not None and not arch.open_modules:
        return None if wanted == "open" or not proprietary_ok else "proprietary"
    if wanted == "open":
        return "open"
    if wanted == "proprietary":
        return "proprietary" if proprietary_ok else None
    return "open" if branch >= matrix.open_default_from_branch else "proprietary"


def common_flavour(
    archs: Iterable[Architecture], branch: int, wanted: str, matrix: Matrix
) -> Literal["open", "proprietary"] | None:
    """A flavour that drives every architecture in `archs` on `branch`, or None."""
    archs = list(archs)
    if not all(a.drives(branch) for a in archs):
        return None
    flavours: tuple[Literal["open", "proprietary"], ...] = ("open", "proprietary")
    for flavour in flavours:
        if wanted in ("auto", flavour) and all(
            flavour_for(a, branch, flavour, matrix) == flavour for a in archs
        ):
            return flavour
    return None


@dataclass(frozen=True)
class DriverOption:
    source: Literal["distro", "nvidia-repo"]
    branch: int
    version: DriverVersion  # what the plan would install (a branch's newest when not known)
    flavour: Literal["open", "proprietary"]
    shared: bool  # also drives the machine's other NVIDIA GPUs


def driver_options(
    matrix: Matrix,
    distro: Distro | None,
    target: Target,
    others: list[Target],
    c: Constraints,
) -> list[DriverOption]:
    arch = target.arch
    other_archs = [o.arch for o in others if o.arch is not None]
    out: list[DriverOption] = []

    def add(source: Literal["distro", "nvidia-repo"], branch: int, version: str | None) -> None:
        if arch is not None and not arch.drives(branch):
            return
        if not branch_ok(branch, c):
            return
        flavour = flavour_for(arch, branch, c.flavour, matrix)
        if flavour is None:
            return
        shared_flavour = common_flavour(
            [a for a in [arch, *other_archs] if a], branch, c.flavour, matrix
        )
        if other_archs and shared_flavour is not None:
            flavour = shared_flavour
        dv = DriverVersion.from_str(version) if version else latest_of_branch(branch)
        out.append(
            DriverOption(source, branch, dv, flavour, not other_archs or shared_flavour is not None)
        )

    if distro is not None:
        ordered = sorted(
            distro.branches,
            key=lambda b: (
                b.branch != (c.preferred_branch or distro.recommended_branch),
                -b.branch,
            ),
        )
        for b in ordered:
            add("distro", b.branch, b.version)
        if distro.nvidia_repo:
            repo = matrix.nvidia_repo
            preferred = c.preferred_branch or repo.recommended_branch
            for branch in sorted(repo.branches, key=lambda b: (b != preferred, -b)):
                add("nvidia-repo", branch, None)
    # Shared options first (a mixed machine keeps every GPU driven when it can); stable otherwise.
    return sorted(out, key=lambda o: not o.shared)
