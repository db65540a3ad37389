"""Which machine a report is from: the folder the Ansible role
collected it into and the machine id every report records, never the claimed hostname alone.

Each hostile case builds its lab in a temp dir, laid out as the role fetches it
(<dest>/<inventory_hostname>/ with identity.json), and proves that no machine is merged into
another, none is split, and no copied report hides a failure under --strict. The machine id is
the one egpu_setup/host/identity.py computes, checked against the real `sha256sum`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.fleet.rows import collect
from egpu_setup.host.identity import machine_id_sha256
from egpu_setup.host.machine import RootHost
from helpers.fleet_reports import machine_id as mid
from helpers.fleet_reports import verify_report, write
from helpers.fleet_reports import write_identity as identity

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
LAB = Path(__file__).parents[1] / "data" / "reports" / "lab"


def report(hostname: str | None, machine_id: str | None, **kw: Any) -> dict[str, Any]:
    data = verify_report(hostname, **kw)
    data["machine_id_sha256"] = machine_id
    return data


def strict(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", *map(str, paths), "--strict", "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


# -- the machine id ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "valid"),
    [
        (b"4f1b6c2e9a0d4b7c8e5f3a2b1c0d9e8f\n", True),
        (b"uninitialized\n", False),  # an image before its first boot (machine-id(5))
        (b"", False),
        (b"4F1B6C2E9A0D4B7C8E5F3A2B1C0D9E8F\n", False),  # machine-id(5): lowercase
        (b"4f1b6c2e9a0d4b7c8e5f3a2b1c0d9e8f", False),  # not newline-terminated
    ],
)
def test_machine_id_hash_is_what_sha256sum_prints(
    tmp_path: Path, content: bytes, valid: bool
) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_bytes(content)
    got = machine_id_sha256(RootHost(tmp_path))
    if not valid:
        assert got is None
        return
    printed = subprocess.run(
        ["sha256sum", str(tmp_path / "etc/machine-id")], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    assert got == printed


def test_machine_id_missing_or_linked_out_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "img"
    (root / "etc").mkdir(parents=True)
    assert machine_id_sha256(RootHost(root)) is None
    outside = tmp_path / "host-machine-id"
    outside.write_bytes(b"4f1b6c2e9a0d4b7c8e5f3a2b1c0d9e8f\n")
    # an absolute link resolves inside the image, as it would after a chroot: never the host's
    os.symlink(str(outside), root / "etc/machine-id")
    assert machine_id_sha256(RootHost(root)) is None


def test_install_and_verify_reports_record_the_machine_id() -> None:
    from egpu_setup.verify.report import VerifyReport

    rep = VerifyReport((), {"type": "cpu"}, "py", None, {}, "finished", 0.0, 1.0, "h",
                       machine_id_sha256=mid(1))  # fmt: skip
    assert rep.to_json()["machine_id_sha256"] == mid(1)
    # the install report: tests/fleet/test_report_lab.py runs a real install and reads it back


# -- never merge, never split --------------------------------------------------------------------


def test_clones_with_one_hostname_and_one_machine_id_are_two_machines(tmp_path: Path) -> None:
    """Two laptops cloned from one image kept its hostname and its machine id: two inventory
    hosts, two folders, two rows; the failing one is not hidden behind the good one."""
    for name, ok in (("lab-07", True), ("lab-08", False)):
        identity(tmp_path / name, mid(7))
        write(tmp_path / name / "verify-1.json", report("debian", mid(7), ok=ok))
    rows = {r.machine: r for r in collect([tmp_path], now=NOW).rows}
    assert sorted(rows) == ["lab-07", "lab-08"]
    assert rows["lab-07"].ok and rows["lab-08"].status == "failed"
    assert {r.hostname for r in rows.values()} == {"debian"}
    assert not rows["lab-07"].flags  # a hostname that is not the inventory name is no claim
    assert strict(tmp_path).returncode == 1


def test_a_report_without_a_hostname_stays_with_its_machine(tmp_path: Path) -> None:
    """`install --json` carries no hostname; in its folder it is that machine's."""
    folder = tmp_path / "lab-10"
    identity(folder, mid(10))
    write(folder / "verify-20261128T100000Z.json", report("lab-10", mid(10)))
    data = json.loads((LAB.parent / "real/image-trixie/install-20261129T165800Z.json").read_text())
    write(folder / "install-20261127T100000Z.json", data)
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.machine == "lab-10" and row.ok and row.install == "changed"
    assert len(row.sources) == 2


