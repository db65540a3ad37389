"""The fleet over a term: machines grouped by the enclosure their eGPU sat in (a box degraded on
every laptop it met stands out), the health sampler's peak temperature, throttle time and Xids,
and each machine's kernels check.

The `host` blocks are what install and verify write (HostFacts.fleet_summary) for the recorded
hosts of tests/fixtures/hosts/, with the trained link changed where a test says so; health.json
is made by the sampler's own fold and writer from a real nvidia-smi paste and real Xid logs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from egpu_setup.detect.facts import Link as FactLink
from egpu_setup.detect.health import GpuReading, HealthProbe, parse_health_csv, parse_xids
from egpu_setup.execute.health import fold_sample, save_health
from egpu_setup.fleet.html import render_html
from egpu_setup.fleet.rows import collect
from egpu_setup.fleet.text import render_text
from helpers.facts import recorded
from helpers.fleet_reports import Page, verify_report, write, write_identity

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
REAL = Path(__file__).parents[1] / "data" / "real"
CSV = REAL / "nvidia-smi-health" / "csv-header-temperature-power-520-56-06.txt"
XID_LOG = REAL / "kernel-log" / "xid-32-31-optimus-laptop.txt"
RAZER = "c5010000-0070-641e-0320-5812e4e23c1f"  # tb3-rtx3090-ubuntu2204's Core X
SONNET = "00e8d1a4-3c2b-0e01-ffff-ffffffffffff"  # tb4-rtx4090-ubuntu2404's 750ex
X1 = FactLink(speed_gts=2.5, width=1, max_speed_gts=16.0, max_width=16)


def _host(recording: str, hostname: str, link: FactLink | None = None) -> dict[str, Any]:
    facts = recorded(recording)
    gpu = facts.egpu
    assert gpu is not None
    if link is not None:
        gpu = replace(gpu, link=link)
    summary = facts.fleet_summary(gpu, hostname=hostname, torch="2.9.1")
    del summary["hostname"]  # verify_report sets it
    return summary


def _machine(dest: Path, name: str, recording: str, link: FactLink | None = None) -> Path:
    folder = dest / name
    write_identity(folder, None)
    write(
        folder / "verify-20261201T100000Z.json", verify_report(name, **_host(recording, name, link))
    )
    return folder


def _paste(path: Path) -> str:
    return path.read_text(encoding="utf-8").split("\n", 1)[1]


def _lab(dest: Path) -> None:
    _machine(dest, "lab-a", "tb3-rtx3090-ubuntu2204", X1)
    _machine(dest, "lab-b", "tb3-rtx3090-ubuntu2204", X1)  # the Core X moved to another laptop
    _machine(dest, "lab-c", "tb4-rtx4090-ubuntu2404")
    _machine(dest, "lab-d", "tb4-rtx4090-ubuntu2404", X1)
    _machine(dest, "lab-e", "oculink-rtx4090-debian12")  # no Thunderbolt box at all


def test_the_enclosure_degraded_on_every_laptop_it_met_is_flagged(tmp_path: Path) -> None:
    _lab(tmp_path)
    report = collect([tmp_path], now=NOW)
    rows = {r.machine: r for r in report.rows}
    assert rows["lab-a"].enclosure is not None and rows["lab-a"].enclosure.unique_id == RAZER
    assert rows["lab-e"].enclosure is None
    boxes = report.enclosures
    assert [(b.enclosure.unique_id, b.degraded_everywhere) for b in boxes] == [
        (RAZER, True),  # flagged first
        (SONNET, False),
    ]
    assert boxes[0].verdict() == "degraded on all 2 machines it met: the enclosure or its cable"
    assert boxes[1].verdict() == "degraded on 1 of 2: look at those machines' ports"
    assert [m.machine for m in boxes[0].meetings] == ["lab-a", "lab-b"]

    text = render_text(report)
    line = next(x for x in text.splitlines() if x.startswith("Razer Core X"))
    assert RAZER in line and "lab-a (2.5 GT/s x1), lab-b (2.5 GT/s x1)" in line
    assert "the enclosure or its cable" in line

    data = report.to_json()
    assert [e["unique_id"] for e in data["enclosures"]] == [RAZER, SONNET]
    assert data["enclosures"][0]["degraded_everywhere"] is True
    assert data["hosts"][0]["enclosure"]["name"] == "Core X"


def test_the_html_page_has_the_enclosure_table_with_the_flagged_box_marked(tmp_path: Path) -> None:
    _lab(tmp_path)
    page = Page()
    page.feed(render_html(collect([tmp_path], now=NOW)))
    flagged = [
        dict(page.attrs[i : i + 2]).get("data-enclosure")
        for i, (k, v) in enumerate(page.attrs)
        if (k, v) == ("class", "failed")
    ]
    assert RAZER in flagged and SONNET not in flagged
    assert (
        "Razer Core X" in page.cells
        and "Sonnet Technologies, Inc. eGFX Breakaway Box 750ex" in (page.cells)
    )


def test_one_degraded_laptop_does_not_blame_its_box(tmp_path: Path) -> None:
    _machine(tmp_path, "lab-a", "tb3-rtx3090-ubuntu2204", X1)
    (box,) = collect([tmp_path], now=NOW).enclosures
    assert (
        not box.degraded_everywhere
        and box.verdict() == "degraded on 1 of 1: look at those machines' ports"
    )


def _health(folder: Path, days: list[tuple[float, tuple[GpuReading, ...], bool]]) -> None:
    doc = None
    for when, readings, xids in days:
        probe = HealthProbe(readings, parse_xids(_paste(XID_LOG)) if xids else (), absent=False)
        doc = fold_sample(
            doc, probe, now=when, boot_id="b", limit_c=55.0, interval_s=60, machine_id=None
        )
    assert doc is not None
    save_health(folder, Path("/"), doc)


def test_the_terms_peak_throttle_and_xids_come_from_health_json(tmp_path: Path) -> None:
    folder = _machine(tmp_path, "lab-c", "tb4-rtx4090-ubuntu2404")
    real = parse_health_csv(_paste(CSV))
    hot = replace(real[0], throttle=("HW Thermal Slowdown",))
    sept = datetime(2026, 9, 2, 12, tzinfo=timezone.utc).timestamp()
    dec = datetime(2026, 12, 1, 12, tzinfo=timezone.utc).timestamp()
    before: list[tuple[float, tuple[GpuReading, ...], bool]] = [(sept, (hot,), True)]
    _health(
        folder,
        before  # before the term: hot, throttled, three Xids
        + [(dec + 60 * i, (r,), False) for i, r in enumerate(real[1:])],
    )
    whole = {r.machine: r for r in collect([tmp_path], now=NOW).rows}["lab-c"]
    assert whole.health is not None
    assert (whole.health.peak_c, whole.health.limit_c, whole.health.xids) == (
        56.0,
        55.0,
        ((32, 2), (31, 1)),
    )
    assert whole.health.throttle_s == 60
    assert [w.text() for w in whole.warnings if w.source == "health"] == [
        "health:temperature: peaked at 56 C, the profile's limit is 55 C",
        "health:xid: Xid events over the term: 32 x2, 31 x1",
    ]
    term = {r.machine: r for r in collect([tmp_path], now=NOW, since=date(2026, 11, 1)).rows}
    h = term["lab-c"].health
    assert h is not None and (h.days, h.samples, h.peak_c, h.throttle_s, h.xids) == (
        1,
        12,
        56.0,
        0,
        (),
    )
    text = render_text(collect([tmp_path], now=NOW))
    row = next(x for x in text.splitlines() if x.startswith("lab-c"))
    assert "56 (55)" in row and "1 min" in row and "32 x2, 31 x1" in row


def test_report_since_on_the_command_line(tmp_path: Path) -> None:
    folder = _machine(tmp_path, "lab-c", "tb4-rtx4090-ubuntu2404")
    real = parse_health_csv(_paste(CSV))
    _health(folder, [(datetime(2026, 9, 2, tzinfo=timezone.utc).timestamp(), real[:1], True)])
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", str(tmp_path), "--json", "--since", "2026-10-01"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["since"] == "2026-10-01" and data["hosts"][0]["health"] is None
    bad = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", str(tmp_path), "--since", "term"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (
        bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
    )


def test_the_kernels_check_is_a_column_and_a_warning(tmp_path: Path) -> None:
    folder = _machine(tmp_path, "lab-c", "tb4-rtx4090-ubuntu2404")
    write(
        folder / "kernels.json",
        {"schema": "egpu-setup/kernels/1", "ok": False, "built": [], "failed": [],
         "findings": [], "kernels": [
             {"release": "6.8.0-49-generic", "state": "ok", "running": False, "fix": None},
             {"release": "6.8.0-51-generic", "state": "missing", "running": True,
              "fix": "apt install linux-headers-6.8.0-51-generic"}]},
    )  # fmt: skip
    _machine(tmp_path, "lab-d", "tb4-rtx4090-ubuntu2404")
    write(
        tmp_path / "lab-d" / "kernels.json",
        {"schema": "egpu-setup/kernels/1", "ok": True, "kernels": [
            {"release": "6.8.0-51-generic", "state": "ok", "running": True, "fix": None}]},
    )  # fmt: skip
    report = collect([tmp_path], now=NOW)
    rows = {r.machine: r for r in report.rows}
    assert (
        rows["lab-c"].kernels is not None and rows["lab-c"].kernels.text() == "1 missing (running)"
    )
    assert rows["lab-d"].kernels is not None and rows["lab-d"].kernels.text() == "ok"
    assert [w.text() for w in rows["lab-c"].warnings if w.source == "kernels"] == [
        "kernels:nvidia-module-missing-for-kernel: no NVIDIA module for 6.8.0-51-generic "
        "(the running one among them)"
    ]
    assert rows["lab-c"].status == "ok"  # verify alone decides the status
    assert report.to_json()["hosts"][0]["kernels"]["missing"] == ["6.8.0-51-generic"]


def test_hostile_health_and_kernels_files_are_unknown_never_a_crash(tmp_path: Path) -> None:
    folder = _machine(tmp_path, "lab-c", "tb4-rtx4090-ubuntu2404")
    write(
        folder / "health.json",
        {"schema": "egpu-setup/health/1", "limit_c": "hot", "days": {
            "2026-12-01": {"peak_c": True, "samples": "many", "throttle_s": -5,
                           "xids": {"79": 1e400, "x": 3, "13": -1, "31": 2}},
            "not-a-day": {"peak_c": 200}, "2026-12-02": [1, 2]}},
    )  # fmt: skip
    write(folder / "kernels.json", {"schema": "egpu-setup/kernels/1", "kernels": 7})
    row = collect([tmp_path], now=NOW).rows[0]
    assert row.health is not None and row.kernels is None
    h = row.health
    assert (h.days, h.samples, h.peak_c, h.limit_c, h.throttle_s, h.xids) == (
        1,
        0,
        None,
        None,
        0,
        ((31, 2),),
    )
    render_text(collect([tmp_path], now=NOW))  # and prints


def test_a_dock_beside_the_enclosure_names_no_enclosure() -> None:
    facts = recorded("tb4-rtx4090-ubuntu2404")
    dock = replace(facts.thunderbolt.devices[-1], sysfs_name="0-3", unique_id="d0c0d0c0-0000")
    two = replace(
        facts, thunderbolt=replace(facts.thunderbolt, devices=(*facts.thunderbolt.devices, dock))
    )
    assert facts.enclosure_of(facts.egpu) is not None
    assert two.enclosure_of(two.egpu) is None
    assert two.fleet_summary(two.egpu, hostname="x", torch=None)["enclosure"] is None


def test_a_laptop_that_waits_for_a_person_says_why(tmp_path: Path) -> None:
    # firstboot.json as install/firstboot.py writes it: Secure Boot on, the lab's key queued
    # but not confirmed in MokManager; another laptop's enclosure was never enrolled.
    folder = _machine(tmp_path, "lab-e", "tb4-rtx4090-ubuntu2404")
    write(
        folder / "firstboot.json",
        {"schema": "egpu-setup/firstboot/1", "outcome": "passed", "mok": "mok-needed"},
    )
    other = _machine(tmp_path, "lab-f", "tb4-rtx4090-ubuntu2404")
    write(
        other / "firstboot.json",
        {"schema": "egpu-setup/firstboot/1", "outcome": "not-enrolled", "mok": "mok-enrolled"},
    )
    hostile = _machine(tmp_path, "lab-g", "tb4-rtx4090-ubuntu2404")
    write(hostile / "firstboot.json", {"schema": "egpu-setup/firstboot/1", "mok": {"x": 1}})
    report = collect([tmp_path], now=NOW)
    rows = {r.machine: r for r in report.rows}
    waits = {m: [w.id for w in r.warnings if w.source == "firstboot"] for m, r in rows.items()}
    assert waits == {"lab-e": ["mok-needed"], "lab-f": ["not-enrolled"], "lab-g": []}
    assert rows["lab-g"].firstboot == {"outcome": None, "mok": None}
    hosts = {h["machine"]: h for h in report.to_json()["hosts"]}
    assert hosts["lab-e"]["firstboot"] == {"outcome": "passed", "mok": "mok-needed"}
    assert "MokManager" in render_text(report)
