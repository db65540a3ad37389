"""Faults and stand-ins for verify's child, planted in the TARGET venv (tests only).

verify runs its child in the user's venv, and whatever that venv's site-packages holds runs in
the child: that is a real input of verify, so the tests reach the child's faults through it and
shipped code reads no test variable. `plant(venv)` writes a `.pth` file (site(7): a line that
starts with `import` is executed at startup) that loads this module from tests/ by path;
`arm(venv, ...)` writes the control file next to it, read by every Python of that venv that
starts afterwards (the child, its DDP ranks):

- `scenario`: a recorded GPU (tests/helpers/cuda_recordings.py) replayed through torch.cuda by
  tests/helpers/cuda_standin.py once torch is imported;
- `hang`: the child sleeps for ever when that step starts (a CUDA call that never returns);
- `crash`: the child dies by SIGSEGV when that step starts (a crashing driver);
- `flood`: the child writes lines without end when that step starts, to fd 1 and to its record
  stream (a library that prints a warning per call, in a loop);
- `ddp_abort`: "after": DDP rank 1 aborts after the barrier (as gloo's teardown sometimes does
  under load); "before": it aborts in init_process_group, before it has a result;
- `env_dump`: a file the child writes its environment to (JSON), to show what it inherited.

Keep it to the standard library and Python 3.9 syntax: it runs in the target venv.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
CONTROL = "egpu_setup_test_faults.json"
PTH = "zz_egpu_setup_test_faults.pth"


def _site_packages(venv: Path) -> Path:
    (path,) = Path(venv).glob("lib/python*/site-packages")
    return path


def plant(venv: Path) -> Path:
    """Make every Python of `venv` load this module at startup; returns the venv."""
    control = _site_packages(venv) / CONTROL
    line = (
        "import importlib.util as u; "
        f"s = u.spec_from_file_location('egpu_setup_test_faults', {str(Path(__file__).resolve())!r}); "
        f"m = u.module_from_spec(s); s.loader.exec_module(m); m.startup({str(control)!r})\n"
    )
    (_site_packages(venv) / PTH).write_text(line)
    return venv


def arm(venv: Path, **faults: object) -> None:
    """The faults the next Pythons of `venv` apply (none: a plain run)."""
    given = {k: v for k, v in faults.items() if v is not None}
    (_site_packages(venv) / CONTROL).write_text(json.dumps(given))


# -- in the target venv --------------------------------------------------------------------------


def startup(control: str) -> None:
    try:
        with open(control, encoding="utf-8") as f:
            faults = json.load(f)
    except (OSError, ValueError):
        return
    if not faults:
        return
    dump = faults.get("env_dump")
    if dump and "--multiprocessing-fork" not in sys.argv:
        with open(dump, "w", encoding="utf-8") as f:
            json.dump(dict(os.environ), f)
    sys.meta_path.insert(0, _AfterTorch(faults))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs `_after_torch` once `import torch` has finished, wherever it is imported."""

    def __init__(self, faults: dict[str, Any]) -> None:
        self.faults = faults

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module
        faults = self.faults

        def exec_module(module: Any) -> None:
            run(module)
            _after_torch(module, faults)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # wraps torch's loader
        return spec


def _after_torch(torch: Any, faults: dict[str, Any]) -> None:
    scenario = faults.get("scenario")
    if scenario:
        spec = importlib.util.spec_from_file_location(
            "egpu_setup_test_cuda_standin", str(HERE / "cuda_standin.py")
        )
        assert spec is not None and spec.loader is not None  # a .py path always has both
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.install(torch, scenario)
    hang, crash, flood = faults.get("hang"), faults.get("crash"), faults.get("flood")
    main = sys.modules.get("__main__")
    out = getattr(main, "Out", None)
    if (hang or crash or flood) and out is not None:
        announce = out.step

        def step(self: Any, name: str) -> None:  # self: the child's Out
            announce(self, name)
            if name == hang:
                while True:  # a CUDA call that never returns
                    time.sleep(3600)
            if name == crash:
                os.kill(os.getpid(), signal.SIGSEGV)
            if name == flood:  # on what C code sees as stdout, and on the record stream
                line = "UserWarning: TF32 is off for this call, as it was for the last one\n"
                while True:
                    os.write(1, line.encode() * 64)
                    self._stream.write(line * 64)
                    self._stream.flush()

        out.step = step
    abort = faults.get("ddp_abort")
    if abort:
        import torch.distributed as dist

        if abort == "before":
            init = dist.init_process_group

            def init_process_group(*args: Any, **kwargs: Any) -> Any:
                if kwargs.get("rank") == 1:
                    os.abort()
                return init(*args, **kwargs)

            dist.init_process_group = init_process_group
        else:
            barrier = dist.barrier

            def after_barrier(*args: Any, **kwargs: Any) -> Any:
                result = barrier(*args, **kwargs)
                if dist.get_rank() == 1:
                    os.abort()  # what gloo's teardown abort looks like
                return result

            dist.barrier = after_barrier
