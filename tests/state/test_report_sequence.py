"""Reports carry a per-machine sequence and the boot id; every reader orders them by it."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.errors import UsageError
from egpu_setup.state.reports import (
    SEQUENCE_FILE,
    report_order,
    save_report,
    saved_reports,
    sequence_of,
)
from helpers.cli_runner import invoke
from helpers.fleet_reports import verify_report

WHEN = 1_764_580_800.0  # 2025-12-01T09:20:00Z


def _read(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def test_each_report_takes_the_next_sequence_and_this_boots_id(tmp_path: Path) -> None:
    paths = [save_report(tmp_path, "verify", {"n": i}, WHEN - 60 * i) for i in range(3)]
    assert [_read(p)["sequence"] for p in paths] == [1, 2, 3]
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert {_read(p)["boot_id"] for p in paths} == {boot}
    assert (tmp_path / SEQUENCE_FILE).read_text() == "3\n"
    # an image's build reports share the state directory's counter
    build = save_report(tmp_path, "install", {}, WHEN, folder="build-reports")
    assert _read(build)["sequence"] == 4


def _save_many(state: str, n: int) -> None:
    for i in range(n):
        save_report(Path(state), "verify", {"pid": os.getpid(), "i": i}, WHEN)


def test_concurrent_saves_get_distinct_numbers(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), 6)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seqs = sorted(_read(p)["sequence"] for p in (tmp_path / "reports").glob("*.json"))
    assert seqs == list(range(1, 37))


def test_a_damaged_counter_is_rebuilt_from_the_reports(tmp_path: Path) -> None:
    for _ in range(4):
        save_report(tmp_path, "verify", {}, WHEN)
    (tmp_path / SEQUENCE_FILE).write_bytes(b"\x00\x00")  # a power cut while it was written
    assert _read(save_report(tmp_path, "verify", {}, WHEN))["sequence"] == 5
    (tmp_path / SEQUENCE_FILE).unlink()
    assert _read(save_report(tmp_path, "verify", {}, WHEN))["sequence"] == 6


def test_a_link_at_the_counter_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("keep\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / SEQUENCE_FILE).symlink_to(outside)
    with pytest.raises(UsageError, match="symbolic link"):
        save_report(state, "verify", {}, WHEN)
    assert outside.read_text() == "keep\n"
    assert not list((state / "reports").glob("*.json"))


def test_report_order_is_the_sequence_then_the_name_never_the_clock() -> None:
    old = {"time": "2030-01-01T00:00:00Z"}  # from before sequences: sorts before all of them
    a = {"sequence": 2, "time": "2020-01-01T00:00:00Z"}
    b = {"sequence": 10, "time": "2019-01-01T00:00:00Z"}
    names = {"old": (old, "verify-20300101T000000Z.json"), "a": (a, "verify-x.json")}
    names["b"] = (b, "verify-y.json")
    order = sorted(names, key=lambda k: report_order(*names[k]))
    assert order == ["old", "a", "b"]
    for bad in (True, -1, 0, "3", 2**60, 1.5):
        assert sequence_of({"sequence": bad}) is None


def _clock_back_reports(state: Path) -> tuple[Path, Path]:
    passing = save_report(state, "verify", verify_report("lab-07", ok=True), WHEN)
    # the clock is set back an hour, then a verify fails
    failing = save_report(
        state, "verify", verify_report("lab-07", ok=False, time="2025-12-01T08:20:00Z"), WHEN - 3600
    )
    return passing, failing


def test_a_clock_set_back_cannot_hide_a_failing_verify_from_report_strict(tmp_path: Path) -> None:
    passing, failing = _clock_back_reports(tmp_path)
    assert failing.name < passing.name  # by name and by time the passing one looks newest
    res = invoke("report", str(tmp_path / "reports"), "--strict", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    (host,) = json.loads(res.stdout)["hosts"]
    assert host["status"] == "failed" and host["sequence"] == 2
    assert any("the clock went back" in n and failing.name in n for n in host["notes"])
    text = invoke("report", str(tmp_path / "reports"))
    assert "the clock went back" in text.stdout
    assert "error: 1 of 1 machines are not ok" in res.stderr


def test_doctor_and_the_day_after_pick_the_newest_by_sequence(tmp_path: Path) -> None:
    from egpu_setup.doctor.collect import latest_verify_report
    from egpu_setup.host.machine import RootHost
    from egpu_setup.install.day_after import newest_verify

    state = tmp_path / "root/var/lib/egpu-setup"
    state.mkdir(parents=True)
    _, failing = _clock_back_reports(state)
    host = RootHost(tmp_path / "root")
    data, path = latest_verify_report(host)
    assert data is not None and data["ok"] is False and (path or "").endswith(failing.name)
    reports = "/var/lib/egpu-setup/reports"
    assert [d["sequence"] for d, _ in saved_reports(host, [reports])] == [1, 2]
    # an install saved after both: no verify since it, whatever the clocks say
    save_report(state, "install", {"schema": "egpu-setup/install/1"}, WHEN - 7200)
    assert newest_verify(host, reports, since=0.0) == (None, None)
    later = save_report(state, "verify", verify_report("lab-07"), WHEN - 9000)
    data, path = newest_verify(host, reports, since=WHEN)  # its clock is before `since`
    assert data is not None and data["sequence"] == 4 and (path or "").endswith(later.name)


def _with_arch(report: dict[str, Any]) -> dict[str, Any]:
    """What doctor needs of a verify report to judge torch: its CUDA build and arch list."""
    check = {"id": "arch-list", "status": "info", "detail": "", "value": ["sm_89"]}
    device = {**report["device"], "torch_cuda": "12.8"}
    return {**report, "device": device, "checks": [*report["checks"], check]}


def test_doctor_says_when_the_named_verify_report_is_not_the_newest(tmp_path: Path) -> None:
    first = save_report(tmp_path, "verify", _with_arch(verify_report("lab-07", ok=False)), WHEN)
    res = invoke("doctor", "--torch-info", str(first), "--json")
    assert "older than" not in res.stderr
    newest = save_report(tmp_path, "verify", _with_arch(verify_report("lab-07")), WHEN - 3600)
    res = invoke("doctor", "--torch-info", str(first), "--json")
    assert f"note: {first} (sequence 1) is older than its machine's newest" in res.stderr
    assert str(newest) in res.stderr and "Traceback" not in res.stderr
