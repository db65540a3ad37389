"""Nothing heavy on the startup path: --help and detect never import torch, requests or jinja2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import FIXTURES

PROBE = """
import sys
sys.argv = ["egpu-setup", *{args!r}]
from egpu_setup.cli import main
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "requests", "jinja2", "numpy") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


def heavy_modules(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=list(args))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("HEAVY=")]
    assert line, res.stderr
    return line[-1].removeprefix("HEAVY=")


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("detect", "--json"),
        ("detect", "--help"),
        ("resolve", "--help"),
        ("doctor", "--help"),
    ],
    ids=lambda a: " ".join(a),
)
def test_startup_path_is_light(args: tuple[str, ...]) -> None:
    assert heavy_modules(*args) == ""


def test_detect_from_bundle_is_light() -> None:
    bundles = sorted(p for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []
    if not bundles:
        pytest.skip("no recorded hosts yet")
    assert heavy_modules("detect", "--json", "--from", str(bundles[0])) == ""
