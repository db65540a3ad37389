"""Kernel logs in constant memory: the Host streams a recording's file, doctor scans it a block at a
time (the same findings as the whole text), a log over the read limit is read from its newest
part and doctor says so, and detection keeps only a bounded excerpt of a big log."""

from __future__ import annotations

import io
import logging
import tracemalloc
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO
from egpu_setup.detect import kernel_log
from egpu_setup.detect.nvidia import parse_proc_version
from egpu_setup.detect.probe import gpus_in_text
from egpu_setup.doctor import dmesg
from egpu_setup.doctor.collect import scan_kernel_log
from egpu_setup.doctor.dmesg import scan_dmesg, scan_lines
from egpu_setup.host import machine
from egpu_setup.host.machine import LiveHost, RecordedHost

REAL = REPO / "tests" / "data" / "real" / "kernel-log"
LOGS = sorted(REAL.glob("*.txt")) + sorted(FIXTURES.glob("*/commands/dmesg.txt"))
LOGS += sorted((REPO / "tests" / "data" / "doctor").glob("*.txt"))


def _text(path: Path) -> str:
    text = path.read_bytes().decode("utf-8", errors="replace")
    # tests/data/real files carry their source URL on line 1: not part of the log
    return text.split("\n", 1)[1] if path.parent == REAL else text


def _bundle(tmp_path: Path, log: str | bytes) -> RecordedHost:
    (tmp_path / "commands").mkdir(parents=True, exist_ok=True)
    (tmp_path / "meta.json").write_text("{}")
    target = tmp_path / "commands" / "dmesg.txt"
    target.write_bytes(log if isinstance(log, bytes) else log.encode())
    return RecordedHost(tmp_path)


def _noise() -> str:
    """Real kernel-log lines that no signature looks for (a long, healthy uptime)."""
    needles = [n for n, _ in dmesg._NEEDLES.values()]
    needles += [dmesg._ENUM[0], dmesg._BRIDGE[0], "NVRM", "thunderbolt "]
    lines = [
        line + "\n"
        for path in LOGS
        if b"\0" not in path.read_bytes()  # the corrupt-files recording holds a binary dmesg.txt
        for line in _text(path).split("\n")
        if line and not any(n in line for n in needles)
    ]
    return "".join(lines)


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.parent.name + "/" + p.name)
def test_a_log_scanned_in_blocks_gives_what_the_whole_text_gives(path: Path) -> None:
    text = _text(path)
    whole = scan_dmesg(text)
    for block in (1, 50, 4096):  # 1: every line a block of its own
        assert scan_lines(io.StringIO(text, newline="\n"), block) == whole, block


def test_records_split_into_pieces_still_scan_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _text(REAL / "xid-79-fallen-off-bus-journal-pop-os.txt")
    monkeypatch.setattr(machine, "_PIECE", 16)  # every line longer than 16 bytes comes in pieces
    lines = _bundle(tmp_path, text).command_lines("dmesg", ["dmesg"])
    assert lines is not None
    pieces = list(lines)
    assert "".join(pieces) == text and any(not p.endswith("\n") for p in pieces[:-1])
    assert scan_lines(pieces, 64) == scan_dmesg(text)


