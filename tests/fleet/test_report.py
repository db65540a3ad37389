"""Fleet reports: the recorded lab merged into one truthful row per machine, text/JSON/HTML
output, and bad input (a malformed or deeply nested file is a row's problem, never a crash).

Which machine a report is from (folders, identity.json, machine ids, copied reports, clones) is
in tests/fleet/test_report_identity.py; the page in a real browser in
tests/fleet/test_report_browser.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from egpu_setup.fleet.expected import Link
from egpu_setup.fleet.html import COLUMNS as HTML_COLUMNS
from egpu_setup.fleet.html import cells as html_cells
from egpu_setup.fleet.html import render_html
from egpu_setup.fleet.load import load_report
from egpu_setup.fleet.rows import SCHEMA_REPORT, collect
from egpu_setup.fleet.text import COLUMNS, cells, render_text
from helpers.fleet_reports import Page, verify_report, write

DATA = Path(__file__).parents[1] / "data" / "reports"
LAB = DATA / "lab"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


# -- the recorded lab ------------------------------------------------------------------------------


def _text(link: Link | None) -> str:
    """A link the row is expected to have, as the table prints it."""
    assert link is not None
    return link.text()


def test_sample_lab_rows() -> None:
    report = collect([LAB], now=NOW)
    rows = {r.machine: r for r in report.rows}
    assert list(rows) == ["lab-01", "lab-02", "lab-03", "lab-04", "lab-05", "lab-06"]

    # lab-01 failed a verify before its reboot; the newer passing one wins.
    r1 = rows["lab-01"]
    assert (r1.status, r1.ok, r1.device) == ("ok", True, "cuda")
    assert (r1.gpu, r1.connection, _text(r1.link), r1.driver, r1.torch) == (
        "NVIDIA GeForce RTX 4090",
        "thunderbolt",
        "8 GT/s x4",
        "550.163.01",
        "2.9.1+cu128",
    )
    assert (r1.h2d.value, r1.h2d.expected, r1.h2d.ceiling) == (2.71, 2.0, 3.94)
    assert (r1.tflops.value, r1.tflops.expected) == (61.2, 40.0)
    assert (r1.amp, r1.install, r1.verify, r1.failures) == ("ok", "changed", "ok", ())
    assert r1.time == datetime(2026, 11, 27, 10, 15, 2, tzinfo=timezone.utc)
    assert r1.age_s == (NOW - r1.time).total_seconds()

    # lab-04 is stuck on an x1 link: the link against its ceiling, each failure with its message
    r4 = rows["lab-04"]
    assert (_text(r4.link), _text(r4.ceiling)) == ("2.5 GT/s x1", "8 GT/s x4")
    assert [p.text() for p in r4.failures] == [
        "verify:pcie-link: link trained at 2.5 GT/s x1, expected at least 8 GT/s x4",
        "verify:h2d-bandwidth: pinned host-to-device copy of 256 MiB: 0.19 GB/s",
        "verify:amp-training: RuntimeError: CUDA error: unspecified launch failure",
    ]
    assert r4.status == "failed" and not r4.ok

    # lab-05 waits for its reboot: its torch was planned, never installed (no pip step ran)
    r5 = rows["lab-05"]
    assert (r5.status, r5.install, r5.verify, r5.torch, r5.failures) == (
        "reboot required", "reboot required", None, None, (),
    )  # fmt: skip
    # ... and its GPU's own link is faster than the Thunderbolt tunnel behind it
    assert (_text(r5.link), _text(r5.ceiling)) == ("16 GT/s x4", "8 GT/s x4")

    (r6,) = rows["lab-06"].failures
    assert (
        r6.text() == "install:apt-install: apt lock held by unattended-upgrades for more than 300 s"
    )
    assert report.summary == {
        "hosts": 6, "ok": 3, "failed": 2, "unverified": 1, "cpu": 0, "suspect": 0,
    }  # fmt: skip
    # the stray Ansible file under lab-06/ is skipped with a reason, not fatal
    assert [Path(p).name for p, _ in report.skipped] == ["ansible-facts.json"]


def test_text_table() -> None:
    text = render_text(collect([LAB], now=NOW))
    lines = text.splitlines()
    header = lines[0]
    for name in COLUMNS:
        assert name in header
    assert lines[1].split()[:3] == ["lab-01", "ok", "cuda"]
    lab4 = lines.index(next(x for x in lines if x.startswith("lab-04")))
    assert "2.5 GT/s x1 of 8 GT/s x4" in lines[lab4]
    assert "0.19 of 3.94 min 2" in lines[lab4] and "4 d" in lines[lab4]
    # every failure on its own line below the row, with its message
    assert lines[lab4 + 1] == (
        "    ! verify:pcie-link: link trained at 2.5 GT/s x1, expected at least 8 GT/s x4"
    )
    lab3 = next(x for x in lines if x.startswith("lab-03"))
    assert "6.48 of 7.88 min 2" in lab3 and "16 GT/s x4" in lab3
    assert lines[-1] == "6 machines: 3 ok, 2 failed, 1 not verified; 1 file skipped"
    # columns line up: the status column starts at the same offset on every row
    col = header.index("status")
    rows = [x for x in lines[1:] if x.startswith("lab-")]
    assert all(x[col - 2 : col] == "  " and x[col] != " " for x in rows)


def test_newest_report_of_a_machine_wins_regardless_of_order(tmp_path: Path) -> None:
    folder = tmp_path / "h"
    write(folder / "verify-b.json", verify_report("h", ok=False, time="2026-11-28T09:00:00Z"))
    write(folder / "verify-a.json", verify_report("h", ok=True, time="2026-11-28T11:00:00Z"))
    write(folder / "verify-c.json", verify_report("h", ok=False, time="2026-11-28T10:00:00Z"))
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.ok and row.time == datetime(2026, 11, 28, 11, tzinfo=timezone.utc)


def test_of_two_reports_in_one_second_the_one_saved_later_wins(tmp_path: Path) -> None:
    """save_report names the second report of a second `-2.json`, which sorts before `.json`
    as a string: the order it was saved in decides (state/reports.py saved_order)."""
    folder = tmp_path / "h"
    same = "2026-11-28T09:00:00Z"
    write(folder / "verify-20261128T090000Z.json", verify_report("h", ok=False, time=same))
    write(folder / "verify-20261128T090000Z-2.json", verify_report("h", ok=True, time=same))
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.ok
    write(folder / "verify-20261128T090000Z-10.json", verify_report("h", ok=False, time=same))
    (row,) = collect([tmp_path], now=NOW).rows
    assert not row.ok  # -10 after -2, numerically


def test_time_from_file_name_when_missing(tmp_path: Path) -> None:
    older = verify_report("h", ok=True)
    newer = verify_report("h", ok=False)
    del older["time"], newer["time"]
    write(tmp_path / "verify-20261128T090000Z.json", older)
    write(tmp_path / "verify-20261128T100000Z.json", newer)
    (row,) = collect([tmp_path], now=NOW).rows
    assert not row.ok and row.time == datetime(2026, 11, 28, 10, tzinfo=timezone.utc)


def test_wrong_types_are_unknown_not_crash(tmp_path: Path) -> None:
    data = {
        "schema": "egpu-setup/verify/1",
        "ok": "yes",
        "time": 17,
        "host": {"hostname": "odd", "gpu": 7, "link": [1, 2], "driver": {"v": 1}, "torch": True},
        "device": "cuda:0",
        "checks": [None, "x", {"id": "h2d-bandwidth", "ok": True, "value": "fast"}, {"ok": False},
                   {"id": "matmul-fp16", "status": "pass", "value": 10**400},
                   {"id": "pcie-link", "status": "pass", "value": {"speed_gts": "8", "width": 1e400}}],
    }  # fmt: skip
    write(tmp_path / "odd" / "verify.json", data)
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.machine == "odd" and row.hostname == "odd"
    assert row.gpu == "7" and row.link is None and row.driver is None and row.torch is None
    assert row.h2d.value is None and row.tflops.value is None and row.time is None
    assert row.verify == "failed" and [p.label for p in row.failures] == ["verify:?"]


def test_single_file_argument() -> None:
    report = collect([LAB / "lab-03" / "verify-20261127T103044Z.json"], now=NOW)
    assert [r.machine for r in report.rows] == ["lab-03"]


# -- truthful columns ------------------------------------------------------------------------------


def test_a_cpu_verify_is_its_own_state_and_fails_strict_unless_cpu_ok(tmp_path: Path) -> None:
    """`verify --device cpu` proves torch trains on the CPU, not that an eGPU works."""
    rows = {r.machine: r for r in collect([DATA / "real"], now=NOW).rows}
    cpu = rows["ci-cpu"]
    assert (cpu.status, cpu.ok, cpu.device, cpu.verify, cpu.amp) == (
        "cpu only", False, "cpu", "ok", "ok",
    )  # fmt: skip
    assert cpu.gpu is None and cpu.h2d.value is None  # never the profile's GPU
    assert (cpu.torch, cpu.hostname) == ("2.13.0+cpu", "vm")
    assert cpu.tflops.label == "bf16" and cpu.tflops.expected is None
    cells_of = dict(zip(COLUMNS, cells(cpu), strict=True))
    assert cells_of["status"] == "cpu only" and cells_of["device"] == "cpu"

    strict = _run("report", str(DATA / "real" / "ci-cpu"), "--strict")
    assert strict.returncode == 1
    assert strict.stderr.splitlines()[-2:] == [
        "error: 1 of 1 machines are not ok: vm",  # the folder given itself: named by its reports
        "hint: they were verified on the CPU only: verify on the eGPU, or pass --cpu-ok",
    ]
    allowed = _run("report", str(DATA / "real" / "ci-cpu"), "--strict", "--cpu-ok", "--json")
    assert allowed.returncode == 0, allowed.stderr
    data = json.loads(allowed.stdout)
    assert data["cpu_ok"] is True and data["hosts"][0]["ok"] is True
    assert data["summary"]["cpu"] == 1


def test_only_a_verify_on_cuda_is_an_ok_egpu(tmp_path: Path) -> None:
    """The green "ok" (status, row colour) needs a verify that ran on CUDA: a CPU verify is
    "cpu only" with its AMP cell saying so, and a verify that does not say which device it ran
    on (no device_kind, no device type, no cuda-available check) proves nothing about an eGPU."""
    cpu = collect([DATA / "real" / "ci-cpu"], now=NOW).rows[0]
    cells_of = dict(zip(HTML_COLUMNS, html_cells(cpu), strict=True))
    assert (cells_of["status"], cells_of["device"], cells_of["AMP"]) == (
        "cpu only",
        "cpu",
        "ok (cpu)",
    )
    page = render_html(collect([DATA / "real" / "ci-cpu"], now=NOW))
    assert '<tr class="cpu"' in page and '<tr class="ok"' not in page

    silent = verify_report("lab-07")
    del silent["device_kind"], silent["device"]
    write(tmp_path / "lab-07" / "verify-20261128T100000Z.json", silent)
    cuda = verify_report("lab-08")
    write(tmp_path / "lab-08" / "verify-20261128T100000Z.json", cuda)
    rows = {r.machine: r for r in collect([tmp_path], now=NOW).rows}
    row = rows["lab-07"]
    assert (row.status, row.ok, row.device, row.verify) == ("not verified", False, None, "ok")
    assert row.notes == (
        "the verify of 2026-11-28T10:00+00:00 does not say which device it ran on",
    )
    assert (rows["lab-08"].status, rows["lab-08"].ok) == ("ok", True)  # the control
    page = render_html(collect([tmp_path], now=NOW))
    assert page.count('<tr class="ok"') == 1 and page.count('<tr class="unverified"') == 1


def test_the_example_page_is_the_tools_page_of_the_recorded_reports() -> None:
    """docs/lab-report-example.html is written by scripts/make_lab_example.py from the recorded
    reports, never by hand: --check fails when the page's code changed and it was not redone."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_lab_example.py"
    res = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    page = (script.parents[1] / "docs" / "lab-report-example.html").read_text()
    p = Page()
    p.feed(page)
    machines = ["ci-cpu", "image-trixie", "lab-01", "lab-02", "lab-03", "lab-04", "lab-05",
                "lab-06"]  # fmt: skip
    assert p.marks == {"host-to-device bandwidth": machines, "matmul throughput": machines}


