"""The output of the commands a run starts: on stderr as it comes, indented under its step."""

from __future__ import annotations

import sys


def show_line(line: str) -> None:
    """One line of a child's output (apt, pip, update-initramfs), under the step it belongs to."""
    sys.stderr.write("  " + line + "\n")
    sys.stderr.flush()
