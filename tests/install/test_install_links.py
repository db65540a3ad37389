"""Managed links: display mode's Xorg link, unit links, and what happens when a file is in the way."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import FIXTURES
from helpers.cli_runner import invoke

TB4 = str(FIXTURES / "tb4-rtx4090-ubuntu2404")
XORG = "etc/X11/xorg.conf.d/90-egpu-setup.conf"
WANTS = "etc/systemd/system/multi-user.target.wants/egpu-setup-wait.service"


def install(img: Path, state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return invoke(
        "install", "--profile", "rtx4090", "--only", "config", "--root", str(img), "--from", TB4,
        "--yes", *extra, env={"EGPU_SETUP_STATE_DIR": str(state)},
    )  # fmt: skip


def test_display_mode_links_xorg_to_the_runtime_snippet_and_rolls_back(tmp_path: Path) -> None:
    img, state = tmp_path / "img", tmp_path / "state"
    img.mkdir()
    res = install(img, state, "--mode", "display")
    assert res.returncode == 0, res.stderr
    assert os.readlink(img / XORG) == "/run/egpu-setup/90-egpu-setup.conf"
    again = install(img, state, "--mode", "display", "--dry-run", "--json")
    assert json.loads(again.stdout)["steps"] == []  # a second run plans nothing
    back = invoke("rollback", "--yes", "--root", str(img), env={"EGPU_SETUP_STATE_DIR": str(state)})
    assert back.returncode == 0, back.stderr
    assert not os.path.lexists(img / XORG) and not os.path.lexists(img / WANTS)


def test_a_regular_file_where_a_unit_link_goes_is_a_conflict(tmp_path: Path) -> None:
    img, state = tmp_path / "img", tmp_path / "state"
    (img / WANTS).parent.mkdir(parents=True)
    (img / WANTS).write_text("# the admin's own unit copy\n")
    res = install(img, state)
    assert res.returncode == 1 and "hint: " in res.stderr
    assert (img / WANTS).read_text() == "# the admin's own unit copy\n"
    assert not (img / "etc/udev/rules.d/71-egpu-setup.rules").exists()  # nothing was changed
    forced = install(img, state, "--force")
    assert forced.returncode == 0, forced.stderr
    assert os.path.islink(img / WANTS)
    back = invoke("rollback", "--yes", "--root", str(img), env={"EGPU_SETUP_STATE_DIR": str(state)})
    assert back.returncode == 0, back.stderr
    assert (img / WANTS).read_text() == "# the admin's own unit copy\n"
