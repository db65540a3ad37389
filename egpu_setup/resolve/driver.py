"""The driver decision: keep the installed one when it can stay, else the least risky branch.

The distribution's own package first, else NVIDIA's CUDA repository; never a branch that dropped
the GPU. WSL2: the Windows host owns the driver. Where no driver packages are known (Fedora,
Arch), a driver that drives the GPU stays, so torch must fit it or the request is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from egpu_setup.compat.matrix import (
    Distro,
    Matrix,
)
from egpu_setup.compat.versions import (
    DriverVersion,
    latest_of_branch,
)
from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import MatrixError
from egpu_setup.resolve.branches import DriverOption, driver_options, flavour_for
from egpu_setup.resolve.constraints import Constraints, branch_ok, requested_range
from egpu_setup.resolve.explain import explain_mixed, explain_newer, no_driver, why_not_distro
from egpu_setup.resolve.packages import packages_for
from egpu_setup.resolve.resolution import DriverPlan, Notes
from egpu_setup.resolve.target import Target
from egpu_setup.resolve.wheels import Candidate, allows, candidates, driver_floor


def wsl_driver(
    m: Matrix,
    cands: list[Candidate],
    installed: DriverVersion | None,
    target: Target | None,
    n: Notes,
) -> tuple[DriverPlan, Candidate]:
    n.reasons.append("WSL2: the Windows host owns the NVIDIA driver; only the pip side is planned")
    arch = target.arch if target else None
    if installed is None:
        chosen = cands[0]
        floor = driver_floor(chosen, arch, m, windows=True)
        # A CPU wheel needs no driver at all, and with no GPU known there is no floor to name.
        if floor is not None and chosen.variant.name != "cpu":
            n.warnings.append(
                "Windows driver version unknown (nvidia-smi in the guest gave none): torch "
                f"{chosen.label} needs a Windows NVIDIA driver >= {floor}"
            )
    else:
        if arch is not None and arch.first_driver is not None and installed < arch.first_driver:
            raise MatrixError(
                f"the Windows host driver {installed} predates {arch.name} support "
                f"(needs >= {arch.first_driver})",
                f"update the NVIDIA driver on Windows to >= {arch.first_driver}, then rerun",
            )
        if (
            arch is not None
            and arch.last_branch is not None
            and installed.branch > arch.last_branch
        ):
            n.warnings.append(
                f"the Windows host driver {installed} is newer than the last branch for "
                f"{arch.name} ({arch.last_branch}); if the GPU is missing in WSL, install a "
                f"{arch.last_branch} driver on Windows"
            )
        fitting = [x for x in cands if allows(x, installed, m, windows=True)]
        if not fitting:
            best = cands[0]
            floor = driver_floor(best, arch, m, windows=True)
            raise MatrixError(
                f"the Windows host driver {installed} is too old for torch {best.label} "
                f"(needs >= {floor})",
                f"update the NVIDIA driver on Windows to >= {floor}, "
                "or choose an older --torch/--cuda",
            )
        chosen = fitting[0]
        explain_newer(m, cands, chosen, installed, n, "the Windows host driver", windows=True)
    floor = driver_floor(chosen, arch, m, windows=True)
    plan = DriverPlan(
        installed=str(installed) if installed else None,
        action="host-managed",
        branch=installed.branch if installed else None,
        minimum=str(floor) if floor else None,
        flavour=None,
        packages=(),
        source="host",
    )
    return plan, chosen


def driver_unknown_gpu(
    m: Matrix, cands: list[Candidate], installed: DriverVersion | None, n: Notes
) -> tuple[DriverPlan, Candidate]:
    if installed is not None:
        fitting = [x for x in cands if allows(x, installed, m)]
        if not fitting:
            raise MatrixError(
                f"driver {installed} is too old for every matching torch wheel",
                f"torch {cands[0].label} needs >= {driver_floor(cands[0], None, m)}",
            )
        chosen = fitting[0]
        explain_newer(m, cands, chosen, installed, n, "the installed driver")
        action: Literal["keep", "host-managed"] = "keep"
        n.reasons.append(f"keeping driver {installed}: it runs torch {chosen.label}")
    else:
        chosen = cands[0]
        action = "host-managed"
        n.reasons.append("no NVIDIA GPU known: no driver is planned")
    floor = driver_floor(chosen, None, m)
    return (
        DriverPlan(
            installed=str(installed) if installed else None,
            action=action,
            branch=installed.branch if installed else None,
            minimum=str(floor) if floor else None,
            flavour=None,
            packages=(),
            source="host",
        ),
        chosen,
    )


@dataclass(frozen=True)
class DriverCase:
    """What the driver decision on Linux is made from (resolve() gathers it)."""

    matrix: Matrix
    candidates: tuple[Candidate, ...]  # every wheel that qualifies, best first
    installed: DriverVersion | None
    facts: HostFacts | None
    target: Target
    others: tuple[Target, ...]  # the machine's other NVIDIA GPUs
    distro: Distro | None  # whose packages the plan uses; None: no driver packages known
    distro_label: str | None
    python: str
    constraints: Constraints

    @property
    def loaded_flavour(self) -> Literal["open", "proprietary"] | None:
        """The module flavour the running driver has (a what-if --driver says nothing of it)."""
        if self.constraints.driver is not None or self.facts is None:
            return None
        flavour = self.facts.nvidia.module_flavour
        if flavour == "open":
            return "open"
        return "proprietary" if flavour == "proprietary" else None

    def runnable(self, driver: DriverVersion) -> list[Candidate]:
        return [x for x in self.candidates if allows(x, driver, self.matrix)]

    def floor(self, chosen: Candidate) -> str | None:
        floor = driver_floor(chosen, self.target.arch, self.matrix)
        return str(floor) if floor else None


def keep_blocker(
    case: DriverCase, installed: DriverVersion, *, branch_range: bool = True
) -> str | None:
    """Why the installed driver cannot stay for this GPU, or None when it can.

    `branch_range=False` leaves out the requested branch range: a wish we cannot act on where
    egpu-setup installs no driver (see keep_unmanaged)."""
    arch, c = case.target.arch, case.constraints
    name = case.target.gpu.name
    if c.driver_pin is not None and installed != DriverVersion.from_str(c.driver_pin):
        return (
            f"the profile pins driver {c.driver_pin} exactly (driver.pin); {installed} is installed"
        )
    if arch is not None:
        if arch.last_branch is not None and installed.branch > arch.last_branch:
            return (
                f"driver {installed} no longer drives {name}: {arch.name} support ends with the "
                f"{arch.last_branch} branch (newer drivers ignore the GPU)"
            )
        if arch.first_driver is not None and installed < arch.first_driver:
            return (
                f"driver {installed} is older than the first driver for {arch.name} "
                f"({arch.first_driver})"
            )
    flavour = case.loaded_flavour
    if arch is not None and flavour:
        if arch.needs_open and flavour == "proprietary":
            return f"{name} needs the open kernel modules; the proprietary ones are loaded"
        if not arch.open_modules and flavour == "open":
            return f"{name} needs the proprietary kernel modules; the open ones are loaded"
    if flavour and c.flavour in ("open", "proprietary") and flavour != c.flavour:
        return f"the profile asks for {c.flavour} kernel modules; {flavour} are loaded"
    if branch_range and not branch_ok(installed.branch, c):
        return f"driver branch {installed.branch} is outside the requested branch range"
    return None


def linux_driver(case: DriverCase, n: Notes) -> tuple[DriverPlan, Candidate]:
    """Keep the installed driver when it may stay, else install the least risky branch."""
    m, installed = case.matrix, case.installed
    explain_mixed(m, case.target, list(case.others), case.constraints, n)
    if (
        installed is not None
        and case.distro is None
        and keep_blocker(case, installed, branch_range=False) is None
    ):
        # No driver packages known here, so the plan cannot change a driver that drives the GPU:
        # torch must fit it (or the request is impossible), whatever branch was asked for.
        return keep_unmanaged(case, installed, n)
    if installed is not None:
        kept = _keep_installed(case, installed, n)
        if kept is not None:
            return kept
    if case.distro is None:
        return unsupported_distro(case, n)
    return _install(case, case.distro, n)


def _keep_installed(
    case: DriverCase, installed: DriverVersion, n: Notes
) -> tuple[DriverPlan, Candidate] | None:
    """The installed driver, when it drives the GPU and runs a wheel; else None and why not."""
    m, arch = case.matrix, case.target.arch
    blocker = keep_blocker(case, installed)
    fitting = case.runnable(installed)
    if blocker is None and fitting:
        chosen = fitting[0]
        n.reasons.append(
            f"keeping driver {installed}: it drives {case.target.gpu.name} "
            f"and runs torch {chosen.label}"
        )
        cands = list(case.candidates)
        explain_newer(m, cands, chosen, installed, n, "the installed driver", upgrade_hint=True)
        return _kept(case, installed, chosen), chosen
    if blocker:
        n.reasons.append(blocker)
    elif not fitting:
        best = case.candidates[0]
        n.reasons.append(
            f"driver {installed} runs none of the matching wheels "
            f"(torch {best.label} needs >= {driver_floor(best, arch, m)})"
        )
    return None


def _install(case: DriverCase, distro: Distro, n: Notes) -> tuple[DriverPlan, Candidate]:
    """The first branch (distribution's archive first, then NVIDIA's repository) that drives the
    GPU and runs one of the wheels; MatrixError naming why none does."""
    m, c, target = case.matrix, case.constraints, case.target
    cands = list(case.candidates)
    for option in driver_options(m, distro, target, list(case.others), c):
        fitting = [x for x in cands if allows(x, option.version, m)]
        if not fitting:
            continue
        chosen = fitting[0]
        # A what-if distro is not this machine: its kernel says nothing about that one's flavour.
        kernel = None if c.distro or case.facts is None else case.facts.os.kernel
        pkgs, components, repo = packages_for(m, distro, option, kernel, n)
        _explain_option(case, distro, option, chosen, n)
        plan = DriverPlan(
            installed=str(case.installed) if case.installed else None,
            action=_action(case.installed, option, n),
            branch=option.branch,
            minimum=case.floor(chosen),
            flavour=option.flavour,
            packages=pkgs,
            source=option.source,
            apt_components=components,
            repo=repo,
        )
        return plan, chosen
    if c.driver_pin is not None:
        raise pin_unavailable(distro, c.driver_pin)
    err = no_driver(m, distro, target, cands, c)
    if distro.unplanned:
        # what this machine's archive lacks may be the very branch the card needs
        hint = f"{err.hint}; or plan for another distribution (--distro)" if err.hint else None
        raise MatrixError(f"{err.message} ({'; '.join(distro.unplanned)})", hint)
    raise err


def _explain_option(
    case: DriverCase, distro: Distro, option: DriverOption, chosen: Candidate, n: Notes
) -> None:
    m, target, arch = case.matrix, case.target, case.target.arch
    where = f"{distro.label}'s archive" if option.source == "distro" else "NVIDIA's CUDA repository"
    why = (
        f"driver branch {option.branch} ({option.flavour} modules) from {where}: it drives "
        f"{target.gpu.name} and runs torch {chosen.label}"
    )
    if option.source == "nvidia-repo":
        skipped = why_not_distro(m, distro, target, list(case.candidates), case.constraints)
        if skipped:
            why += f"; {skipped}"
    n.reasons.append(why)
    if option.flavour == "open" and arch is not None and arch.needs_open:
        n.reasons.append(f"{arch.name} needs the open kernel modules")
    elif option.flavour == "proprietary" and arch is not None and not arch.open_modules:
        n.reasons.append(f"{arch.name} is supported by the proprietary kernel modules only")
    explain_newer(
        m,
        list(case.candidates),
        chosen,
        option.version,
        n,
        f"branch {option.branch}",
        upgrade_hint=option.source == "distro",
    )


def _action(
    installed: DriverVersion | None, option: DriverOption, n: Notes
) -> Literal["install", "upgrade"]:
    if installed is None:
        return "install"
    if option.branch > installed.branch:
        return "upgrade"
    n.warnings.append(
        f"the installed driver {installed} will be replaced by branch {option.branch}"
    )
    return "install"


def pin_unavailable(distro: Distro, pin: str) -> MatrixError:
    """No source gives exactly the pinned driver (or the torch wheels need another)."""
    branch = int(pin.split(".")[0])
    archive = next((b.version for b in distro.branches if b.branch == branch), None)
    has = (
        f"{distro.label}'s archive has {archive} for branch {branch}"
        if archive
        else f"{distro.label}'s archive has no branch {branch}"
    )
    return MatrixError(
        f"the profile pins driver {pin} (driver.pin), and no source installs exactly it here: "
        f"{has}; NVIDIA's repository gives a branch's newest release, whichever that is",
        f"pin a version this archive has{f' ({archive})' if archive else ''}, or install "
        f"{pin} yourself first (an installed pinned driver is kept)",
    )


def keep_unmanaged(
    case: DriverCase, installed: DriverVersion, n: Notes
) -> tuple[DriverPlan, Candidate]:
    """The installed driver drives the GPU on a distribution we have no driver packages for.

    Same policy as WSL2 and the GPU-less case: the driver is managed outside egpu-setup, so the
    torch choice fits the installed driver, or the request is refused (exit 2) naming what the
    installed driver does run. Planning a wheel for a driver we cannot install left a torch that
    fails at `torch.cuda.is_available()`: a CUDA runtime needs at least the driver its minor
    version was released with (NVIDIA's CUDA Compatibility guide, "Minor Version Compatibility")."""
    m, c, target = case.matrix, case.constraints, case.target
    where = case.distro_label or "this distribution"
    fitting = case.runnable(installed)
    if not fitting:
        best = case.candidates[0]
        floor = driver_floor(best, target.arch, m)
        runs = [
            x
            for x in candidates(m, case.python, target, True, None, None)
            if allows(x, installed, m)
        ]
        hint = f"upgrade the NVIDIA driver to >= {floor} by hand and rerun"
        if runs:
            hint += (
                f", or ask for a torch driver {installed} runs: --torch {runs[0].label} "
                "(in place of --torch/--cuda)"
            )
        raise MatrixError(
            f"driver {installed} cannot run torch {best.label} (needs >= {floor}), and "
            f"egpu-setup installs no NVIDIA driver on {where}",
            hint,
        )
    chosen = fitting[0]
    if not branch_ok(installed.branch, c):
        n.reasons.append(
            f"{requested_range(c)} does not apply: egpu-setup installs no NVIDIA driver on "
            f"{where} (the driver is managed outside it), so torch is chosen for the installed "
            f"driver {installed}"
        )
        n.warnings.append(
            f"driver {installed} is kept although {requested_range(c)} was asked for: install "
            "that branch by hand, then rerun `egpu-setup resolve`"
        )
    n.reasons.append(
        f"keeping driver {installed}: it drives {target.gpu.name} and runs torch {chosen.label}"
    )
    explain_newer(m, list(case.candidates), chosen, installed, n, "the installed driver")
    return _kept(case, installed, chosen), chosen


def _kept(case: DriverCase, installed: DriverVersion, chosen: Candidate) -> DriverPlan:
    """The plan that keeps the installed driver (its loaded flavour, else the branch's)."""
    flavour = case.loaded_flavour or flavour_for(
        case.target.arch, installed.branch, case.constraints.flavour, case.matrix
    )
    return DriverPlan(
        installed=str(installed),
        action="keep",
        branch=installed.branch,
        minimum=case.floor(chosen),
        flavour=flavour,
        packages=(),
        source="host",
    )


def unsupported_distro(case: DriverCase, n: Notes) -> tuple[DriverPlan, Candidate]:
    """No driver packages known: the branch (or the pinned driver) to install by hand, and the
    torch it runs."""
    m, c, arch = case.matrix, case.constraints, case.target.arch
    pin = DriverVersion.from_str(c.driver_pin) if c.driver_pin else None
    branch = (
        pin.branch if pin else c.driver_branch or c.preferred_branch
    ) or m.nvidia_repo.recommended_branch
    if arch is not None and not arch.drives(branch) and pin is None:
        branch = arch.last_branch or branch
    cands = case.candidates
    chosen = next((x for x in cands if allows(x, pin or latest_of_branch(branch), m)), cands[0])
    floor = case.floor(chosen)
    flavour = flavour_for(arch, branch, c.flavour, m)
    what = f"driver {pin} (driver.pin)" if pin else f"driver branch {branch}"
    n.warnings.append(
        f"no driver packages known for {case.distro_label or 'this distribution'}: install NVIDIA "
        f"{what} ({flavour or 'open'} modules, >= {floor}) by hand; "
        "the torch side is resolved"
    )
    plan = DriverPlan(
        installed=str(case.installed) if case.installed else None,
        action="host-managed",
        branch=branch,
        minimum=floor,
        flavour=flavour,
        packages=(),
        source="host",
    )
    return plan, chosen
