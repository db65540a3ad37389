"""egpu-setup itself into a root-owned venv on the target (plan step InstallTool).

The units and helpers egpu-setup writes run the tool as root, so it must live where only root can
change it, and inside an image it must exist at all (the units pointed at the build
host's path). The recipe, measured on Debian 12 (about 15 s):

1. wheels for the target's Python: a bundle's tool/ directory as it is, or egpu-setup's wheel
   built from the running tool's source (`pip wheel --no-deps`, as `egpu-setup bundle` does)
   plus `pip download --only-binary=:all: --python-version X.Y` of what it depends on, through
   this machine's own pip configuration (its index or mirror);
2. `python3 -m venv VENV` by the target's own interpreter (an image's /usr/bin/python3, so the
   venv's pyvenv.cfg says `home = /usr/bin` inside the image);
3. `VENV/bin/python -m pip install --no-index --find-links DIR egpu-setup==VERSION`, the wheel
   directory bound read-only at /run/egpu-setup/wheels inside an image, pip's own configuration
   not read (PIP_CONFIG_FILE=/dev/null), umask 022.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from egpu_setup.errors import EgpuSetupError
from egpu_setup.execute.console import show_line
from egpu_setup.execute.files import Context, missing_parents
from egpu_setup.execute.undo import mark_venv
from egpu_setup.host.machine import Host, RootHost
from egpu_setup.log import get_logger
from egpu_setup.plan.steps import InstallTool

log = get_logger("egpu_setup.execute")

IMAGE_WHEELS = "/run/egpu-setup/wheels"
BUILD_TIMEOUT_S = 900


def tool_source() -> Path | None:
    """The source tree egpu-setup can be rebuilt from: this checkout (an editable install), or
    the local directory a `pip install DIR` came from (PEP 610 direct_url.json), if still there.
    None: fall back to this machine's pip index."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        return checkout
    from importlib.metadata import PackageNotFoundError, distribution
    from urllib.parse import unquote, urlsplit

    try:
        text = distribution("egpu-setup").read_text("direct_url.json")
        url = json.loads(text or "{}").get("url", "")
    except (PackageNotFoundError, ValueError, AttributeError):
        return None
    parts = urlsplit(url)
    if parts.scheme != "file":
        return None
    path = Path(unquote(parts.path))
    return path if (path / "pyproject.toml").is_file() else None


def target_python_version(host: Host, python: str) -> str:
    """X.Y of `python` on the target, from where its link resolves (python3 -> python3.11)."""
    import re

    real = host.resolve(python) or python
    m = re.search(r"python(3\.\d+)$", real)
    if not m or not host.exists(python):
        raise EgpuSetupError(
            f"no Python at {python} on {'the image' if host.kind == 'root' else 'this machine'}",
            "install python3 with its venv module there (Debian: apt-get install python3-venv)",
        )
    return m.group(1)


def build_wheels(dest: Path, version: str, python_version: str) -> list[Path]:
    """egpu-setup's wheel and its dependencies' wheels for `python_version`, into dest."""
    from egpu_setup.host.machine import LiveHost

    build = LiveHost()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    src = tool_source()
    if src is not None:
        argv = [*pip, "wheel", "--no-deps", "-w", str(dest), str(src)]
    else:
        argv = [*pip, "download", "--no-deps", "-d", str(dest), f"egpu-setup=={version}"]
    log.warning("egpu-setup %s: its wheel (%s)", version, f"from {src}" if src else "from pip")
    build.run_checked(argv, timeout=BUILD_TIMEOUT_S, on_line=show_line)
    ours = sorted(dest.glob("egpu_setup-*.whl"))
    if not ours:
        raise EgpuSetupError("no egpu-setup wheel was produced", "see the pip output above")
    log.warning("egpu-setup's dependencies for Python %s", python_version)
    build.run_checked(
        [*pip, "download", "--only-binary=:all:", "--implementation", "cp", "--python-version"]
        + [python_version, "-d", str(dest), str(ours[-1])],
        timeout=BUILD_TIMEOUT_S,
        on_line=show_line,
    )
    return sorted(dest.glob("*.whl"))


@contextlib.contextmanager
def _wheel_dir(step: InstallTool, python_version: str) -> Iterator[Path]:
    if step.wheels_from:
        yield Path(step.wheels_from)
        return
    with tempfile.TemporaryDirectory(prefix="egpu-setup-tool-") as tmp:
        os.chmod(tmp, 0o755)  # pip in the image runs as root, but keep it readable anyway
        build_wheels(Path(tmp), step.version, python_version)
        yield Path(tmp)


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def install(ctx: Context, step: InstallTool) -> tuple[str, str]:
    host = ctx.host
    version = target_python_version(host, step.python)
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    py = f"{step.venv}/bin/python"
    with _umask(0o022), _wheel_dir(step, version) as wheels:
        if step.create_venv or not host.exists(py):
            ctx.manifest.add_venv(step.venv, ctx.run_id, missing_parents(host, step.venv))
            ctx.manifest.save()
            host.run_checked([step.python, "-m", "venv", step.venv], on_line=show_line)
            mark_venv(host, step.venv, ctx.run_id)  # rollback --packages removes it
        bind = host.bound(wheels, IMAGE_WHEELS) if isinstance(host, RootHost) else _same(wheels)
        with bind as seen:
            argv = [py, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--upgrade"]
            argv += ["--find-links", str(seen), f"egpu-setup=={step.version}"]
            host.run_checked(argv, env=env, on_line=show_line, timeout=BUILD_TIMEOUT_S)
    return "done", f"Python {version}"


@contextlib.contextmanager
def _same(path: Path) -> Iterator[str]:
    yield str(path)
