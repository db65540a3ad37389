"""A file in a bundle folder that the pinned manifest does not list is refused, never installed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from egpu_setup.bundle.format import MANIFEST, Manifest, verify_files
from egpu_setup.errors import EgpuSetupError


def test_an_unlisted_wheel_in_tool_is_refused_by_name(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.mkdir()
    ours = tool / "egpu_setup-1.0-py3-none-any.whl"
    ours.write_bytes(b"listed")
    entry = {
        "path": "tool/" + ours.name,
        "sha256": hashlib.sha256(b"listed").hexdigest(),
        "size": 6,
    }
    manifest = Manifest(tmp_path / MANIFEST, {"files": [entry]})
    assert verify_files(tmp_path, manifest, ["tool"]) == 6
    (tool / "packaging-99-py3-none-any.whl").write_bytes(b"import os  # a .pth payload")
    with pytest.raises(EgpuSetupError, match=r"tool/packaging-99-py3-none-any\.whl is not listed"):
        verify_files(tmp_path, manifest, ["tool"])