def test_gpu_is_what_the_machine_saw_never_what_was_planned() -> None:
    """`install --root IMG --json` of an image: the resolution names the profile's GPU, the
    image has none; the GPU column stays empty and nothing says torch is there."""
    rows = {r.machine: r for r in collect([DATA / "real"], now=NOW).rows}
    image = rows["image-trixie"]
    assert (image.install, image.verify, image.status) == ("changed", None, "not verified")
    assert image.gpu is None and image.torch is None and image.device is None


def test_torch_only_when_installed_or_imported(tmp_path: Path) -> None:
    data = json.loads((LAB / "lab-01" / "install-20261127T091502Z.json").read_text())
    planned = {**data, "steps": [{"kind": "apt-install", "status": "done"}]}
    write(tmp_path / "planned" / "install-20261127T091502Z.json", planned)
    write(tmp_path / "installed" / "install-20261127T091502Z.json", data)
    rows = {r.machine: r for r in collect([tmp_path], now=NOW).rows}
    assert rows["planned"].torch is None
    assert rows["installed"].torch == "2.9.1+cu128"  # the pip step ran


def test_a_verify_older_than_a_changing_install_proves_nothing(tmp_path: Path) -> None:
    write(tmp_path / "m" / "verify-1.json", verify_report("m", time="2026-11-28T10:00:00Z"))
    install = json.loads((LAB / "lab-05" / "install-20261127T110237Z.json").read_text())
    install.update(time="2026-11-29T10:00:00Z", host={"hostname": "m"})
    write(tmp_path / "m" / "install-2.json", install)
    (row,) = collect([tmp_path], now=NOW).rows
    assert (row.status, row.ok) == ("reboot required", False)
    assert row.notes and "predates the install" in row.notes[0]