def test_the_same_machine_folder_name_in_two_collections_is_told_apart(tmp_path: Path) -> None:
    write(tmp_path / "spring" / "lab-01" / "verify-1.json", report("lab-01", mid(1)))
    write(tmp_path / "autumn" / "lab-01" / "verify-1.json", report("lab-01", mid(2), ok=False))
    names = [r.machine for r in collect([tmp_path / "spring", tmp_path / "autumn"], now=NOW).rows]
    assert names == [f"lab-01 ({tmp_path / 'autumn' / 'lab-01'})",
                     f"lab-01 ({tmp_path / 'spring' / 'lab-01'})"]  # fmt: skip


def test_the_parent_of_a_collection_keeps_its_machines_apart(tmp_path: Path) -> None:
    """`report ansible/` instead of `report ansible/reports/`: the recorded lab (no
    identity.json) is six machines either way, never one row of reports claiming six hosts; a
    machine whose reports lie deeper (a fetch that kept the full path) stays one machine."""
    import shutil

    shutil.copytree(LAB, tmp_path / "ansible" / "reports")
    deep = tmp_path / "ansible" / "reports" / "lab-07" / "var/lib/egpu-setup/reports"
    write(deep / "verify-20261128T100000Z.json", report("lab-07", mid(7)))
    install = json.loads(
        (LAB.parent / "real/image-trixie/install-20261129T165800Z.json").read_text()
    )
    write(deep / "install-20261127T090000Z.json", install)
    direct = {r.machine: (r.status, r.sources and len(r.sources)) for r in collect([LAB]).rows}
    rows = {r.machine: r for r in collect([tmp_path / "ansible"], now=NOW).rows}
    assert sorted(rows) == [*sorted(direct), "lab-07"]
    assert {m: (r.status, len(r.sources)) for m, r in rows.items() if m in direct} == direct
    assert all(not r.flags for r in rows.values())
    assert rows["lab-07"].folder == str(tmp_path / "ansible" / "reports" / "lab-07")
    assert len(rows["lab-07"].sources) == 2


# -- claims that disagree with the folder ----------------------------------------------------------


def test_a_copied_report_cannot_hide_a_failure(tmp_path: Path) -> None:
    """lab-04 failed; someone copies a newer, passing report of lab-04 into lab-01's folder.
    lab-04 stays failed, lab-01 is suspect (the copy is set aside, its numbers unused), and
    --strict exits 1."""
    for n in (1, 4):
        identity(tmp_path / f"lab-0{n}", mid(n))
    write(
        tmp_path / "lab-01" / "verify-1.json", report("lab-01", mid(1), time="2026-11-28T10:00:00Z")
    )
    write(tmp_path / "lab-04" / "verify-1.json",
          report("lab-04", mid(4), ok=False, time="2026-11-28T10:00:00Z"))  # fmt: skip
    copy = report("lab-04", mid(4), time="2026-11-29T10:00:00Z")
    copy["checks"][1]["value"] = 9.99
    write(tmp_path / "lab-01" / "verify-2.json", copy)
    rows = {r.machine: r for r in collect([tmp_path], now=NOW).rows}
    assert rows["lab-04"].status == "failed"
    lab1 = rows["lab-01"]
    assert (lab1.status, lab1.ok, lab1.h2d.value) == ("suspect", False, 2.5)
    (flag,) = lab1.flags
    assert flag.label == "claim:verify-2.json"
    assert flag.message == (
        f"claims machine id {mid(4)[:12]}…, this folder's machine is {mid(1)[:12]}… "
        "(hostname lab-04)"
    )
    res = strict(tmp_path)
    assert res.returncode == 1
    assert "2 of 2 machines are not ok: lab-01, lab-04" in res.stderr


