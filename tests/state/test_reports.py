"""Reports: one file per run, never over an older one, read back in the order they were saved."""

from __future__ import annotations

from pathlib import Path

from egpu_setup.state.reports import save_report, saved_order


def test_reports_of_one_second_get_their_own_names_in_save_order(tmp_path: Path) -> None:
    when = 1_764_580_800.0  # 2025-12-01T09:20:00Z
    paths = [save_report(tmp_path, "install", {"n": i}, when) for i in range(11)]
    names = [p.name for p in paths]
    assert names[:3] == [
        "install-20251201T092000Z.json",
        "install-20251201T092000Z-2.json",
        "install-20251201T092000Z-3.json",
    ]
    assert len(set(names)) == 11
    assert sorted(names) != names  # as strings "-10" and "-2" come before ".json"
    assert sorted(reversed(names), key=saved_order) == names


def test_saved_order_of_names_save_report_did_not_write() -> None:
    assert saved_order("install-ansible.json") == ("install-ansible", 1)
    assert saved_order("notes.txt") == ("notes.txt", 0)