def test_h2d_expected_is_the_floor_not_the_links_own_rate(tmp_path: Path) -> None:
    """With no floor for the connection, verify records the trained link's rate as `expected`:
    that is no minimum. A Thunderbolt link moving more than TB3/4 carries is a TB5 one."""
    internal = verify_report("pc", connection="pcie",
                             link={"speed_gts": 16.0, "width": 16, "max_speed_gts": 16.0,
                                   "max_width": 16})  # fmt: skip
    internal["checks"][1].update(value=24.1, expected=31.508)  # 16 GT/s x16: 31.508 GB/s
    tb5 = verify_report("tb5", connection="thunderbolt",
                        link={"speed_gts": 16.0, "width": 4, "max_speed_gts": 16.0,
                              "max_width": 4})  # fmt: skip
    tb5["checks"][1].update(value=6.1, expected=2.0)
    write(tmp_path / "pc" / "verify.json", internal)
    write(tmp_path / "tb5" / "verify.json", tb5)
    rows = {r.machine: r for r in collect([tmp_path], now=NOW).rows}
    assert (rows["pc"].h2d.expected, rows["pc"].h2d.ceiling) == (None, 31.51)
    assert _text(rows["tb5"].ceiling) == "16 GT/s x4" and rows["tb5"].h2d.ceiling == 7.88


