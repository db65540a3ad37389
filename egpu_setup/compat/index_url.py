"""The one rule for a torch index URL (`install`, `bundle` and `matrix update --index-url`).

https for anything remote; plain http only on this machine (a loopback mirror), where nothing on
the way can swap a wheel; file:// for a directory index. No spaces or control characters, and no
credentials: the URL is printed in the plan and kept in the reports a lab collects.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from egpu_setup.errors import UsageError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_index_url(url: str) -> str:
    """`url`, when the rule allows it; UsageError (exit 2) naming what is wrong otherwise."""
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise UsageError(
            f"--index-url {url!r}: a URL has no spaces or control characters",
            "pass one URL: the mirror of the resolved variant's index",
        )
    parts = urlsplit(url)
    if parts.username or parts.password:
        # It would be printed in the plan and kept in reports a lab collects.
        raise UsageError(
            "--index-url carries credentials: they would end up in the plan and the reports",
            "put them in ~/.netrc (pip and uv read it) and pass the URL without them",
        )
    loopback = parts.hostname in LOOPBACK
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and loopback:
        return url
    if parts.scheme == "file" and parts.path:
        return url
    raise UsageError(
        f"--index-url {url!r}: only https:// (or http:// on 127.0.0.1, file://) is accepted",
        "pass the https URL of your lab's mirror of the PyTorch index",
    )
