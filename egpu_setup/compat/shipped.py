"""The shipped data files (egpu_setup/data/*.yaml), read from their compiled JSON form.

The YAML is the source people edit; scripts/compile_data.py writes the same data as
egpu_setup/data/compiled/<name>.json, which the C JSON parser reads in well under a millisecond
where the YAML parser needs tens of milliseconds on every command's start (tests/compat/
test_data_compiled.py fails when the two disagree). `load(name)` reads one file once per process;
callers validate its rows into typed values.

Kept as compiled JSON rather than read with PyYAML at run time (even libyaml's CSafeLoader):
the 8 data files take 0.5 ms from JSON against 58 ms from YAML, plus 15 ms to import yaml.
"""

from __future__ import annotations

import functools
import json
import os

from egpu_setup.errors import MatrixError

TYPE_CHECKING = False  # typing costs 2 ms of every start; these names are for mypy only
if TYPE_CHECKING:
    from typing import Any

# The YAML sources, by the name callers use (and error messages show).
SOURCES = (
    "cuda.yaml",
    "distros.yaml",
    "drivers.yaml",
    "gpu_managers.yaml",
    "gpus.yaml",
    "known_issues.yaml",
    "pcie_tunnels.yaml",
    "rocm.yaml",
    "sleep.yaml",
    "torch.yaml",
)
COMPILED_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "compiled"
)


def compiled_path(name: str) -> str:
    """Where the compiled form of `name` ("cuda.yaml") lies: compiled/cuda.json."""
    return os.path.join(COMPILED_DIR, os.path.splitext(name)[0] + ".json")


@functools.cache
def load(name: str) -> dict[str, Any]:
    """The top-level mapping of the shipped data file `name` ("cuda.yaml"), from its compiled form.

    Read once per process and shared by every caller: treat it as read-only. A missing or
    damaged file is a MatrixError (the installation is broken), never a traceback."""
    if name not in SOURCES:
        raise ValueError(f"not a shipped data file: {name}")
    # Read as a plain file next to this module, not through importlib.resources: the package
    # is always installed as files (pip, uv, scripts/install.sh), and importlib.resources costs
    # more import time than the read itself.
    path = compiled_path(name)
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError) as exc:
        raise MatrixError(
            f"egpu_setup/data/{name}: its compiled form {path} cannot be read: {exc}",
            "reinstall egpu-setup (in a checkout: python scripts/compile_data.py)",
        ) from exc
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, dict):
        raise MatrixError(
            f"egpu_setup/data/{name}: expected a mapping at the top of {path}",
            "reinstall egpu-setup (in a checkout: python scripts/compile_data.py)",
        )
    return data
