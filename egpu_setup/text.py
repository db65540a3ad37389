"""Text from the machine or a bundle on its way to a terminal."""

from __future__ import annotations


def plain(text: str) -> str:
    """One terminal line: control characters (escape sequences, newlines) become '?'.

    Thunderbolt device names come from the plugged device's firmware, and bundle files from
    whoever sent them: printed raw, an escape sequence in them would drive the terminal."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)
