"""Print verify's table while the run happens, one check at a time.

A pipe or a file gets plain lines, exactly the lines of `render_table` (so a log reads the same
as the final table). A terminal also gets a live line naming the step that runs now, replaced
by each result as it arrives. With --json nothing of this is printed: stdout is the document.
"""

from __future__ import annotations

from typing import Any, TextIO

from egpu_setup.verify.checks import Check
from egpu_setup.verify.report import VerifyReport, render_check, render_header, render_summary

_CLEAR = "\r\033[K"  # carriage return, erase to the end of the line (ECMA-48 EL)

STEP_TEXT = {
    "import": "importing torch",
    "cuda-init": "initialising CUDA",
    "identity": "finding the GPU",
    "allocation": "allocating GPU memory",
    "bandwidth": "measuring host<->device bandwidth",
    "matmul": "measuring matmul throughput",
    "amp": "training (mixed precision)",
    "throughput": "measuring training throughput",
    "burn-in": "burn-in",
    "ddp": "DDP smoke test",
}


class LivePrinter:
    """Receives verify's events (`on_event`) and prints the table as it grows."""

    def __init__(self, python: str, stream: TextIO, tty: bool):
        self.python = python
        self.stream = stream
        self.tty = tty
        self.device: dict[str, Any] = {}
        self.pending: list[Check] = []
        self.printed = 0  # checks written so far, in report order
        self.header = False
        self.live = False  # a live line is on the screen

    def on_event(self, kind: str, payload: Any) -> None:
        if kind == "device":
            self.device.update(payload)
            self._flush()
        elif kind == "check":
            self.pending.append(payload)
            if self.header:
                self._flush()
        elif kind == "step" and self.tty and payload in STEP_TEXT:
            self.stream.write(f"{_CLEAR}  ....  {STEP_TEXT[payload]} …")
            self.stream.flush()
            self.live = True

    def finish(self, report: VerifyReport) -> None:
        """The checks that came at the end (a timeout, a missing GPU) and the verdict."""
        if not self.header:
            self.device = dict(report.device)
        self.pending = list(report.checks[self.printed :])
        self._flush(force=True)
        for line in render_summary(report):
            self._write(line)

    def _flush(self, force: bool = False) -> None:
        if not self.header:
            if not (self.device or force):
                return  # the header names the device: wait for it (a second or two)
            self._write(render_header(self.device, self.python))
            self._write("")
            self.header = True
        for check in self.pending:
            for line in render_check(check):
                self._write(line)
            self.printed += 1
        self.pending = []

    def _write(self, text: str) -> None:
        if self.live:  # the result replaces the live line
            text = _CLEAR + text
            self.live = False
        self.stream.write(text + "\n")
        self.stream.flush()
