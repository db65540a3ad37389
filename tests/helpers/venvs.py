"""Child venvs for tests that run a target Python (verify, doctor --venv, record --venv).

A venv made with `--system-site-packages` sees the *base* interpreter's packages, not those of
the venv the tests run in: on a fresh machine the base has no torch, so such a child would not
have torch either. `make_venv(..., with_torch=True)` says explicitly where torch comes from: the
site-packages directory holding the torch this test run imports, named in a `.pth` file
(site(7): each line of a .pth file in site-packages is added to sys.path).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def torch_site_packages() -> Path:
    """The site-packages directory that holds the torch of this test run (ImportError if none)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise ImportError("torch is not installed in the test environment (see .ci/run)")
    return Path(spec.origin).resolve().parent.parent


def site_packages(venv: Path) -> Path:
    (path,) = venv.glob("lib/python*/site-packages")
    return path


def make_venv(path: Path, *, with_torch: bool, python: str = sys.executable) -> Path:
    """A fresh venv at `path` (no pip); with_torch makes this run's torch importable in it."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    if with_torch:
        (site_packages(path) / "egpu_setup_tests_torch.pth").write_text(
            f"{torch_site_packages()}\n"
        )
    return path
