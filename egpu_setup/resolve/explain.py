"""What the resolver says beside its choice: what a newer driver would unlock, and why not."""

from __future__ import annotations

from egpu_setup.compat.matrix import (
    Distro,
    Matrix,
)
from egpu_setup.compat.versions import (
    DriverVersion,
    latest_of_branch,
)
from egpu_setup.errors import MatrixError
from egpu_setup.resolve.branches import common_flavour, flavour_for
from egpu_setup.resolve.constraints import Constraints, branch_ok
from egpu_setup.resolve.resolution import Notes
from egpu_setup.resolve.target import Target
from egpu_setup.resolve.wheels import Candidate, allows, driver_floor


def why_not_distro(
    m: Matrix, distro: Distro, target: Target, cands: list[Candidate], c: Constraints
) -> str:
    arch = target.arch
    reasons = []
    for b in distro.branches:
        if arch is not None and not arch.drives(b.branch):
            reasons.append(f"{distro.label}'s {b.branch} does not drive {arch.name}")
        elif not branch_ok(b.branch, c):
            reasons.append(f"{distro.label}'s {b.branch} is outside the requested branches")
        elif flavour_for(arch, b.branch, c.flavour, m) is None:
            reasons.append(f"{distro.label}'s {b.branch} lacks the needed module flavour")
        else:
            dv = DriverVersion.from_str(b.version) if b.version else latest_of_branch(b.branch)
            if not any(allows(x, dv, m) for x in cands):
                reasons.append(
                    f"{distro.label}'s {b.branch} is too old for the requested torch "
                    f"({cands[0].label} needs >= {driver_floor(cands[0], arch, m)})"
                )
    return "; ".join(dict.fromkeys(reasons))


def no_driver(
    m: Matrix, distro: Distro, target: Target, cands: list[Candidate], c: Constraints
) -> MatrixError:
    arch = target.arch
    name = f"{target.gpu.name} ({arch.name if arch else 'unknown architecture'})"
    if c.driver_branch is not None:
        if arch is not None and not arch.drives(c.driver_branch):
            last = (
                f"the last branch for {arch.name} is {arch.last_branch}"
                if arch.last_branch
                else f"{arch.name} needs >= {arch.first_driver}"
            )
            return MatrixError(
                f"driver branch {c.driver_branch} does not drive {name}",
                f"{last}; use --driver-branch {arch.last_branch or 580}",
            )
        if flavour_for(arch, c.driver_branch, c.flavour, m) is None:
            return MatrixError(
                f"driver branch {c.driver_branch} has no {c.flavour} kernel modules for {name}",
                "change the profile's driver flavour or the branch",
            )
        floor = driver_floor(cands[0], arch, m)
        return MatrixError(
            f"driver branch {c.driver_branch} cannot run torch {cands[0].label} "
            f"(needs >= {floor}), or it is not packaged for {distro.label}",
            f"drop --driver-branch, or pick an older torch/--cuda; packaged branches: "
            f"{', '.join(str(b.branch) for b in distro.branches)} "
            f"(+ NVIDIA repo {', '.join(map(str, m.nvidia_repo.branches))})",
        )
    if (
        arch is not None
        and arch.last_branch is not None
        and c.min_branch
        and c.min_branch > arch.last_branch
    ):
        return MatrixError(
            f"the profile asks for driver branch >= {c.min_branch}, "
            f"but {arch.name} support ends at {arch.last_branch}",
            f"set the profile's min_branch to {arch.last_branch} or lower",
        )
    if (
        arch is not None
        and c.flavour != "auto"
        and all(flavour_for(arch, b, c.flavour, m) is None for b in (570, 580))
    ):
        return MatrixError(
            f"{name} cannot use the {c.flavour} kernel modules",
            "set the profile's driver flavour to auto",
        )
    return MatrixError(
        f"no packaged driver branch for {distro.label} drives {name} within the constraints",
        "relax the driver branch limits or --torch/--cuda",
    )


def explain_newer(
    m: Matrix,
    cands: list[Candidate],
    chosen: Candidate,
    driver: DriverVersion,
    n: Notes,
    who: str,
    upgrade_hint: bool = False,
    windows: bool = False,
) -> None:
    """Say what a newer driver would unlock, when the driver is what holds torch back."""
    best = cands[0]
    if best is chosen or best.release.key <= chosen.release.key:
        return
    cv = m.cuda_variant(best.variant.name)
    floor = (cv.min_driver_windows if windows else cv.min_driver) if cv else None
    need = f">= {floor}" if floor else "a newer driver"
    tail = f" (use --driver-branch {max(floor.major, 580)})" if upgrade_hint and floor else ""
    n.reasons.append(
        f"torch {best.label} would need a driver {need}; {who} allows up to {chosen.label}{tail}"
    )


def explain_mixed(
    m: Matrix, target: Target, others: list[Target], c: Constraints, n: Notes
) -> None:
    for other in others:
        if other.arch is None or target.arch is None:
            continue
        branches = sorted({b.branch for b in m.branches}, reverse=True)
        shared = [b for b in branches if common_flavour([target.arch, other.arch], b, c.flavour, m)]
        if not shared:
            other_needs = (
                f"proprietary modules, up to {other.arch.last_branch}"
                if not other.arch.open_modules
                else "open modules"
            )
            n.warnings.append(
                f"no single driver branch drives both {other.gpu.name} ({other.arch.name}: "
                f"{other_needs}) "
                f"and {target.gpu.name} ({target.arch.name}: "
                f"{'open modules required' if target.arch.needs_open else 'open or proprietary'}): "
                f"this plan serves {target.gpu.name}; {other.gpu.name} will have no NVIDIA driver"
            )
