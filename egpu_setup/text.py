"""Text from the machine or a bundle on its way to a terminal."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

TYPE_CHECKING = False  # typing costs 2 ms of every start; these names are for mypy only
if TYPE_CHECKING:
    from typing import Any


def plain(text: str) -> str:
    """One terminal line: control characters (escape sequences, newlines) become '?'.

    Thunderbolt device names come from the plugged device's firmware, and bundle files from
    whoever sent them: printed raw, an escape sequence in them would drive the terminal."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


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
