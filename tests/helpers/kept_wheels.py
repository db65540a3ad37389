"""The wheels egpu-setup keeps of itself, made for the Python the suite runs, as scripts/install.sh
makes them for /opt/egpu-setup/tool (egpu_setup/state/tool_wheels.py).

An editable install keeps none, and with none `install --root` refuses to put egpu-setup into an
image. So the suite's own venv gets them once per run, before the workers start: this checkout's
wheel as it is now, and the wheels it depends on from this machine's pip configuration, with
their sha256s in SHA256SUMS, where the running egpu-setup looks (sys.prefix).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from egpu_setup.state.tool_wheels import KEPT, SUMS

REPO = Path(__file__).resolve().parents[2]


def keep(cache: Path) -> Path:
    """Make sys.prefix/KEPT hold this checkout's wheel and its dependencies; return the folder.
    The dependencies are downloaded into `cache` once and copied from there."""
    folder = Path(sys.prefix) / KEPT
    done = cache / "kept-wheels.done"
    # once per run: a pytest started inside the run (test_design_doc collects the suite) shares
    # the cache and must not rebuild the wheels an image build is installing from
    if done.is_file() and done.read_text() == str(folder) and (folder / SUMS).is_file():
        return folder
    deps = cache / "tool-dependencies"
    deps.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    with tempfile.TemporaryDirectory(prefix="egpu-setup-kept-") as tmp:
        subprocess.run(
            [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp, str(REPO)],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        ours = next(Path(tmp).glob("egpu_setup-*.whl"))
        # for the Python of each distribution egpu-setup knows, as scripts/install.sh does
        for python in [None, *_pythons()]:
            which = ["--implementation", "cp", "--python-version", python] if python else []
            subprocess.run(
                [*pip, "download", "--only-binary=:all:", *which, "-d", str(deps), str(ours)],
                check=True, capture_output=True, timeout=300,
            )  # fmt: skip
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True, mode=0o755)
        for wheel in [ours, *(w for w in deps.glob("*.whl") if not w.name.startswith("egpu_"))]:
            shutil.copyfile(wheel, folder / wheel.name)
    sums = [
        f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n"
        for w in sorted(folder.glob("*.whl"))
    ]
    (folder / SUMS).write_text("".join(sums))
    done.write_text(str(folder))
    return folder


def _pythons() -> list[str]:
    """The Python of every distribution in egpu_setup/data/distros.yaml."""
    import yaml

    data = yaml.safe_load((REPO / "egpu_setup/data/distros.yaml").read_text())
    return sorted({d["python"] for d in data["distros"]})
