"""Hostile: `render --out DIR` writes inside DIR only.

How each attack is planted and checked: tests/helpers/sentinel.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import RunCli
from helpers.sentinel import TB4, UDEV, Sentinel, clean_error

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks run as root")


# -- render --out DIR ---------------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["etc", "etc/udev", "etc/udev/rules.d"])
def test_render_does_not_follow_a_directory_link_planted_in_out(
    cli: RunCli, tmp_path: Path, sentinel: Sentinel, planted: str
) -> None:
    out = tmp_path / "out"
    link = out / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(sentinel.directory)
    res = cli("render", "--profile", "rtx4090", "--out", str(out), "--from", str(TB4))
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert f"{link} is a symbolic link" in res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    assert not (out / "usr/local/bin/egpu-hotplug").exists()  # nothing written at all


def test_render_replaces_a_file_link_planted_in_out(
    cli: RunCli, tmp_path: Path, sentinel: Sentinel
) -> None:
    out = tmp_path / "out"
    (out / UDEV).parent.mkdir(parents=True)
    (out / UDEV).symlink_to(sentinel.sudoers)
    res = cli("render", "--profile", "rtx4090", "--out", str(out), "--from", str(TB4))
    assert res.returncode == 0, res.stderr
    assert not (out / UDEV).is_symlink()
    assert sentinel.unchanged(), sentinel.changes()
