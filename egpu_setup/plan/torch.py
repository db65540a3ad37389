"""The torch planner: torch into a venv through exactly one index (or offline, from a bundle);
first python3.X-venv where the Python lacks ensurepip, and a half-made venv rebuilt."""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from egpu_setup.compat.index_url import check_index_url
from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host
from egpu_setup.plan.installed import VenvContents, venv_contents
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, PipInstall, Step
from egpu_setup.plan.venv import missing_venv_package, venv_state
from egpu_setup.resolve.resolution import Resolution

if TYPE_CHECKING:
    from packaging.requirements import Requirement


def torch_steps(
    resolution: Resolution,
    host: Host,
    options: PlanOptions,
    warnings: list[str],
    facts: HostFacts | None = None,
) -> list[Step]:
    torch = resolution.torch
    if torch is None or not torch.requirements:
        return []
    from packaging.requirements import InvalidRequirement, Requirement

    contents = venv_contents(host, options.venv)  # every RECORD read once, for all below
    half_made = venv_state(host, options.venv, contents.incomplete) == "half-made"
    installed = None if half_made else contents.versions
    missing: list[str] = []
    wanted: dict[str, Requirement] = {}
    for text in torch.requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise UsageError(f"torch requirement {text!r}: {exc}", "check --torch") from exc
        wanted[canonicalize_name(req.name)] = req
        have = (installed or {}).get(canonicalize_name(req.name))
        if have is None or not req.specifier.contains(have, prereleases=True):
            missing.append(text)
    repair = () if half_made else _repairs(contents, wanted, options.venv)
    if not missing and not repair:
        return []
    for text in repair:
        name = canonicalize_name(text.partition("==")[0])
        warnings.append(
            f"{options.venv}: {text} is damaged ({contents.damaged[name].why}): reinstalled"
        )
    if half_made:
        broken = contents.incomplete
        what = (
            ", ".join(f"{name}: {why}" for name, why in sorted(broken.items()))
            if broken
            else "pyvenv.cfg and bin/python, no pip, no bin/activate"
        )
        warnings.append(f"{options.venv} was left half-made by a failed run ({what}): rebuilt")
    b = options.bundle
    first = _venv_package_step(facts, host, resolution, options, installed is None)
    if b is not None:
        if b.find_links is None:
            return []
        return [
            *first,
            PipInstall(
                venv=options.venv,
                requirements=tuple(torch.requirements),
                index_url="",
                create_venv=installed is None,
                python=_python_for(resolution, host),
                run_as=_run_as(host, options, installed),
                reason=f"torch {torch.version} ({torch.variant}) from the bundle",
                find_links=b.find_links,
                requirements_file=b.requirements_file,
                rebuild_venv=half_made,
                download_timeout=options.download_timeout,
                requirements_sha256=b.requirements_sha256,
                repair=repair,
            ),
        ]
    index = check_index_url(options.index_url or torch.index_url)
    why = f"torch {torch.version} ({torch.variant})"
    return [
        *first,
        PipInstall(
            venv=options.venv,
            requirements=tuple(torch.requirements),
            index_url=index,
            create_venv=installed is None,
            python=_python_for(resolution, host),
            run_as=_run_as(host, options, installed),
            reason=why,
            rebuild_venv=half_made,
            download_timeout=options.download_timeout,
            repair=repair,
        ),
    ]


def _repairs(contents: VenvContents, wanted: dict[str, Requirement], venv: str) -> tuple[str, ...]:
    """NAME==VERSION of each damaged distribution (plan/installed.py: a file RECORD lists gone
    or short) that the requirements stand on, in a venv egpu-setup does not rebuild (not its
    own: a user's, or one root made by hand). pip calls such a venv's torch "already
    satisfied" and leaves it broken, so the step reinstalls exactly these, at the version
    there, before its normal install; one whose version the requirement does not want is
    replaced by that install anyway. A dist-info without RECORD cannot be reinstalled (pip
    uninstalls by RECORD first, and refuses): said, nothing changed."""
    damaged = contents.damaged_closure(wanted)
    for name, d in damaged.items():
        if not d.has_record:
            raise UsageError(
                f"{venv}: {d.info} has no RECORD, so pip can neither reinstall nor uninstall "
                f"{name} {d.version}; nothing was changed",
                f"remove that folder and {name}'s own files from the venv (or pass --venv "
                "NEW_PATH), then run again",
            )
    return tuple(
        f"{name}=={d.version}"
        for name, d in damaged.items()
        if name not in wanted or wanted[name].specifier.contains(d.version, prereleases=True)
    )


def _venv_package_step(
    facts: HostFacts | None,
    host: Host,
    resolution: Resolution,
    options: PlanOptions,
    creating: bool,
) -> list[Step]:
    """apt-get install python3.X-venv before a venv is made with a Python that lacks ensurepip
    (stock Debian/Ubuntu); offline, a clear error before anything changes."""
    package = missing_venv_package(facts, host, resolution.python) if creating else None
    if package is None:
        return []
    if options.bundle is not None:
        raise UsageError(
            f"Python {resolution.python} here has no ensurepip ({package} is not installed), "
            "and an offline bundle does not carry it; nothing was changed",
            f"install it from this machine's own sources first (sudo apt-get install {package}), "
            "then run this command again",
        )
    return [
        AptInstall(
            (package,),
            no_install_recommends=True,
            lock_timeout=options.apt_lock_timeout,
            reason=f"the venv needs ensurepip, which stock Debian/Ubuntu ship in {package}",
            for_part="torch",
        )
    ]


def _python_for(resolution: Resolution, host: Host) -> str:
    """The interpreter the venv is made with, by absolute path where the host can tell (a bare
    name would be looked up through a PATH, where an empty entry is the working directory)."""
    python = f"python{resolution.python}" if resolution.python else "python3"
    return host.which(python) or host.which("python3") or "python3"


def _run_as(host: Host, options: PlanOptions, installed: dict[str, str] | None) -> str | None:
    if options.sudo_user and options.sudo_uid not in (None, 0):
        owner = _owner(host, options.venv if installed is not None else _parent(options.venv))
        if owner == options.sudo_uid:
            return options.sudo_user  # never leave root-owned files in a user's venv
    return None


def _parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] or "/"


def _owner(host: Host, path: str) -> int | None:
    try:
        return host.real_path(path).stat().st_uid
    except OSError:
        return None
