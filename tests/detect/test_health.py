"""The health sampler: nvidia-smi readings and Xid lines from real pastes, folded into the bounded
health.json, and the command on this machine (no NVIDIA GPU: it keeps nothing, exit 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_setup.detect.health import GpuReading, HealthProbe, parse_health_csv, parse_xids
from egpu_setup.execute.health import (
    MAX_DAYS,
    MAX_HEALTH_BYTES,
    MAX_RECENT,
    encode,
    fold_sample,
    load_health,
    save_health,
)

REAL = Path(__file__).parents[1] / "data" / "real"
HEALTH = REAL / "nvidia-smi-health"
OPTIMUS = REAL / "kernel-log" / "xid-32-31-optimus-laptop.txt"  # dmesg with times
POP_OS = REAL / "kernel-log" / "xid-79-fallen-off-bus-journal-pop-os.txt"  # journal, no times
DAY = 86400.0
T0 = 1796644800.0  # 2026-12-07T12:00:00Z


def _paste(path: Path) -> str:
    return path.read_text(encoding="utf-8").split("\n", 1)[1]


def _probe(readings: tuple[GpuReading, ...] = (), xids_from: Path | None = None) -> HealthProbe:
    xids = parse_xids(_paste(xids_from)) if xids_from else ()
    return HealthProbe(readings, xids, absent=not readings)


def _fold(
    previous: dict[str, Any] | None, probe: HealthProbe, now: float, boot: str = "b1"
) -> dict[str, Any] | None:
    return fold_sample(
        previous, probe, now=now, boot_id=boot, limit_c=88.0, interval_s=60, machine_id=None
    )


@pytest.mark.parametrize("name", sorted(yaml.safe_load((HEALTH / "expected.yaml").read_text())))
def test_real_csv_pastes_give_their_readings(name: str) -> None:
    want = yaml.safe_load((HEALTH / "expected.yaml").read_text())[name]
    got = parse_health_csv(_paste(HEALTH / name))
    assert len(got) == want["readings"]
    assert max(r.temperature_c or 0 for r in got) == want["peak_c"]
    assert max(r.power_w or 0 for r in got) == want["peak_w"]
    for key, reading in (("first", got[0]), ("last", got[-1])):
        assert {k: getattr(reading, k) for k in want[key]} == want[key]


def test_xid_lines_of_real_logs_with_and_without_dmesg_times() -> None:
    timed = parse_xids(_paste(OPTIMUS))
    assert [(x.address, x.code) for x in timed] == [
        ("0000:01:00", 32), ("0000:01:00", 32), ("0000:01:00", 31),
    ]  # fmt: skip
    assert [x.uptime_s for x in timed] == [24128.828315, 24128.828608, 24128.834365]
    journal = parse_xids(_paste(POP_OS))
    assert [x.code for x in journal] == [79] and journal[0].uptime_s is None


def test_a_day_of_real_readings_folds_into_its_peak_and_xids() -> None:
    readings = parse_health_csv(_paste(HEALTH / "csv-header-temperature-power-520-56-06.txt"))
    doc = None
    for i, reading in enumerate(readings):
        xids = OPTIMUS if i == 5 else None
        doc = _fold(doc, _probe((reading,), xids), T0 + 60 * i)
    assert doc is not None
    day = doc["days"]["2026-12-07"]
    assert (day["samples"], day["peak_c"], day["peak_w"]) == (13, 56.0, 84.77)
    assert day["xids"] == {"32": 2, "31": 1}
    assert "throttle_s" not in day  # the paste shows no throttle mask
    # the same log read again at the next sample holds no new Xid
    again = _fold(doc, _probe(readings[:1], OPTIMUS), T0 + 60 * 13)
    assert again is not None and again["days"]["2026-12-07"]["xids"] == {"32": 2, "31": 1}
    # a new boot: its log's Xids are new (the cursor belongs to the boot it was read in)
    boot2 = _fold(again, _probe(readings[:1], OPTIMUS), T0 + 60 * 14, boot="b2")
    assert boot2 is not None and boot2["days"]["2026-12-07"]["xids"] == {"32": 4, "31": 2}


def test_a_journal_without_times_counts_xids_by_position() -> None:
    reading = GpuReading("0000:01:00.0", 70.0, 200.0, (), 3, 4)
    first = _fold(None, _probe((reading,), POP_OS), T0)
    second = _fold(first, _probe((reading,), POP_OS), T0 + 60)
    assert first and second
    assert second["days"]["2026-12-07"]["xids"] == {"79": 1}


def test_throttle_time_is_the_time_between_samples_capped_at_two_intervals() -> None:
    hot = GpuReading("0000:3c:00.0", 86.0, 280.0, ("HW Thermal Slowdown",), 3, 4)
    cool = GpuReading("0000:3c:00.0", 60.0, 100.0, (), 3, 4)
    doc = _fold(None, _probe((hot,)), T0)  # the first sample counts one interval
    doc = _fold(doc, _probe((hot,)), T0 + 45)
    doc = _fold(doc, _probe((cool,)), T0 + 105)
    doc = _fold(doc, _probe((hot,)), T0 + 3600)  # after a suspend: two intervals at most
    assert doc is not None
    day = doc["days"]["2026-12-07"]
    assert (day["throttle_s"], day["reasons"]) == (60 + 45 + 120, {"HW Thermal Slowdown": 3})


def test_the_narrowest_link_of_the_day_is_kept() -> None:
    x4 = GpuReading("0000:3c:00.0", 50.0, 90.0, (), 3, 4)
    x1 = GpuReading("0000:3c:00.0", 50.0, 90.0, (), 1, 1)
    doc = _fold(
        _fold(_fold(None, _probe((x4,)), T0), _probe((x1,)), T0 + 60), _probe((x4,)), T0 + 120
    )
    assert doc is not None and doc["days"]["2026-12-07"]["link_min"] == [1, 1]


def test_nothing_is_kept_while_the_egpu_is_absent_and_quiet() -> None:
    assert _fold(None, _probe(), T0) is None
    # an Xid logged as the eGPU fell off the bus is kept although nvidia-smi reads no GPU
    kept = _fold(None, _probe((), POP_OS), T0)
    assert kept is not None and kept["days"]["2026-12-07"]["xids"] == {"79": 1}


def test_the_file_stays_bounded_over_a_long_term() -> None:
    reading = GpuReading("0000:3c:00.0", 70.0, 250.0, ("SW Power Cap",), 3, 4)
    doc = None
    for i in range(MAX_DAYS + 30):  # one sample a day for more than a year
        doc = _fold(doc, _probe((reading,)), T0 + DAY * i)
    for i in range(MAX_RECENT + 50):  # then a busy day
        doc = _fold(doc, _probe((reading,)), T0 + DAY * (MAX_DAYS + 30) + 60 * i)
    assert doc is not None
    assert len(doc["days"]) == MAX_DAYS and len(doc["recent"]) == MAX_RECENT
    assert len(encode(doc)) <= MAX_HEALTH_BYTES


def test_saved_atomically_and_read_back(tmp_path: Path) -> None:
    reading = GpuReading("0000:3c:00.0", 70.0, 250.0, (), 3, 4)
    doc = _fold(None, _probe((reading,)), T0)
    assert doc is not None
    save_health(tmp_path / "state", Path("/"), doc)
    path = tmp_path / "state" / "health.json"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert load_health(tmp_path / "state") == doc
    path.write_text("{not json")
    assert load_health(tmp_path / "state") is None  # the next sample starts afresh


def _run(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", "health", "sample", *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip


def test_on_this_machine_without_an_nvidia_gpu_it_keeps_nothing(tmp_path: Path) -> None:
    res = _run("--json", state=tmp_path / "state")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kept"] is None
    assert not (tmp_path / "state").exists()


def test_a_recording_replays_through_the_same_probe(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "commands").mkdir(parents=True)
    (bundle / "meta.json").write_text("{}")
    csv = _paste(HEALTH / "csv-header-temperature-power-520-56-06.txt")
    (bundle / "commands" / "nvidia-smi.txt").write_text(csv)
    (bundle / "commands" / "dmesg.txt").write_text(_paste(OPTIMUS))
    res = _run("--from", str(bundle), "--json", "--max-temp-c", "88", state=tmp_path / "state")
    assert res.returncode == 0, res.stderr
    kept = json.loads(res.stdout)["kept"]
    (day,) = kept["days"].values()
    assert (day["peak_c"], day["xids"], kept["limit_c"]) == (56.0, {"32": 2, "31": 1}, 88.0)
    assert not (tmp_path / "state").exists()  # a recording's sample is shown, never kept


def test_a_link_planted_as_health_json_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("keep")
    (state / "health.json").symlink_to(sentinel)
    res = _run(state=state)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and "\nhint: " in res.stderr
    assert "Traceback" not in res.stderr and sentinel.read_text() == "keep"


@pytest.mark.parametrize("value", ["39", "111", "hot"])
def test_a_bad_temperature_limit_is_a_usage_error(tmp_path: Path, value: str) -> None:
    res = _run("--max-temp-c", value, state=tmp_path / "state")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert not (tmp_path / "state").exists()
