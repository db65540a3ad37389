"""`egpu-setup venv PATH`: a user's own venv on top of the root-owned, verified torch venv.

The mechanism: a venv made by the same base interpreter as the torch venv, with one `.pth` file
in its site-packages that calls `site.addsitedir` on the torch venv's site-packages (site(7),
https://docs.python.org/3/library/site.html). `addsitedir` *appends*, so the user's own
packages come first on sys.path and win; it also processes the torch venv's own `.pth` files,
which a bare path line would not. Nothing is copied and the torch venv stays root's: the user
can read and import it, never write it. `--system-site-packages` would be wrong: the torch venv
is not the system Python, and the system's packages are not what was verified.

The `.pth` only works for the same Python minor version (site-packages is per minor, and so are
compiled extensions), so a base interpreter whose minor differs from the torch venv's is refused.

torch stays the verified one: the venv's own pip.conf (pip reads `sys.prefix/pip.conf`,
https://pip.pypa.io/en/stable/topics/configuration/#location) names a constraints file that
pins torch and the libraries it loads (triton, nvidia-*) at the torch venv's versions, so
`pip install` of anything that wants another torch fails with pip's own conflict message instead
of shadowing the verified build with one nobody verified. A user who wants another torch makes a
plain venv.

Root never makes one: these venvs are the user's code, which root never runs (host/trust.py).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.host.machine import LiveHost
from egpu_setup.host.process import home_of
from egpu_setup.host.trust import owned_by_root
from egpu_setup.state.atomic import anchored, atomic_write
from egpu_setup.state.paths import STATE_DIR
from egpu_setup.state.reports import REPORTS, saved_reports

PTH_NAME = "egpu-setup-torch.pth"
CONSTRAINTS_NAME = "egpu-setup-constraints.txt"
# the distributions the verified build is: torch, its GPU compiler and the CUDA libraries
_PINNED = re.compile(r"(torch|triton|pytorch-triton.*|nvidia-.*)")
_SITE = re.compile(r"python3\.(\d+)")
VENV_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class TorchVenv:
    """The root-owned torch venv an install made: where, its base Python, its minor version."""

    path: str
    site_packages: str
    base_python: str
    minor: int
    report: str  # the install report that names it


@dataclass(frozen=True)
class UserVenv:
    """What `egpu-setup venv` made."""

    path: str
    torch_venv: str
    pinned: tuple[str, ...]  # "name==version" lines of the constraints file
    kernel_spec: str | None  # the Jupyter kernel spec's directory, None without ipykernel

    def to_json(self) -> dict[str, object]:
        return {
            "schema": "egpu-setup/venv/1",
            "venv": self.path,
            "torch_venv": self.torch_venv,
            "pinned": list(self.pinned),
            "kernel_spec": self.kernel_spec,
        }


def state_dir() -> str:
    """The system state (the torch venv is root's), or EGPU_SETUP_STATE_DIR where set (paths.py)."""
    return os.environ.get("EGPU_SETUP_STATE_DIR") or STATE_DIR


def parse_pyvenv(text: str) -> dict[str, str]:
    """pyvenv.cfg's keys (PEP 405: `key = value` lines), lower-cased."""
    keys = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            keys[key.strip().lower()] = value.strip()
    return keys


def torch_venv_of(report: dict[str, object]) -> str | None:
    """The venv the pip-install step of an install report put torch into, or None."""
    steps = report.get("steps")
    for step in steps if isinstance(steps, list) else []:
        if isinstance(step, dict) and step.get("kind") == "pip-install":
            venv = step.get("venv")
            if isinstance(venv, str) and venv.startswith("/"):
                return venv
    return None


def probe_torch_venv(host: LiveHost) -> TorchVenv:
    """The newest install report that installed torch and passed names the torch venv; it must
    be root's and closed to other users' writes. UsageError naming what is missing."""
    reports = f"{state_dir()}/{REPORTS}"
    found = None
    for data, path in reversed(saved_reports(host, [reports], "install")):
        venv = torch_venv_of(data)
        if venv is not None and data.get("ok") is True and data.get("verify_ok") is not False:
            found = (venv, path)
            break
    if found is None:
        raise UsageError(
            f"no verified torch venv installed: no install report in {reports} installed torch "
            "and passed",
            "ask an administrator to run `sudo egpu-setup install --profile NAME` first",
        )
    venv, report = found
    cfg = host.read(f"{venv}/pyvenv.cfg")
    sites = [f"{lib}/site-packages" for lib in host.glob(f"{venv}/lib", "python3.*")]
    sites = [site for site in sites if host.is_dir(site)]
    if cfg is None or len(sites) != 1:
        raise UsageError(
            f"the torch venv {venv} (named by {report}) is gone or not a venv",
            "ask an administrator to run the install again",
        )
    if not owned_by_root([venv, sites[0], f"{venv}/pyvenv.cfg"]):
        raise UsageError(
            f"the torch venv {venv} is not root's alone: a venv other users can change is not "
            "the verified one",
            "ask an administrator to run the install again",
        )
    keys = parse_pyvenv(cfg)
    base = keys.get("executable") or os.path.join(keys.get("home", ""), "python3")
    m = _SITE.search(os.path.basename(os.path.dirname(sites[0])))
    assert m is not None  # the glob above matched it
    return TorchVenv(venv, sites[0], base, int(m.group(1)), report)


def _python_minor(host: LiveHost, python: str) -> int | None:
    res = host.run([python, "-I", "-c", "import sys; print(sys.version_info[1])"], timeout=60)
    out = res.out.strip()
    return int(out) if res.rc == 0 and out.isdigit() else None


def check_target(host: LiveHost, path: Path) -> None:
    """PATH must not exist, or be an empty directory (nothing of the user's is overwritten)."""
    if host.readlink(str(path)) is not None or host.exists(str(path)):
        if host.readlink(str(path)) is not None or not host.is_dir(str(path)):
            raise UsageError(
                f"{path} exists and is not a directory", "name a new path for the venv"
            )
        if host.listdir(str(path)):
            raise UsageError(
                f"{path} exists and is not empty",
                "name a new path, or remove what is there first",
            )


def pinned_lines(host: LiveHost, venv: TorchVenv) -> tuple[str, ...]:
    """`name==version` for torch and the libraries it loads, as the torch venv has them."""
    out = []
    for info in host.glob(venv.site_packages, "*.dist-info"):
        name = version = None
        for line in (host.read(f"{info}/METADATA") or "").splitlines():
            if line.startswith("Name:"):
                name = line[5:].strip()
            elif line.startswith("Version:"):
                version = line[8:].strip()
            if not line or (name and version):
                break
        if name and version and _PINNED.fullmatch(name.lower().replace("_", "-")):
            out.append(f"{name}=={version}")
    return tuple(out)


def make_user_venv(target: str) -> UserVenv:
    """Make the user's venv at `target` on top of the torch venv (module docstring)."""
    if os.geteuid() == 0:
        raise UsageError(
            "egpu-setup venv makes a venv for the user who runs it, and root never runs a "
            "user's code",
            f"run it as that user, without sudo: egpu-setup venv {shlex.quote(target)}",
        )
    host = LiveHost()
    torch = probe_torch_venv(host)
    anchor, path = anchored(Path(target))
    check_target(host, path)
    minor = _python_minor(host, torch.base_python)
    if minor != torch.minor:
        have = f"Python 3.{minor}" if minor is not None else "no working Python"
        raise UsageError(
            f"the torch venv {torch.path} is for Python 3.{torch.minor}, but its base "
            f"interpreter {torch.base_python} is {have} now: its packages would not import",
            "ask an administrator to run the install again, which rebuilds the torch venv",
        )
    host.run_checked([torch.base_python, "-I", "-m", "venv", str(path)], timeout=VENV_TIMEOUT_S)
    site = path / "lib" / f"python3.{minor}" / "site-packages"
    pinned = pinned_lines(host, torch)
    # addsitedir, not a bare path line: the torch venv's own .pth files are processed too
    pth = f"import site; site.addsitedir({torch.site_packages!r})\n"
    atomic_write(site / PTH_NAME, pth.encode(), 0o644, anchor=anchor)
    constraints = path / CONSTRAINTS_NAME
    atomic_write(constraints, "".join(f"{p}\n" for p in pinned).encode(), 0o644, anchor=anchor)
    conf = f"[global]\nconstraint = {constraints}\n"
    atomic_write(path / "pip.conf", conf.encode(), 0o644, anchor=anchor)
    return UserVenv(str(path), torch.path, pinned, _kernel_spec(host, path))


def _kernel_spec(host: LiveHost, venv: Path) -> str | None:
    """A Jupyter kernel spec for the venv in the user's data directory, through ipykernel's own
    installer, where ipykernel imports in the venv; None otherwise."""
    python = str(venv / "bin" / "python")
    if host.run([python, "-I", "-c", "import ipykernel"], timeout=120).rc != 0:
        return None
    name = "egpu-" + re.sub(r"[^a-z0-9._-]+", "-", venv.name.lower()).strip("-.")
    home = home_of(os.getuid())
    argv = [python, "-I", "-m", "ipykernel", "install", "--user", "--name", name]
    argv += ["--display-name", f"Python ({venv.name}, egpu-setup torch)"]
    res = host.run(argv, env={"HOME": home}, timeout=120)
    if res.rc != 0:
        raise EgpuSetupError(
            f"ipykernel could not install the kernel spec: {res.err.strip()[-300:]}",
            f"the venv itself is ready; try `{python} -m ipykernel install --user`",
        )
    return f"{home}/.local/share/jupyter/kernels/{name}"


def summary(made: UserVenv) -> str:
    """What the user reads: where, on top of what, how to use it."""
    kernel = made.kernel_spec or (
        f"none (to add one: {made.path}/bin/pip install ipykernel, then "
        f"{made.path}/bin/python -m ipykernel install --user)"
    )
    lines = [
        f"venv: {made.path}",
        f"torch from: {made.torch_venv} (read-only, not copied)",
        f"pinned: {', '.join(made.pinned) or 'nothing'}",
        f"jupyter kernel: {kernel}",
        f"use: source {made.path}/bin/activate; check: egpu-setup verify --venv {made.path}",
    ]
    return "\n".join(lines)
