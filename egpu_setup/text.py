"""Text from the machine or a bundle on its way to a terminal."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

TYPE_CHECKING = False  # typing costs 2 ms of every start; these names are for mypy only
if TYPE_CHECKING:
    from typing import Any


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\v": "\\v", "\f": "\\f"}


def _escaped(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def plain(text: str) -> str:
    """One terminal line: every character that is not printable (ESC and the other C0/C1
    controls, CR, VT, FF, newlines, bidirectional overrides) shown escaped, as `\\x1b` or `\\r`.

    The one sanitizer for text from the machine, a bundle or a report on its way to a terminal:
    Thunderbolt device names come from the plugged device's firmware, process names from
    whoever started them, bundle files and reports from whoever sent them. Printed raw, an
    escape sequence in them would drive root's terminal (rewrite lines, retitle it, hide an
    error); a carriage return would draw over what came before. The escaped form keeps the
    evidence readable. Idempotent: escaping adds only printable characters."""
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in text)


def lines(text: str) -> str:
    """Several terminal lines: `plain` on each, the newlines between them kept."""
    return "\n".join(plain(line) for line in text.split("\n"))


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+")


def redact_urls(text: str) -> str:
    """`text` with every URL's secrets masked: the values of its query string, its fragment and
    any password in it. For what is kept where others can read it (the 0644 install report, the
    journal): an index URL such as `https://mirror.lab/whl/cu128?token=…` still works for pip,
    but its token must not travel with the reports a lab collects."""
    return _URL.sub(_redact_one, text)


def _redact_one(match: re.Match[str]) -> str:
    url = match.group(0)
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:  # not parseable as a URL: nothing of it is kept
        return "***"
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}" if ":" in user else netloc
    query = "&".join(
        f"{key}=***" if sep else "***"
        for key, sep, _ in (p.partition("=") for p in parts.query.split("&"))
    )
    return urlunsplit(
        (
            parts.scheme,
            netloc,
            parts.path,
            query if parts.query else "",
            "***" if parts.fragment else "",
        )
    )


def redact_tree(value: Any) -> Any:
    """`redact_urls` over every string of a JSON-shaped value (dicts, lists, strings)."""
    if isinstance(value, str):
        return redact_urls(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return value


def terminal_width(err: bool = False) -> int | None:
    """The columns of the terminal stdout (stderr with `err`) is, or None when it is piped or a
    file (what a script reads stays one line per item, as --json always does)."""
    import sys

    stream = sys.stderr if err else sys.stdout
    if not stream.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")  # as shutil.get_terminal_size honours it
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except OSError:
        return None


def fit(text: str, width: int | None) -> str:
    """`text` with each line longer than `width` wrapped at spaces, its continuation lines
    indented four past the line's own indent, as --help wraps; unchanged with width None."""
    if width is None:
        return text
    import textwrap

    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * min(len(line) - len(line.lstrip(" ")) + 4, width // 2)
        out += textwrap.wrap(
            line,
            width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
            drop_whitespace=True,
        ) or [line]
    return "\n".join(out)
