"""verify's process handling and output: the child's session ends on timeout (also a grandchild
that called setsid), records are streamed while the child runs, and the command prints each
check at once (a live line on a terminal, plain lines in a pipe, only JSON with --json)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.host.tracked_session import process_state, spawn
from egpu_setup.verify.checks import Check
from egpu_setup.verify.live import LivePrinter
from egpu_setup.verify.report import VerifyReport, render_check, render_table

PY = sys.executable


def alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state != "Z"


def test_a_setsid_grandchild_does_not_outlive_the_timeout(tmp_path: Path) -> None:
    """The child starts a grandchild in a session of its own (as a daemon or a DDP rank may),
    then hangs; the timeout ends both."""
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
        print(g.pid, flush=True)
        time.sleep(600)
        """
    )
    lines: list[str] = []
    t0 = time.monotonic()
    res = spawn([PY, "-c", script], dict(os.environ), 5.0, lines.append)
    assert res.timed_out and res.stuck == ()
    assert time.monotonic() - t0 < 5.0 + 2.0 + 5.0 + 10  # timeout + TERM grace + slack
    (grandchild,) = (int(line) for line in lines)
    assert not alive(res.pid)
    assert not alive(grandchild), f"setsid grandchild {grandchild} survived"


def test_a_grandchild_holding_the_pipe_cannot_hang_the_parent() -> None:
    """The child exits, a grandchild keeps stdout open: the parent stops waiting after a short
    grace and ends the grandchild too."""
    script = textwrap.dedent(
        """
        import subprocess, sys
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child done", g.pid, flush=True)
        """
    )
    lines: list[str] = []
    res = spawn([PY, "-c", script], dict(os.environ), 120.0, lines.append)
    assert not res.timed_out and res.rc == 0
    assert res.seconds < 60  # nowhere near the 120 s timeout
    grandchild = int(lines[0].split()[-1])
    assert not alive(grandchild)


def test_lines_arrive_while_the_child_runs() -> None:
    script = "import time; print('first', flush=True); time.sleep(3); print('second')"
    seen: list[tuple[str, bool]] = []
    res = spawn(
        [PY, "-c", script],
        dict(os.environ),
        60.0,
        lambda line: seen.append((line, res_proc_running())),
    )
    assert [line for line, _ in seen] == ["first", "second"]
    assert seen[0][1] is True  # the first line came while the child still ran
    assert res.rc == 0 and res.out == "first\nsecond"


def res_proc_running() -> bool:
    """Is a `python -c` child of this process running right now (not yet reaped)?"""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if int(fields[1]) == me and fields[0] != "Z":
                return True
    return False


def test_stderr_is_kept_and_a_missing_interpreter_raises(tmp_path: Path) -> None:
    res = spawn([PY, "-c", "import sys; sys.stderr.write('x' * 10000 + 'END')"], {}, 60, print)
    assert res.err.rstrip().endswith("END") and len(res.err) == 4000
    with pytest.raises(OSError):
        spawn([str(tmp_path / "no-python")], {}, 5, print)


# -- what the command prints ---------------------------------------------------------------------


def report(checks: tuple[Check, ...], device: dict[str, Any]) -> VerifyReport:
    return VerifyReport(
        checks=checks,
        device=device,
        python="/v/bin/python",
        profile=None,
        options={},
        outcome="finished",
        started=0.0,
        seconds=1.5,
        hostname="h",
    )


CHECKS = (
    Check("torch-import", "pass", "torch 2.13.0+cpu (CPU-only build) in 1.0 s", seconds=1.0),
    Check("matmul-bf16", "info", "0.64 TFLOPS (832x832)"),
    Check("amp-training", "fail", "loss 1.3 -> 1.3", hint="the loss did not fall"),
)


def test_a_pipe_gets_exactly_the_table() -> None:
    device = {"type": "cpu", "torch": "2.13.0+cpu"}
    out = io.StringIO()
    printer = LivePrinter("/v/bin/python", out, tty=False)
    printer.on_event("step", "import")
    printer.on_event("check", CHECKS[0])
    assert out.getvalue() == ""  # the header waits for the device record
    printer.on_event("device", device)
    assert out.getvalue().endswith("\n".join(render_check(CHECKS[0])) + "\n")
    printer.on_event("check", CHECKS[1])
    printer.finish(report(CHECKS, device))  # the third arrives only in the report
    assert out.getvalue() == render_table(report(CHECKS, device)) + "\n"
    assert "\r" not in out.getvalue()


def test_a_terminal_gets_a_live_line() -> None:
    out = io.StringIO()
    printer = LivePrinter("/v/bin/python", out, tty=True)
    printer.on_event("device", {"type": "cpu"})
    printer.on_event("step", "amp")
    assert out.getvalue().endswith("\r\033[K  ....  training (mixed precision) …")
    printer.on_event("check", CHECKS[2])
    assert "\r\033[K  FAIL  amp-training" in out.getvalue()
    printer.finish(report(CHECKS[2:], {"type": "cpu"}))
    assert out.getvalue().rstrip().endswith("FAILED (device: cpu): 0 passed, 0 info, 0 warnings, 1 failed, 0 skipped in 1.5 s")  # fmt: skip


def test_the_command_prints_while_the_child_works() -> None:
    """In a pipe, the first check line comes while verify is still running."""
    proc = subprocess.Popen(
        [PY, "-m", "egpu_setup", "verify", "--device", "cpu", "--quick", "--python", PY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        while first and "torch-import" not in first:
            first = proc.stdout.readline()
        running = proc.poll() is None
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "PASS  torch-import" in first and running
    assert proc.returncode == 0, err
    assert "OK (device: cpu)" in rest
    path = err.strip().splitlines()[-1].removeprefix("report: ")
    assert Path(path).is_file() and json.loads(Path(path).read_text())["device_kind"] == "cpu"


def test_json_mode_prints_only_the_document() -> None:
    res = subprocess.run(
        [PY, "-m", "egpu_setup", "verify", "--device", "cpu", "--quick", "--json", "--python", PY],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # the whole of stdout is one document
    assert doc["device_kind"] == "cpu" and doc["device"]["type"] == "cpu"
    info = [c for c in doc["checks"] if c["status"] == "info"]
    assert {c["id"] for c in info} == {"matmul-fp32", "matmul-bf16", "amp-speedup"}
    assert all(c["ok"] is True and c["informational"] is True for c in info)
    assert res.stderr.strip().splitlines()[-1].startswith("report: ")