def test_role_written_failed_install_says_why(tmp_path: Path) -> None:
    """The Ansible role's install-ansible.json for a run that failed before printing JSON."""
    write(
        tmp_path / "lab-09" / "install-ansible.json",
        {"schema": "egpu-setup/install/1", "ok": False, "exit_code": 5, "changed": 0,
         "time": "2026-11-29T10:00:00Z", "host": {"hostname": "lab-09"}, "steps": [],
         "error": ["some progress", "error: apt lock held by apt-get (pid 812)",
                   "hint: wait, then run again"]},
    )  # fmt: skip
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.install == "failed"
    assert [p.text() for p in row.failures] == [
        "install:install: apt lock held by apt-get (pid 812)"
    ]


def test_install_json_with_nothing_done_is_ok(tmp_path: Path) -> None:
    data = json.loads((DATA / "real/image-trixie/install-20261129T165800Z.json").read_text())
    data["result"] = {"run": None, "steps": [], "reboot_required": None}
    write(tmp_path / "h" / "install-20261130T000000Z.json", data)
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.install == "ok" and row.failures == ()


def test_informational_and_skipped_checks_are_no_failures(tmp_path: Path) -> None:
    data = verify_report("h")
    data["checks"] += [
        {"id": "amp-speedup", "ok": True, "status": "info", "informational": True, "detail": ""},
        {"id": "gpu-throttle", "ok": True, "status": "warn", "detail": "HW slowdown seen"},
        {"id": "cudnn-benchmark", "ok": None, "status": "skip", "detail": "no cuDNN"},
    ]
    write(tmp_path / "h" / "v.json", data)
    (row,) = collect([tmp_path], now=NOW).rows
    assert row.ok and row.failures == ()
    assert [p.text() for p in row.warnings] == ["verify:gpu-throttle: HW slowdown seen"]


# -- JSON and --strict -----------------------------------------------------------------------------


