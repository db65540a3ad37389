"""Hostile: `report` files a report under the machine it was collected from, never the hostname
it claims.

Was: a report copied into lab-01's folder claiming to be lab-04, newer than lab-04's own, hid
lab-04's failure under `--strict`; laptops cloned from one image (one hostname) merged into one
row. The lab tree is the recorded one (tests/data/reports/lab, the Ansible fetch layout).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from egpu_setup.fleet.report import collect

LAB = Path(__file__).parents[1] / "data" / "reports" / "lab"


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_report_claiming_another_machine_cannot_hide_its_failure(tmp_path: Path) -> None:
    tree = tmp_path / "fetched"
    shutil.copytree(LAB, tree)
    before = {r.hostname: r.failures for r in collect([tree]).rows}
    assert before["lab-04"]  # lab-04 failed its verify
    forged = json.loads((tree / "lab-01/verify-20261127T101502Z.json").read_text())
    forged["host"]["hostname"] = "lab-04"  # lab-01's passing verify, now "lab-04's", and newer
    forged["time"] = "2026-11-30T12:00:00Z"
    (tree / "lab-01/verify-20261130T120000Z.json").write_text(json.dumps(forged))
    rows = {r.hostname: r for r in collect([tree]).rows}
    assert sorted(rows) == sorted(before)  # no row is made from a claim
    assert rows["lab-04"].failures == before["lab-04"]
    assert "verify-20261130T120000Z.json claims to be lab-04" in rows["lab-01"].failures
    res = _report(str(tree), "--strict")
    assert res.returncode == 1, res.stderr
    assert "claims to be lab-04" in res.stdout


def test_clones_sharing_a_hostname_are_told_apart_by_machine_id(tmp_path: Path) -> None:
    """Reports given without fetch folders: one hostname, two machine ids, two rows."""
    base = json.loads((LAB / "lab-06/install-20261127T112005Z.json").read_text())
    for i, machine in enumerate(("a" * 64, "b" * 64, "a" * 64)):
        doc = dict(base, machine_id=machine, time=f"2026-11-2{i + 1}T10:00:00Z")
        (tmp_path / f"install-2026112{i + 1}T100000Z.json").write_text(json.dumps(doc))
    names = [r.hostname for r in collect([tmp_path]).rows]
    assert names == ["lab-06 (machine aaaaaaaaaaaa)", "lab-06 (machine bbbbbbbbbbbb)"]


def test_the_install_report_records_a_hash_of_the_machine_id(tmp_path: Path) -> None:
    from egpu_setup.host.machine import RootHost
    from egpu_setup.install.report import machine_id

    (tmp_path / "etc").mkdir()
    assert machine_id(RootHost(tmp_path)) is None  # an image not booted yet has none
    (tmp_path / "etc/machine-id").write_text("4f9f1bd5f4f14b9f8e2c3b51a1d1b6a3\n")
    digest = machine_id(RootHost(tmp_path))
    assert digest is not None and len(digest) == 64 and "4f9f1bd5" not in digest


def test_one_deeply_nested_file_does_not_fail_the_whole_report(tmp_path: Path) -> None:
    tree = tmp_path / "fetched"
    shutil.copytree(LAB, tree)
    (tree / "lab-02/verify-20261130T000000Z.json").write_text("[" * 200_000 + "]" * 200_000)
    res = _report(str(tree), "--json")
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["hosts"]) == 6
    assert "nested too deeply" in res.stderr and "Traceback" not in res.stderr
