"""As root, profiles come from the shipped and system folders by name, and from a path only in a
tree root owns.

Was: under sudo, `~SUDO_USER/.config/egpu-setup/profiles/rtx4090.yaml` silently replaced the
shipped rtx4090 (its enclosure UUID authorized, its IOMMU requirement dropped); a profile named
by path was read from any folder.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.queues
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli
from egpu_setup.profile import search as profile_search

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is root's")

NOBODY = 65534
SHADOW = """\
name: rtx4090
description: a copy that authorizes another enclosure and drops the IOMMU check
gpu:
  device_ids: ["2684"]
  name: RTX 4090
  architecture: Ada Lovelace
  compute_capability: "8.9"
hotplug:
  enclosure_unique_id: 00000000-0000-0000-0000-0000000000ee
  accept_no_iommu: true
"""


def _env(tmp_path: Path) -> dict[str, str]:
    """Root's environment under `sudo -E`: HOME and XDG_CONFIG_HOME still the user's."""
    env = {k: v for k, v in os.environ.items() if k != profile_search.ENV_PATH}
    return {**env, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def _user_profiles(tmp_path: Path) -> Path:
    folder = tmp_path / "xdg/egpu-setup/profiles"
    folder.mkdir(parents=True)
    (folder / "rtx4090.yaml").write_text(SHADOW)
    (folder / "mine.yaml").write_text(SHADOW.replace("name: rtx4090", "name: mine"))
    for p in (tmp_path / "xdg", tmp_path / "xdg/egpu-setup", folder, *folder.iterdir()):
        os.chown(p, NOBODY, NOBODY)
    return folder


def test_as_root_a_users_folder_never_replaces_a_shipped_profile(tmp_path: Path) -> None:
    _user_profiles(tmp_path)
    res = run_cli("profiles", "show", "rtx4090", "--json", env=_env(tmp_path))
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["origin"] == "package", shown
    assert "0000000000ee" not in res.stdout
    listed = run_cli("profiles", "list", "--json", env=_env(tmp_path))
    assert "xdg" not in listed.stdout


def test_as_root_a_users_profile_by_name_is_unknown_with_a_hint(tmp_path: Path) -> None:
    _user_profiles(tmp_path)
    res = run_cli("profiles", "show", "mine", env=_env(tmp_path))
    assert res.returncode == 2
    assert res.stderr.startswith("error: unknown profile 'mine'\nhint: ")
    assert "as root only the shipped profiles and /etc/egpu-setup/profiles" in res.stderr


def test_as_root_a_profile_by_path_from_a_users_folder_is_refused(tmp_path: Path) -> None:
    folder = _user_profiles(tmp_path)
    res = run_cli("profiles", "check", str(folder / "mine.yaml"), env=_env(tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith(
        f"error: profile {folder / 'mine.yaml'}: {tmp_path / 'xdg'} is not root's, or others "
        "may write it"
    )
    assert "\nhint: copy it into a folder root owns" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("case", ["group-writable folder", "file of another user"])
def test_as_root_any_break_in_the_chain_refuses(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    path = folder / "mine.yaml"
    path.write_text(SHADOW.replace("name: rtx4090", "name: mine"))
    culprit = folder if case == "group-writable folder" else path
    if case == "group-writable folder":
        folder.chmod(0o775)
    else:
        os.chown(path, NOBODY, NOBODY)
    res = run_cli("profiles", "check", str(path))
    assert res.returncode == 2
    assert f"error: profile {path}: {culprit} is not root's" in res.stderr
    # the same tree, closed, is read
    folder.chmod(0o755)
    os.chown(path, 0, 0)
    ok = run_cli("profiles", "check", str(path))
    assert ok.returncode == 0, ok.stderr


def test_as_root_a_custom_search_folder_follows_the_rule_too(tmp_path: Path) -> None:
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "mine.yaml").write_text(SHADOW.replace("name: rtx4090", "name: mine"))
    os.chown(folder, NOBODY, NOBODY)
    res = run_cli("profiles", "show", "mine", env={profile_search.ENV_PATH: str(folder)})
    assert res.returncode == 2
    assert f"{folder} is not root's" in res.stderr


def _dirs_as_nobody(xdg: str, out: multiprocessing.queues.Queue[Any]) -> None:
    os.environ["XDG_CONFIG_HOME"] = xdg
    os.environ.pop(profile_search.ENV_PATH, None)
    os.setegid(NOBODY)
    os.seteuid(NOBODY)  # this forked child only; the modules are already imported
    out.put([(o, str(p)) for o, p in profile_search.search_dirs()])


def test_a_user_still_finds_their_own_profiles_by_name(tmp_path: Path) -> None:
    """Not root: the user's folder is searched (a forked child that is really nobody)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_dirs_as_nobody, args=(str(tmp_path), queue))
    child.start()
    dirs = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert [o for o, _ in dirs] == ["package", "system", "user"]
    assert dirs[2][1] == str(tmp_path / "egpu-setup/profiles")