def test_memory_stays_flat_however_long_the_log(tmp_path: Path) -> None:
    noise = _noise()
    xid = "[ 9999.000001] NVRM: Xid (PCI:0000:3c:00): 79, pid=4211, GPU has fallen off the bus.\n"
    peaks = []
    for mb in (1, 8):
        host = _bundle(tmp_path / str(mb), noise * (mb * 2**20 // len(noise) + 1) + xid)
        tracemalloc.start()
        try:
            scan = scan_lines(host.command_lines("dmesg", ["dmesg"]) or ())
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert scan.xid_codes == (79,)
    # an 8 MiB log costs what a 1 MiB one does (a block of 1 Mi characters and its copies), less
    # than reading the 8 MiB whole would
    assert peaks[1] < peaks[0] + 256 * 1024, peaks
    assert peaks[1] < 8 * 2**20, peaks


def test_over_the_limit_the_newest_part_is_read_from_a_line_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    old = _text(REAL / "t470s-tb-bar13-bar15-no-space.txt")  # BAR failures, at boot
    new = _text(REAL / "xid-79-fallen-off-bus-journal-pop-os.txt")  # the GPU falls off, later
    host = _bundle(tmp_path, old + new)
    limit = len(new.encode()) + 5  # the cut falls 5 bytes into the last line of `old`
    monkeypatch.setattr(machine, "MAX_READ", limit)
    lines = host.command_lines("dmesg", ["dmesg"])
    assert lines is not None
    assert "".join(lines) == new
    assert (lines.size, lines.skipped) == (len((old + new).encode()), len(old.encode()))
    with caplog.at_level(logging.WARNING, logger="egpu_setup.doctor"):
        scan = scan_kernel_log(host)
    assert scan is not None and scan == scan_dmesg(new)
    assert scan.fallen_off and not scan.bar_failures
    assert "read its newest" in caplog.text and "were not read" in caplog.text
    # a cut exactly at a line start loses no line
    exact = host.command_lines("dmesg", ["dmesg"], limit=len(new.encode()))
    assert exact is not None and "".join(exact) == new


def test_a_live_command_s_output_over_the_limit_keeps_its_newest_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "old line\n" * 3 + "newest line\n"
    monkeypatch.setattr(LiveHost, "command", lambda self, name, argv, timeout=10.0: text)
    lines = LiveHost().command_lines("dmesg", ["dmesg"], limit=len("newest line\n") + 3)
    assert lines is not None and list(lines) == ["newest line\n"]
    assert (lines.size, lines.skipped) == (len(text), len(text) - len("newest line\n"))
    whole = LiveHost().command_lines("dmesg", ["dmesg"])
    assert whole is not None and "".join(whole) == text and whole.skipped == 0


def test_soft_missing_binary_and_escaping_logs_give_none(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "meta.json").write_text("{}")
    assert RecordedHost(tmp_path / "empty").command_lines("dmesg", ["dmesg"]) is None
    binary = _bundle(tmp_path / "bin", b"[ 1.0] ok\n\x00\x01\x02 garbage\n")
    assert binary.command_lines("dmesg", ["dmesg"]) is None
    outside = tmp_path / "outside.txt"
    outside.write_text("[ 1.0] a log that is not in the bundle\n")
    escaping = _bundle(tmp_path / "link", "")
    link = escaping.bundle / "commands" / "dmesg.txt"
    link.unlink()
    link.symlink_to(outside)
    assert escaping.command_lines("dmesg", ["dmesg"]) is None
    # and doctor then reads no kernel log at all
    assert scan_kernel_log(escaping) is None


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.parent.name + "/" + p.name)
def test_a_big_log_s_nvrm_excerpt_detects_what_the_whole_log_does(path: Path) -> None:
    text = _text(path)
    excerpt = "".join(line for line in text.splitlines(keepends=True) if "NVRM" in line)
    assert parse_proc_version(excerpt) == parse_proc_version(text)
    if "NVRM" in text:  # a log of the driver (two files here are lspci output, not kernel logs)
        assert gpus_in_text(excerpt) == gpus_in_text(text)


def test_detection_reads_a_small_log_whole_and_a_big_one_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_text = _text(FIXTURES / "tb4-rtx4090-ubuntu2404" / "commands" / "dmesg.txt")
    host = _bundle(tmp_path / "small", log_text)
    assert kernel_log.recorded_kernel_log(host) == host.command("dmesg", ["dmesg"])
    big = _bundle(tmp_path / "big", _noise() * 40 + log_text * 3000 + _noise())
    monkeypatch.setattr(kernel_log, "SMALL", 1024)
    excerpt = kernel_log.recorded_kernel_log(big)
    assert excerpt is not None and excerpt.count("\n") <= kernel_log.TAIL_LINES + 2000
    assert len(excerpt) < kernel_log.HEAD_CHARS + kernel_log.TAIL_LINES * 200
    assert all("NVRM" in line for line in excerpt.splitlines())
    assert parse_proc_version(excerpt) == parse_proc_version(log_text) == ("560.35.03", "open")