def test_json_output_via_cli() -> None:
    res = _run("report", str(LAB), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["schema"] == SCHEMA_REPORT
    assert data["summary"]["hosts"] == 6 and data["summary"]["ok"] == 3
    lab3 = next(h for h in data["hosts"] if h["machine"] == "lab-03")
    assert lab3["h2d_gbps"] == 6.48 and lab3["ok"] is True and lab3["link"] == "16 GT/s x4"
    assert (lab3["h2d_min_gbps"], lab3["h2d_ceiling_gbps"], lab3["link_ceiling"]) == (
        2.0, 7.88, "16 GT/s x4",
    )  # fmt: skip
    lab4 = next(h for h in data["hosts"] if h["machine"] == "lab-04")
    assert lab4["failures"] == ["verify:pcie-link", "verify:h2d-bandwidth", "verify:amp-training"]
    assert lab4["problems"][1] == {
        "source": "verify", "id": "h2d-bandwidth",
        "message": "pinned host-to-device copy of 256 MiB: 0.19 GB/s",
    }  # fmt: skip
    assert len(data["skipped"]) == 1


def test_strict_exits_1_with_failures() -> None:
    res = _run("report", str(LAB), "--strict")
    assert res.returncode == 1
    assert "lab-04" in res.stdout  # the table is still printed
    assert res.stderr.splitlines()[-2:] == [
        "error: 3 of 6 machines are not ok: lab-04, lab-05, lab-06",
        "hint: see the failures under each row; re-run `egpu-setup verify` on those machines",
    ]
    ok = _run("report", str(LAB / "lab-01"), str(LAB / "lab-02"), "--strict")
    assert ok.returncode == 0, ok.stderr


# -- HTML ------------------------------------------------------------------------------------------


ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "table", "thead", "tbody",
    "tr", "th", "td", "div", "details", "summary", "ul", "li", "code",
    "svg", "rect", "line", "text",
}  # fmt: skip


def test_html_is_self_contained_with_one_mark_per_machine(tmp_path: Path) -> None:
    out = tmp_path / "lab.html"
    res = _run("report", str(LAB), str(DATA / "real"), "--html", str(out))
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    p = Page()
    p.feed(page)
    assert set(p.tags) <= ALLOWED_TAGS, set(p.tags) - ALLOWED_TAGS
    assert "script" not in p.tags and "link" not in p.tags and "img" not in p.tags
    # no external assets of any kind
    assert "http://" not in page and "https://" not in page and "url(" not in page
    machines = ["ci-cpu", "image-trixie", "lab-01", "lab-02", "lab-03", "lab-04", "lab-05",
                "lab-06"]  # fmt: skip
    assert p.marks == {"host-to-device bandwidth": machines, "matmul throughput": machines}
    assert "GeForce RTX 4070" in p.cells and "6.48 of 7.88 min 2" in p.cells
    assert page.count('<tr class="ok"') == 3 and page.count('<tr class="failed"') == 2
    assert page.count('<tr class="cpu"') == 1
    assert "verify:h2d-bandwidth: pinned host-to-device copy of 256 MiB: 0.19 GB/s" in p.cells
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def test_hostile_report_cannot_inject_html(tmp_path: Path) -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    data = verify_report(evil, driver='"><iframe src=//e>', torch="&")
    data["device"]["name"] = "<b>RTX</b>"
    data["checks"].append({"id": "<svg onload=alert(2)>", "ok": False, "detail": "</td></tr>"})
    write(tmp_path / "evil" / "verify.json", data)
    write(tmp_path / evil.replace("/", "_") / "verify.json", verify_report(evil))
    page = render_html(collect([tmp_path], now=NOW), title="<i>lab</i>")
    p = Page()
    p.feed(page)
    for tag in ("script", "img", "iframe", "b", "i"):
        assert tag not in p.tags
    assert p.tags.count("svg") == 2  # the two charts, not the check id
    assert not any(name.startswith("on") for name, _ in p.attrs)
    # the text survives, as text
    assert "<b>RTX</b>" in p.cells and '"><iframe src=//e>' in p.cells
    assert "verify:<svg onload=alert(2)>: </td></tr>" in p.cells
    assert evil.replace("/", "_") in [m for marks in p.marks.values() for m in marks]
    # the content security policy forbids scripts even if something slipped through
    assert "default-src 'none'" in page


def test_hostile_hostname_cannot_spoof_terminal(tmp_path: Path) -> None:
    write(tmp_path / "verify.json", verify_report("lab\x1b[2J\nfake-row"))
    text = render_text(collect([tmp_path], now=NOW))
    assert "\x1b" not in text
    assert text.splitlines()[1].startswith("lab\\x1b[2J\\nfake-row")


# -- bad input -------------------------------------------------------------------------------------


def test_missing_path_is_usage_error(tmp_path: Path) -> None:
    res = _run("report", str(tmp_path / "nope"))
    assert res.returncode == 2
    assert res.stderr.startswith(f"error: report path not found: {tmp_path / 'nope'}\nhint: ")
    assert "Traceback" not in res.stderr


