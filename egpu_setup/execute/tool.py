"""egpu-setup itself into a root-owned venv on the target (plan step InstallTool).

The units and helpers egpu-setup writes run the tool as root, so it must live where only root can
change it, and inside an image it must exist at all (the units pointed at the build
host's path). The recipe, measured on Debian 12 (about 15 s):

1. the wheels the plan names (egpu-setup's own and its dependencies', install/tool_wheels.py),
   copied into a private directory, each file's sha256 checked on the bytes copied, and a
   requirements file that pins each one by version and hash;
2. `python3 -m venv VENV` by the target's own interpreter (an image's /usr/bin/python3, so the
   venv's pyvenv.cfg says `home = /usr/bin` inside the image);
3. `VENV/bin/python -m pip install --no-index --require-hashes -r REQUIREMENTS --find-links DIR`,
   the copy bound read-only at /run/egpu-setup/wheels inside an image, pip's own configuration
   not read (PIP_CONFIG_FILE=/dev/null), umask 022.
"""

from __future__ import annotations

import contextlib
import os
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
from egpu_setup.state import tool_wheels

log = get_logger("egpu_setup.execute")

IMAGE_WHEELS = "/run/egpu-setup/wheels"
BUILD_TIMEOUT_S = 900
MAX_WHEEL = 256 << 20  # bytes: egpu-setup's dependencies are pure Python or small extensions


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


@contextlib.contextmanager
def private_copy(step: InstallTool, python: str) -> Iterator[Path]:
    """The wheels of `step` a Python `python` installs, in a directory only root can change,
    with `requirements.txt` pinning them: each read once without following a link, hashed, and
    compared with the sha256 the plan carries before it is written (a wheel swapped or added
    after the plan was made never reaches pip)."""
    from egpu_setup.host.machine import read_regular
    from egpu_setup.state.atomic import sha256

    usable = tool_wheels.for_python(step.wheels, python)
    if not any(w.name == "egpu-setup" for w in usable):
        raise EgpuSetupError(
            f"{step.wheels_from} holds no egpu-setup wheel for Python {python}: nothing was "
            "installed",
            f"build a bundle for that target (`egpu-setup bundle --only tool --python {python}`) "
            "and install with --bundle",
        )
    with tempfile.TemporaryDirectory(prefix="egpu-setup-tool-") as tmp:
        os.chmod(tmp, 0o755)  # read by pip in the image, as root; written by nobody else
        for wheel in usable:
            name, want = wheel.file, wheel.sha256
            source = Path(step.wheels_from) / name
            data = read_regular(source, MAX_WHEEL)
            got = sha256(data) if data is not None else "unreadable"
            if got != want:
                raise EgpuSetupError(
                    f"{source} is not the wheel the plan checked (sha256 {got[:16]}, expected "
                    f"{want[:16]}): nothing was installed",
                    "copy the bundle again, or reinstall egpu-setup with scripts/install.sh",
                )
            (Path(tmp) / name).write_bytes(data)  # type: ignore[arg-type]
        (Path(tmp) / "requirements.txt").write_text(tool_wheels.requirements(step.wheels, python))
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
    with _umask(0o022), private_copy(step, version) as wheels:
        if step.create_venv or not host.exists(py):
            ctx.manifest.add_venv(step.venv, ctx.run_id, missing_parents(host, step.venv))
            ctx.manifest.save()
            host.run_checked([step.python, "-m", "venv", step.venv], on_line=show_line)
            mark_venv(host, step.venv, ctx.run_id)  # rollback --packages removes it
        bind = host.bound(wheels, IMAGE_WHEELS) if isinstance(host, RootHost) else _same(wheels)
        with bind as seen:
            argv = [py, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--upgrade"]
            argv += ["--find-links", str(seen), "--require-hashes"]
            argv += ["-r", f"{seen}/requirements.txt"]
            host.run_checked(argv, env=env, on_line=show_line, timeout=BUILD_TIMEOUT_S)
    return "done", f"Python {version}"


@contextlib.contextmanager
def _same(path: Path) -> Iterator[str]:
    yield str(path)