def test_a_copied_report_of_before_machine_ids_is_caught_by_its_hostname(tmp_path: Path) -> None:
    """The recorded lab (no identity.json, no machine ids): lab-04's report copied into lab-01."""
    import shutil

    shutil.copytree(LAB, tmp_path / "lab")
    src = LAB / "lab-04" / "verify-20261127T104501Z.json"
    data = json.loads(src.read_text())
    data.update(ok=True, time="2026-11-28T00:00:00Z",
                checks=[c | {"ok": True, "status": "pass"} for c in data["checks"]])  # fmt: skip
    write(tmp_path / "lab" / "lab-01" / "verify-20261128T000000Z.json", data)
    rows = {r.machine: r for r in collect([tmp_path / "lab"], now=NOW).rows}
    assert len(rows) == 6
    assert rows["lab-04"].status == "failed"
    assert rows["lab-01"].status == "suspect"
    assert rows["lab-01"].flags[0].message == "claims hostname lab-04, not lab-01's"
    assert rows["lab-01"].gpu == "NVIDIA GeForce RTX 4090"  # its own, not the copy's 3080


def test_identity_decides_over_hostname(tmp_path: Path) -> None:
    """Renamed after imaging: the old install says "debian", the verify "lab-11"; one machine
    id, so no claim. A report claiming another machine id is set aside even if its hostname
    matches the folder."""
    folder = tmp_path / "lab-11.example.internal"
    identity(folder, mid(11))
    old = report("debian", mid(11), time="2026-11-20T10:00:00Z")
    write(folder / "verify-1.json", old)
    write(folder / "verify-2.json", report("lab-11", mid(11)))
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.machine == "lab-11.example.internal" and row.ok and not row.flags
    write(folder / "verify-3.json", report("lab-11", mid(12), time="2026-11-29T10:00:00Z"))
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.status == "suspect" and row.flags[0].label == "claim:verify-3.json"


def test_a_broken_identity_file_marks_its_machine(tmp_path: Path) -> None:
    folder = tmp_path / "lab-12"
    write(folder / "identity.json", {"schema": "egpu-setup/identity/1",
                                     "machine_id_sha256": "not-a-hash"})  # fmt: skip
    write(folder / "verify-1.json", report("lab-12", mid(12)))
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.status == "suspect"
    assert [p.text() for p in row.flags] == [
        "file:identity.json: machine_id_sha256 is not a sha256 hex digest"
    ]


def test_a_linked_report_is_not_followed(tmp_path: Path) -> None:
    outside = write(tmp_path / "elsewhere" / "verify-9.json", report("lab-13", mid(13)))
    folder = tmp_path / "dest" / "lab-13"
    identity(folder, mid(13))
    os.symlink(outside, folder / "verify-9.json")
    (row,) = collect([tmp_path / "dest"], now=NOW).rows
    assert row.status == "suspect" and row.sources == ()
    assert row.flags[0].message == "a symbolic link, not followed"


# -- a folder that is not one machine's ----------------------------------------------------------


def test_a_flat_pile_of_reports_is_grouped_by_machine_id(tmp_path: Path) -> None:
    """Reports copied flat into one folder: one machine per id; a report from before machine ids
    joins the one machine of its hostname, and cannot join either of two clones."""
    write(tmp_path / "verify-a.json", report("lab-20", mid(20), time="2026-11-28T10:00:00Z"))
    old = report("lab-20", None, time="2026-11-27T10:00:00Z")
    write(tmp_path / "verify-b.json", old)
    write(tmp_path / "verify-c.json", report("clone", mid(21)))
    write(tmp_path / "verify-d.json", report("clone", mid(22), ok=False))
    write(tmp_path / "verify-e.json", report("clone", None))
    rows = collect([tmp_path], now=NOW).rows
    names = sorted(r.machine for r in rows)
    assert names == sorted(
        [
            f"clone ({tmp_path}) [{mid(21)[:8]}]",
            f"clone ({tmp_path}) [{mid(22)[:8]}]",
            f"clone ({tmp_path}) [no id]",
            "lab-20",
        ]
    )
    lab20 = next(r for r in rows if r.machine == "lab-20")
    assert lab20.machine_id == mid(20)  # the old report joined it: no second lab-20 row
