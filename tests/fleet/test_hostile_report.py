"""Hostile: what a report file can do to `report`.

A report copied into another machine's folder, and clones sharing one hostname, are in
test_report_identity.py; here the machine id's hash and a file nested to blow the parser's
stack. The lab tree is the recorded one (tests/data/reports/lab, the Ansible fetch layout).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

LAB = Path(__file__).parents[1] / "data" / "reports" / "lab"


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_install_report_records_a_hash_of_the_machine_id(tmp_path: Path) -> None:
    from egpu_setup.host.identity import machine_id_sha256
    from egpu_setup.host.machine import RootHost

    (tmp_path / "etc").mkdir()
    assert machine_id_sha256(RootHost(tmp_path)) is None  # an image not booted yet has none
    (tmp_path / "etc/machine-id").write_text("4f9f1bd5f4f14b9f8e2c3b51a1d1b6a3\n")
    digest = machine_id_sha256(RootHost(tmp_path))
    assert digest is not None and len(digest) == 64 and "4f9f1bd5" not in digest


def test_one_deeply_nested_file_does_not_fail_the_whole_report(tmp_path: Path) -> None:
    tree = tmp_path / "fetched"
    shutil.copytree(LAB, tree)
    (tree / "lab-02/verify-20261130T000000Z.json").write_text("[" * 200_000 + "]" * 200_000)
    res = _report(str(tree), "--json")
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["hosts"]) == 6
    assert "nested too deeply" in res.stderr and "Traceback" not in res.stderr