def test_no_reports_is_usage_error(tmp_path: Path) -> None:
    (tmp_path / "notes.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"schema": "something/else"}')
    out = tmp_path / "out.html"
    res = _run("report", str(tmp_path), "--html", str(out))
    assert res.returncode == 2
    assert f"error: no egpu-setup reports found in {tmp_path}" in res.stderr
    assert "hint: " in res.stderr and "Traceback" not in res.stderr
    assert "skipping" in res.stderr and "not JSON" in res.stderr
    assert not out.exists()  # nothing written on bad input


def test_a_deeply_nested_or_broken_file_is_a_row_problem_not_a_crash(tmp_path: Path) -> None:
    """One hostile file must not take the whole table down: a file named like ours that cannot
    be read marks its machine (a truncated verify may hide a failure); others are skipped."""
    deep = "[" * 200_000 + "]" * 200_000
    write(tmp_path / "lab-01" / "verify-20261128T090000Z.json", verify_report("lab-01"))
    (tmp_path / "lab-01" / "verify-20261129T090000Z.json").write_text(deep)
    (tmp_path / "lab-02" / "notes.json").parent.mkdir()
    (tmp_path / "lab-02" / "notes.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    write(tmp_path / "lab-02" / "verify-1.json", verify_report("lab-02"))
    (tmp_path / "lab-03").mkdir()
    (tmp_path / "lab-03" / "install-1.json").write_bytes(b'{"schema": "\xff\xfe"}')
    res = _run("report", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    rows = {h["machine"]: h for h in json.loads(res.stdout)["hosts"]}
    assert rows["lab-01"]["status"] == "suspect" and not rows["lab-01"]["ok"]
    assert rows["lab-01"]["problems"] == [
        {"source": "file", "id": "verify-20261129T090000Z.json",
         "message": "not a report: JSON nested too deeply"},
    ]  # fmt: skip
    assert rows["lab-02"]["ok"]  # a stray file of someone else's is only skipped
    assert (
        rows["lab-03"]["status"] == "suspect"
        and "not JSON" in rows["lab-03"]["problems"][0]["message"]
    )
    strict = _run("report", str(tmp_path), "--strict")
    assert strict.returncode == 1 and "lab-01, lab-03" in strict.stderr


def test_html_into_missing_folder_writes_nothing(tmp_path: Path) -> None:
    res = _run("report", str(LAB), "--html", str(tmp_path / "no" / "such" / "x.html"))
    assert res.returncode == 2
    assert "error: --html" in res.stderr and "does not exist" in res.stderr
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_oversized_and_non_object_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(9 * 1024 * 1024)
    lst = write(tmp_path / "list.json", [1, 2])
    with pytest.raises(ValueError, match="too large"):
        load_report(big)
    with pytest.raises(ValueError, match="not a JSON object"):
        load_report(lst)


def test_no_arguments_is_usage_error() -> None:
    res = _run("report")
    assert res.returncode == 2
    assert res.stderr.startswith("error: Missing argument 'PATHS...'")


def test_help_has_examples() -> None:
    res = _run("report", "--help")
    assert res.returncode == 0
    assert "Examples:" in res.stdout and "--html" in res.stdout and "--cpu-ok" in res.stdout


@pytest.mark.slow
def test_real_cpu_verify_then_report(tmp_path: Path) -> None:
    """The whole path on this machine: verify saves its report with this machine's id, report
    reads it as a CPU-only machine (ok only with --cpu-ok)."""
    pytest.importorskip("torch")
    import os

    from egpu_setup.host.identity import machine_id_sha256
    from egpu_setup.host.machine import LiveHost

    state = tmp_path / "state"
    env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(state)}
    proc = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "verify", "--device", "cpu", "--quick",
         "--python", sys.executable],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (saved,) = (state / "reports").glob("verify-*.json")
    data = json.loads(saved.read_text())
    assert data["device_kind"] == "cpu"
    assert data["machine_id_sha256"] == machine_id_sha256(LiveHost())
    res = _run("report", str(state / "reports"), "--json", "--strict", "--cpu-ok")
    assert res.returncode == 0, res.stderr
    (host,) = json.loads(res.stdout)["hosts"]
    assert host["ok"] and host["amp"] == "ok" and host["verify"] == "ok"
    assert host["status"] == "cpu only" and host["machine_id_sha256"] == data["machine_id_sha256"]
