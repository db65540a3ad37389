"""Fleet reports: merging real-shaped install/verify reports, text/JSON/HTML output, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from egpu_setup.cli import cli
from egpu_setup.fleet.report import (
    COLUMNS,
    SCHEMA_REPORT,
    FleetReport,
    _cells,
    collect,
    load_report,
    render_html,
    render_text,
)

DATA = Path(__file__).parents[1] / "data" / "reports"
LAB = DATA / "lab"


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def _verify(hostname: str, *, ok: bool = True, time: str = "2026-11-28T10:00:00Z", **host) -> dict:
    return {
        "schema": "egpu-setup/verify/1",
        "ok": ok,
        "time": time,
        "host": {"hostname": hostname, **host},
        "device": {"name": "NVIDIA GeForce RTX 4090"},
        "checks": [
            {"id": "h2d-bandwidth", "ok": ok, "detail": "", "value": 2.5, "expected": 2.0},
            {"id": "amp-training", "ok": ok, "detail": "", "value": 0.1, "expected": 0.5},
        ],
    }


def _write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# -- merging the sample lab --------------------------------------------------------------------


def test_sample_lab_rows() -> None:
    report = collect([LAB])
    rows = {r.hostname: r for r in report.rows}
    assert list(rows) == ["lab-01", "lab-02", "lab-03", "lab-04", "lab-05", "lab-06"]

    # lab-01 had a failed verify before its reboot; the newer passing one wins.
    r1 = rows["lab-01"]
    assert (r1.gpu, r1.connection, r1.link, r1.driver, r1.torch) == (
        "NVIDIA GeForce RTX 4090",
        "thunderbolt",
        "8 GT/s x4",
        "550.163.01",
        "2.9.1+cu128",
    )
    assert (r1.h2d_gbps, r1.amp, r1.install, r1.verify, r1.failures) == (
        2.71,
        "ok",
        "changed",
        "ok",
        (),
    )
    assert r1.ok
    assert r1.time == "2026-11-27T10:15:02+00:00"

    r4 = rows["lab-04"]
    assert r4.link == "2.5 GT/s x1 (max 8 GT/s x4)"
    assert r4.amp == "failed"
    assert r4.failures == ("verify:pcie-link", "verify:h2d-bandwidth", "verify:amp-training")
    assert not r4.ok

    assert rows["lab-05"].install == "reboot required"
    assert rows["lab-05"].verify is None and rows["lab-05"].failures == ()
    assert rows["lab-06"].failures == ("install:apt-install-driver",)

    assert report.summary == {"hosts": 6, "ok": 3, "failed": 2, "unverified": 1}
    # the stray Ansible file under lab-06/ is skipped with a reason, not fatal
    assert [Path(p).name for p, _ in report.skipped] == ["ansible-facts.json"]


def test_text_table() -> None:
    text = render_text(collect([LAB]))
    lines = text.splitlines()
    assert lines[0].split() == [
        "host", "GPU", "connection", "link", "driver", "torch", "H2D", "GB/s", "AMP", "failures",
    ]  # fmt: skip
    assert lines[1].startswith("lab-01  NVIDIA GeForce RTX 4090")
    assert "6.48" in lines[3] and "oculink" in lines[3]
    assert lines[-1] == "6 hosts: 3 ok, 2 failed, 1 not verified; 1 file skipped"
    # columns line up: every row has "thunderbolt"/"usb4"/... starting at the same offset
    col = lines[0].index("connection")
    assert all(line[col - 2 : col] == "  " for line in lines[1:7])


def test_newest_report_wins_regardless_of_order(tmp_path: Path) -> None:
    _write(tmp_path / "h" / "verify-1.json", _verify("h", ok=False, time="2026-11-28T09:00:00Z"))
    _write(tmp_path / "h" / "verify-2.json", _verify("h", ok=True, time="2026-11-28T11:00:00Z"))
    _write(tmp_path / "h" / "verify-3.json", _verify("h", ok=False, time="2026-11-28T10:00:00Z"))
    (row,) = collect([tmp_path]).rows
    assert row.ok and row.time == "2026-11-28T11:00:00+00:00"


def test_time_from_file_name_when_missing(tmp_path: Path) -> None:
    older = _verify("h", ok=True)
    newer = _verify("h", ok=False)
    del older["time"], newer["time"]
    _write(tmp_path / "verify-20261128T090000Z.json", older)
    _write(tmp_path / "verify-20261128T100000Z.json", newer)
    (row,) = collect([tmp_path]).rows
    assert not row.ok and row.time == "2026-11-28T10:00:00+00:00"


def test_hostname_falls_back_to_fetch_folder(tmp_path: Path) -> None:
    data = _verify("x")
    del data["host"]
    _write(tmp_path / "lab-17" / "verify-20261128T090000Z.json", data)
    (row,) = collect([tmp_path]).rows
    assert row.hostname == "lab-17"
    assert row.gpu == "NVIDIA GeForce RTX 4090"  # from "device" when "host" is missing


def test_wrong_types_are_unknown_not_crash(tmp_path: Path) -> None:
    data = {
        "schema": "egpu-setup/verify/1",
        "ok": "yes",
        "host": {"hostname": "odd", "gpu": 7, "link": [1, 2], "driver": {"v": 1}, "torch": True},
        "device": "cuda:0",
        "checks": [None, "x", {"id": "h2d-bandwidth", "ok": True, "value": "fast"}, {"ok": False}],
    }
    _write(tmp_path / "verify.json", data)
    (row,) = collect([tmp_path]).rows
    assert row.hostname == "odd"
    assert row.gpu == "7" and row.link is None and row.driver is None and row.torch is None
    assert row.h2d_gbps is None
    assert row.verify == "failed" and row.failures == ("verify:?",)


def test_single_file_argument() -> None:
    report = collect([LAB / "lab-03" / "verify-20261127T103044Z.json"])
    assert [r.hostname for r in report.rows] == ["lab-03"]


# -- JSON ------------------------------------------------------------------------------------------


def test_json_output_via_cli() -> None:
    res = CliRunner().invoke(cli, ["report", str(LAB), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["schema"] == SCHEMA_REPORT
    assert data["summary"] == {"hosts": 6, "ok": 3, "failed": 2, "unverified": 1}
    lab3 = next(h for h in data["hosts"] if h["hostname"] == "lab-03")
    assert lab3["h2d_gbps"] == 6.48 and lab3["ok"] is True and lab3["link"] == "16 GT/s x4"
    assert len(data["skipped"]) == 1


def test_strict_exits_1_with_failures() -> None:
    res = _run("report", str(LAB), "--strict")
    assert res.returncode == 1
    assert "lab-04" in res.stdout  # the table is still printed
    assert res.stderr.splitlines()[-2:] == [
        "error: 3 of 6 hosts are not ok",
        "hint: see the failures column; re-run `egpu-setup verify` on those hosts",
    ]
    ok = _run("report", str(LAB / "lab-01"), str(LAB / "lab-02"), "--strict")
    assert ok.returncode == 0, ok.stderr


# -- HTML ------------------------------------------------------------------------------------------


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        self._in_td = tag == "td"

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_td = False

    def handle_data(self, data):
        if self._in_td:
            self.cells.append(data)


def test_html_is_self_contained(tmp_path: Path) -> None:
    out = tmp_path / "lab.html"
    res = CliRunner().invoke(cli, ["report", str(LAB), "--html", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    p = _Collector()
    p.feed(page)
    assert set(p.tags) <= {
        "html", "head", "meta", "title", "style", "body", "h1", "p", "table", "thead", "tbody",
        "tr", "th", "td", "details", "summary", "ul", "li", "code",
    }  # fmt: skip
    assert "script" not in p.tags and "link" not in p.tags and "img" not in p.tags
    # no external assets of any kind
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert "NVIDIA GeForce RTX 4070" in p.cells and "6.48" in p.cells
    assert page.count('<tr class="ok"') == 3 and page.count('<tr class="failed"') == 2
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def test_hostile_report_cannot_inject_html(tmp_path: Path) -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    data = _verify(evil, gpu={"name": "<b>RTX</b>"}, driver='"><iframe src=//evil>', torch="&amp;")
    data["checks"].append({"id": "<svg onload=alert(2)>", "ok": False, "detail": "</td></tr>"})
    _write(tmp_path / "verify.json", data)  # no fetch folder: the claimed hostname names the row
    page = render_html(collect([tmp_path]), title="<i>lab</i>")
    p = _Collector()
    p.feed(page)
    for tag in ("script", "img", "iframe", "svg", "b", "i"):
        assert tag not in p.tags
    assert not any(name.startswith("on") for name, _ in p.attrs)
    # the text survives, as text
    assert evil in p.cells and "&amp;" in p.cells and "<b>RTX</b>" in p.cells
    assert "verify:<svg onload=alert(2)>" in " ".join(p.cells)
    # the content security policy forbids scripts even if something slipped through
    assert "default-src 'none'" in page


def test_hostile_hostname_cannot_spoof_terminal(tmp_path: Path) -> None:
    _write(tmp_path / "verify.json", _verify("lab\x1b[2J\nfake-row"))
    text = render_text(collect([tmp_path]))
    assert "\x1b" not in text
    assert text.splitlines()[1].startswith("lab?[2J?fake-row")


# -- bad input ---------------------------------------------------------------------------------


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


def test_html_into_missing_folder_writes_nothing(tmp_path: Path) -> None:
    res = _run("report", str(LAB), "--html", str(tmp_path / "no" / "such" / "x.html"))
    assert res.returncode == 2
    assert "error: --html" in res.stderr and "does not exist" in res.stderr
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_oversized_and_non_object_files_are_skipped(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(9 * 1024 * 1024)
    lst = _write(tmp_path / "list.json", [1, 2])
    with pytest.raises(ValueError, match="too large"):
        load_report(big)
    with pytest.raises(ValueError, match="not a JSON object"):
        load_report(lst)


def test_no_arguments_is_usage_error() -> None:
    res = _run("report")
    assert res.returncode == 2
    assert res.stderr.startswith("error: Missing argument 'PATHS...'")


def test_help_has_examples() -> None:
    res = CliRunner().invoke(cli, ["report", "--help"])
    assert res.exit_code == 0
    assert "Examples:" in res.output and "--html" in res.output


def test_report_works_on_a_copied_tree(tmp_path: Path) -> None:
    """The controller-side layout from the Ansible role: <dest>/<host>/<file>."""
    shutil.copytree(LAB, tmp_path / "fetched")
    report: FleetReport = collect([tmp_path / "fetched"])
    assert len(report.rows) == 6


# -- real outputs of this project's commands -------------------------------------------------


def test_real_install_json_and_cpu_verify() -> None:
    """`install --root IMG --only config --yes --json` and `verify --device cpu --quick`, as
    printed/saved on the development machine (tests/data/reports/real/)."""
    rows = {r.hostname: r for r in collect([DATA / "real"]).rows}
    image = rows["image-trixie"]  # no hostname in install --json: the fetch folder names it
    assert (image.install, image.verify, image.gpu) == ("changed", None, "GeForce RTX 4090")
    cpu = rows["vm"]  # its fetch folder, which is also the hostname it states
    assert (cpu.verify, cpu.amp, cpu.torch, cpu.failures) == ("ok", "ok", "2.13.0+cpu", ())


def test_failures_column_of_installed_but_unverified_hosts() -> None:
    """An install that changed things and succeeded is no failure: "not verified", never
    "changed", in the failures column (text and HTML); JSON keeps the install state."""
    report = collect([DATA / "real"])
    cells = {r.hostname: dict(zip(COLUMNS, _cells(r), strict=True)) for r in report.rows}
    assert cells["image-trixie"]["failures"] == "not verified"
    assert cells["vm"]["failures"] == "-"
    line = next(x for x in render_text(report).splitlines() if x.startswith("image-trixie"))
    assert line.endswith("  not verified") and "changed" not in line
    html = render_html(report)
    assert '<td class="failures">not verified</td>' in html and ">changed<" not in html
    image = next(r for r in report.rows if r.hostname == "image-trixie")
    assert image.to_json()["install"] == "changed" and image.to_json()["failures"] == []
    lab = {r.hostname: dict(zip(COLUMNS, _cells(r), strict=True)) for r in collect([LAB]).rows}
    assert lab["lab-05"]["failures"] == "not verified (reboot required)"
    assert lab["lab-06"]["failures"] == "install:apt-install-driver"
    assert lab["lab-01"]["failures"] == "-"


def test_install_json_with_nothing_done_is_ok(tmp_path: Path) -> None:
    data = json.loads((DATA / "real/image-trixie/install-20261129T165800Z.json").read_text())
    data["result"] = {"run": None, "steps": [], "reboot_required": None}
    _write(tmp_path / "h" / "install-20261130T000000Z.json", data)
    (row,) = collect([tmp_path]).rows
    assert row.install == "ok" and row.failures == ()


def test_role_written_failed_install(tmp_path: Path) -> None:
    """The Ansible role's install-ansible.json for a run that failed before printing JSON."""
    _write(
        tmp_path / "lab-09" / "install-ansible.json",
        {"schema": "egpu-setup/install/1", "ok": False, "exit_code": 5, "changed": 0,
         "time": "2026-11-29T10:00:00Z", "host": {"hostname": "lab-09"}, "steps": [],
         "error": ["error: apt lock held"]},
    )  # fmt: skip
    (row,) = collect([tmp_path]).rows
    assert row.install == "failed" and row.failures == ("install",)


def test_skipped_amp_and_speedup_not_confused(tmp_path: Path) -> None:
    data = _verify("h")
    data["checks"] = [
        {"id": "amp-speedup", "ok": False, "status": "fail", "detail": ""},
        {"id": "amp-training", "ok": None, "status": "skip", "detail": "no CUDA"},
    ]
    _write(tmp_path / "v.json", data)
    (row,) = collect([tmp_path]).rows
    assert row.amp == "skipped" and row.failures == ("verify:amp-speedup",)


@pytest.mark.slow
def test_real_cpu_verify_then_report(tmp_path: Path) -> None:
    """The whole path on this machine: verify saves its report, report reads it."""
    pytest.importorskip("torch")
    import os

    state = tmp_path / "state"
    env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(state)}
    proc = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "verify", "--device", "cpu", "--quick",
         "--python", sys.executable],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    res = _run("report", str(state / "reports"), "--json", "--strict")
    assert res.returncode == 0, res.stderr
    (host,) = json.loads(res.stdout)["hosts"]
    assert host["ok"] and host["amp"] == "ok" and host["verify"] == "ok"
