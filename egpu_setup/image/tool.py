"""Which egpu-setup the units and helpers run, and the steps that put it there.

They run it as root, at boot and on every plug-in, so never a path a user can change
(docs/design.md, "Root safety", rule 1), and in an image never the build host's:

- `--root IMAGE`: always /opt/egpu-setup/tool/bin/egpu-setup inside the image, installed there
  for the image's own Python (plan step InstallTool) from the wheels egpu-setup keeps of itself
  or a pinned bundle's (state/tool_wheels.py), with /usr/local/bin/egpu-setup linked to it for
  people at the console;
- on the running system: the running egpu-setup when root owns it and everything it is made of
  (host/trust.py), else the same /opt/egpu-setup/tool, installed there when it does not
  hold this version (a pipx or uv venv in a home directory is the case this is for).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host
from egpu_setup.plan.steps import AptInstall, CreateLink, InstallTool, Step
from egpu_setup.state.paths import TOOL_BIN, TOOL_VENV
from egpu_setup.state.tool_wheels import KeptWheels

TOOL_LINK = "/usr/local/bin/egpu-setup"
SYSTEM_PYTHON = "/usr/bin/python3"
# Debian and Ubuntu ship venv's ensurepip apart from python3 (and minbase has no python3 at
# all); the package that brings both (Debian python3-venv: "venv module for python3").
VENV_PACKAGE = "python3-venv"


@dataclass(frozen=True)
class ToolChoice:
    """The egpu-setup the units run, and the steps that make it exist (none: it is there)."""

    path: str
    steps: tuple[Step, ...]
    note: str | None = None


def choose_tool(
    target: Host,
    facts_os_id: str | None,
    *,
    bundle_tool: KeptWheels | None = None,
    argv0: str | None = None,
    lock_timeout: int = 600,
) -> ToolChoice:
    """Where the units point, and what to install for it (module docstring)."""
    from egpu_setup import __version__
    from egpu_setup.host.trust import running_tool_problem
    from egpu_setup.render.files import entry_point_path

    argv0 = sys.argv[0] if argv0 is None else argv0
    if target.kind != "root":
        running = entry_point_path(argv0) or _venv_script()
        why = running_tool_problem(running) if running else "egpu-setup runs without its script"
        if running and why is None:
            return ToolChoice(running, ())
        note = (
            f"the units run {TOOL_BIN}, not this egpu-setup ({why}): root must not run what a "
            "user can change"
        )
        if _holds(target, __version__):
            return ToolChoice(TOOL_BIN, (), note)
        steps = _install_steps(target, facts_os_id, bundle_tool, lock_timeout)
        return ToolChoice(TOOL_BIN, steps, note if steps else f"{note}; {_no_python(target)}")
    image_steps: list[Step] = []
    missing: str | None = None
    if not _holds(target, __version__):
        image_steps += _install_steps(target, facts_os_id, bundle_tool, lock_timeout)
        if not image_steps:
            missing = _no_python(target)
    if target.readlink(TOOL_LINK) != TOOL_BIN:
        image_steps.append(
            CreateLink(
                TOOL_LINK,
                TOOL_BIN,
                "egpu-setup on PATH inside the image (the units call the venv directly)",
                conflict=target.readlink(TOOL_LINK) is None and target.exists(TOOL_LINK),
            )
        )
    return ToolChoice(TOOL_BIN, tuple(image_steps), missing)


def _no_python(target: Host) -> str:
    where = "the image" if target.kind == "root" else "this machine"
    return (
        f"{where} has no {SYSTEM_PYTHON} and egpu-setup knows no package for one there: "
        f"{TOOL_BIN}, which the units run, is not installed; install python3 (with its venv "
        "module) and run this again"
    )


def _venv_script() -> str | None:
    """`python -m egpu_setup` from a venv: that venv's console script, if it has one."""
    from pathlib import Path

    script = Path(sys.executable).parent / "egpu-setup"
    return str(script) if script.is_file() else None


def _holds(target: Host, version: str) -> bool:
    """The tool venv on the target has this version of egpu-setup installed."""
    from egpu_setup.plan.installed import venv_versions

    return (venv_versions(target, TOOL_VENV) or {}).get("egpu-setup") == version and target.exists(
        TOOL_BIN
    )


def needs_venv_package(target: Host, python: str = SYSTEM_PYTHON) -> bool:
    """The target's python3 is missing, or has no ensurepip for `python -m venv` to seed pip."""
    real = target.resolve(python)
    if not real or not target.exists(python):
        return True
    version = real.rsplit("python", 1)[-1]
    return not target.exists(f"/usr/lib/python{version}/ensurepip/__init__.py")


def venv_package_step(target: Host, os_id: str | None, lock_timeout: int) -> Step | None:
    """apt-get install python3-venv where the target is Debian-like and lacks it; None else."""
    if (os_id or "").lower() not in ("debian", "ubuntu") or not needs_venv_package(target):
        return None
    return AptInstall(
        (VENV_PACKAGE,),
        no_install_recommends=True,
        lock_timeout=lock_timeout,
        reason="Python with its venv module, for egpu-setup's own venv",
        for_part="config",
    )


def _install_steps(
    target: Host, os_id: str | None, bundle_tool: KeptWheels | None, lock_timeout: int
) -> tuple[Step, ...]:
    from egpu_setup import __version__
    from egpu_setup.state import tool_wheels

    wheels = bundle_tool or tool_wheels.own()
    if wheels is None:
        where = "the image" if target.kind == "root" else TOOL_VENV
        raise UsageError(
            f"egpu-setup must put itself into {where} and this one keeps no wheels of its own "
            f"(root-owned, in {sys.prefix}/{tool_wheels.KEPT}): root installs no source tree and "
            "no egpu-setup fetched by name",
            "install egpu-setup with `sudo bash scripts/install.sh` (it keeps them), or pass "
            "--bundle DIR of a bundle built with its tool part",
        )

    steps: list[Step] = []
    venv = venv_package_step(target, os_id, lock_timeout)
    if venv is not None:
        steps.append(venv)
    elif not target.exists(SYSTEM_PYTHON):
        return ()  # nothing to make the venv with, and no package egpu-setup knows: said by note
    steps.append(
        InstallTool(
            venv=TOOL_VENV,
            version=__version__,
            python=SYSTEM_PYTHON,
            create_venv=not target.exists(f"{TOOL_VENV}/pyvenv.cfg"),
            wheels_from=wheels.directory,
            wheels=wheels.files,
            reason="the program the units and helpers run as root",
        )
    )
    return tuple(steps)
