"""The one rule for a torch index URL (`install`, `bundle` and `matrix update --index-url`).

https for anything remote; plain http only on this machine (a loopback mirror), where nothing on
the way can swap a wheel; file:// for a directory index. No spaces or control characters, and no
credentials: the URL is printed in the plan and kept in the reports a lab collects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from egpu_setup.errors import UsageError

if TYPE_CHECKING:  # requests is imported where a request is made, never at startup
    import requests

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


# -- redirects -------------------------------------------------------------------------------------

MAX_REDIRECTS = 5


def redirect_problem(source: str, target: str) -> str | None:
    """Why following a redirect from `source` to `target` is refused, or None when it stays on
    the same host and keeps https (http only from a loopback mirror to itself): a mirror that
    redirects elsewhere, or down to plain http, would hand pip or `matrix update` files from a
    server nobody chose, where anything on the way can swap a wheel."""
    src, dst = urlsplit(source), urlsplit(target)
    if (dst.hostname or "").lower() != (src.hostname or "").lower():
        return f"it redirects to another host ({dst.hostname or target})"
    if src.scheme == "https" and dst.scheme != "https":
        return f"it redirects from https down to {dst.scheme or 'no scheme'}"
    if dst.scheme not in ("https", "http"):
        return f"it redirects to a {dst.scheme or 'relative'} URL"
    return None


def guard_redirects(session: requests.Session, url: str) -> None:
    """Make `session` refuse (UsageError, exit 2) any redirect that redirect_problem refuses,
    before it is followed: a response hook sees every response of a redirect chain
    (https://requests.readthedocs.io/en/latest/user/advanced/#event-hooks)."""
    from urllib.parse import urljoin

    def check(resp: requests.Response, *args: object, **kwargs: object) -> None:
        if not resp.is_redirect:
            return
        target = urljoin(resp.url, resp.headers.get("location", ""))
        why = redirect_problem(resp.url, target)
        if why is not None:
            raise UsageError(
                f"index {_shown(url)}: {why}; not followed",
                "point --index-url at the server that holds the files (https), or fix the "
                "mirror's redirect",
            )

    session.hooks["response"].append(check)
    session.max_redirects = MAX_REDIRECTS


def check_index_redirects(url: str, project: str = "torch", timeout: float = 30.0) -> None:
    """Before pip or uv is handed `url` (they follow redirects on their own): ask for the
    project page they will read first, and refuse a redirect that leaves the host or drops to
    plain http (UsageError). file:// indexes have none. A server that does not answer is left
    to the installer, which says so with its own retries."""
    if urlsplit(url).scheme not in ("http", "https"):
        return
    import requests

    page = url.rstrip("/") + f"/{project}/"
    with requests.Session() as session:
        guard_redirects(session, url)
        try:
            session.get(page, timeout=timeout, stream=True).close()
        except requests.exceptions.TooManyRedirects:
            raise UsageError(
                f"index {_shown(url)}: more than {MAX_REDIRECTS} redirects",
                "point --index-url at the server that holds the files",
            ) from None
        except requests.exceptions.RequestException:
            return


# -- credentials -----------------------------------------------------------------------------------


def has_secret(url: str) -> bool:
    """True when the URL carries something secret-looking: a query (`?token=`), a fragment or a
    password (what text.redact_urls masks)."""
    parts = urlsplit(url)
    return bool(parts.query or parts.fragment or parts.password)


def installer_index(url: str, uv: bool) -> tuple[list[str], dict[str, str]]:
    """(argv words, environment) that hand the index `url` to pip or uv. A URL with a secret
    goes through the child's environment (PIP_INDEX_URL, or uv's UV_INDEX_URL), never its
    argv: /proc/PID/cmdline is readable by every user of the machine (proc(5)), a process's
    environ only by its owner."""
    if not has_secret(url):
        return ["--index-url", url], {}
    return [], {("UV_INDEX_URL" if uv else "PIP_INDEX_URL"): url}


def _shown(url: str) -> str:
    from egpu_setup.text import plain, redact_urls

    return plain(redact_urls(url))
