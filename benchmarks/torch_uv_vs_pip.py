"""torch 2.13.0 CPU from a PEP 503 index on 127.0.0.1 into a fresh venv: uv vs pip, side by side.

Both go through the executor's own PipInstall step (same argv the installer runs), same local
index, a fresh venv per run, no installer cache (PIP_NO_CACHE_DIR / UV_NO_CACHE), and the timer
stops after `sync` so disk writeback is counted for both (docs/sources.md, "Measured here").

    python benchmarks/torch_uv_vs_pip.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.steps import PipInstall, Plan
from egpu_setup.state.paths import StatePaths
from helpers import pypi_index as _pypi_index


def one(installer: str, index: str, tmp: Path) -> float:
    venv = tmp / f"venv-{installer}"
    shutil.rmtree(venv, ignore_errors=True)
    step = PipInstall(str(venv), ("torch==2.13.0+cpu",), index, True, "python3")
    t = time.perf_counter()
    execute(
        Plan((step,)),
        LiveHost(),
        StatePaths.for_root(Path("/")),
        ExecOptions(installer=installer),
        lambda _t: None,
    )
    os.sync()
    elapsed = time.perf_counter() - t
    shutil.rmtree(venv)
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if shutil.which("uv") is None:
        print("uv is not on PATH (pip install uv)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        os.environ["EGPU_SETUP_STATE_DIR"] = str(Path(tmp) / "state")
        os.environ["PIP_NO_CACHE_DIR"] = "1"
        os.environ["UV_NO_CACHE"] = "1"
        wheels = _pypi_index.download_torch(_pypi_index.cache_dir())
        import logging

        logging.getLogger("egpu_setup").setLevel(logging.ERROR)
        with _pypi_index.LocalIndex(wheels) as idx:
            rows = []
            for r in range(args.rounds):
                sink = open(os.devnull, "w")  # noqa: SIM115 - installer output is not the result
                saved, sys.stderr = sys.stderr, sink
                try:
                    pip_s = one("pip", idx.url, Path(tmp))
                    uv_s = one("uv", idx.url, Path(tmp))
                finally:
                    sys.stderr = saved
                    sink.close()
                rows.append((pip_s, uv_s))
                ratio = pip_s / uv_s
                print(f"round {r + 1}: pip {pip_s:6.1f} s   uv {uv_s:6.1f} s   ratio {ratio:.1f}x")
    pip_best = min(p for p, _ in rows)
    uv_best = min(u for _, u in rows)
    ratio = pip_best / uv_best
    print(f"best: pip {pip_best:.1f} s, uv {uv_best:.1f} s, pip/uv = {ratio:.1f}x (goal >= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
