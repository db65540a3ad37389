"""Hostile: links in a folder of reports a user can write (`report DIR`, run by an admin).

A report is read only from inside the folder it was found in: a link in its place to a file
of root's, or a machine's folder swapped for a link after the walk found its files, makes the
file a problem of its machine, never a read of what the link points to. The lab tree is the
recorded one (tests/data/reports/lab, the Ansible fetch layout)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from egpu_setup.fleet.load import find_folders, load_folder

LAB = Path(__file__).parents[1] / "data" / "reports" / "lab"
SECRET = "root-only-secret-4f9f1bd5"


def _secret_report(where: Path, name: str) -> Path:
    """A report-shaped file outside the fetched tree, as a file of root's would be."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / name
    path.write_text(json.dumps({"schema": "egpu-setup/verify/1", "hostname": SECRET}))
    path.chmod(0o600)
    return path


def test_a_report_that_is_a_link_to_roots_file_is_not_read(tmp_path: Path) -> None:
    tree = tmp_path / "fetched"
    shutil.copytree(LAB, tree)
    secret = _secret_report(tmp_path / "root-only", "verify-20261130T000000Z.json")
    (tree / "lab-02" / "verify-20261130T000000Z.json").symlink_to(secret)
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", "--json", str(tree)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in res.stderr
    assert SECRET not in res.stdout + res.stderr


def test_a_folder_swapped_for_a_link_after_the_walk_is_not_read_through(tmp_path: Path) -> None:
    """The walk (os.walk, no link followed) found lab-02's files; then lab-02 became a link to
    a folder of root's holding files of the same names. Was: each file was opened by path,
    checked only for being a link itself, so the swapped folder was read through."""
    tree = tmp_path / "fetched"
    shutil.copytree(LAB, tree)
    groups = {folder.name: (folder, base, files) for folder, base, files in find_folders([tree])}
    folder, base, files = groups["lab-02"]
    outside = tmp_path / "root-only"
    for f in files:
        _secret_report(outside, f.name)
    (tree / "lab-02").rename(tmp_path / "moved")
    (tree / "lab-02").symlink_to(outside)
    loaded = load_folder(folder, base, files)
    assert loaded.reports == ()
    assert {p.path for p in loaded.problems} == set(files)
    assert all("symbolic link" in p.reason for p in loaded.problems)
