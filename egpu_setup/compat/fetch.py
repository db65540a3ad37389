"""`matrix update`: read the PyTorch wheel index, validate it, cache it as an overlay.

The only module of compat/ that touches the network or the disk (requests, the state dir). The
shipped snapshot stays in force whenever anything here fails: offline, a timeout, a malformed or
truncated page. Only a page that parses and covers the snapshot replaces the cached overlay, and it
is written atomically (temp file in the same directory, fsync, rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from egpu_setup.compat.index_url import check_index_url, guard_redirects
from egpu_setup.compat.overlay import OVERLAY_SCHEMA, STATE_ENV, overlay_path, state_dir
from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.log import get_logger
from egpu_setup.state.atomic import atomic_write

if TYPE_CHECKING:
    import requests

    from egpu_setup.compat.matrix import Matrix

log = get_logger("egpu_setup.matrix")


INDEX_ENV = "EGPU_SETUP_TORCH_INDEX"


CACHE_DIR = "cache/torch-index"


Timeout = float | tuple[float, float]  # requests: (connect, read) or both
TIMEOUT = (5.0, 30.0)  # connect, read: the all-variants page is a few MB


RETRIES = 3


# The whole fetch, retries included: the per-read timeout alone never fires for a server that
# trickles a byte every few seconds, and would hold `matrix update` for ever.
DEADLINE_S = 120.0


BACKOFF = 0.5  # seconds, doubled per retry (urllib3 Retry backoff_factor)


MAX_PAGE = 64 * 1024 * 1024


# Wheels the resolver can use: torch X.Y.Z+cpu / +cuNNN, CPython (not free-threaded), Linux
# x86_64 (WSL2 uses the same wheels). The file name is read by packaging.utils (the wheel file
# name convention, https://packaging.python.org/en/latest/specifications/binary-distribution-format/).
_LOCAL_RE = re.compile(r"cpu|cu\d{3}")
_CPYTHON_RE = re.compile(r"cp\d{2,3}")
_PLATFORM_RE = re.compile(r"(?:manylinux\w*|linux)_x86_64")


# A truncated page (proxy cut, partial CDN object) still parses; it must also cover the snapshot.
MIN_COVERAGE = 0.9


FIRST_MAJOR = 2  # the matrix starts at torch 2.0; 1.x wheels on the index are ignored


def index_base(explicit: str | None = None) -> str:
    """The PyTorch wheel index root ('…/whl/'): --index-url, EGPU_SETUP_TORCH_INDEX or the data.

    The same rule as every other index URL (compat/index_url.py); this reader speaks http(s)."""
    base = explicit or os.environ.get(INDEX_ENV)
    if not base:
        from egpu_setup.compat.matrix import load_snapshot

        base = load_snapshot().index_url.split("{variant}")[0]
    check_index_url(base)
    if urlsplit(base).scheme not in ("http", "https"):
        raise UsageError(
            f"--index-url {base!r}: `matrix update` reads the index over https",
            "pass the https URL of your lab's mirror, e.g. --index-url https://mirror.lab/whl/",
        )
    return base.rstrip("/") + "/"


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []
        self.saw_html = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("html", "body"):
            self.saw_html = True
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def _torch_wheel(file_name: str) -> tuple[str, str, set[str]] | None:
    """(release "2.5.1", local "cu121", Pythons {"3.12"}) of a torch wheel the resolver can use;
    None for any other file."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion

    if not file_name.endswith(".whl"):
        return None
    try:
        name, version, _, tags = parse_wheel_filename(file_name)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    if name != "torch" or len(version.release) != 3 or version.major < FIRST_MAJOR:
        return None
    if version.pre or version.post is not None or version.dev is not None or version.epoch:
        return None
    if not version.local or not _LOCAL_RE.fullmatch(version.local):
        return None
    pythons = {
        f"{t.interpreter[2]}.{t.interpreter[3:]}"
        for t in tags
        if t.interpreter == t.abi
        and _CPYTHON_RE.fullmatch(t.interpreter)
        and _PLATFORM_RE.fullmatch(t.platform)
    }
    return (version.base_version, version.local, pythons) if pythons else None


def parse_index(html: str) -> dict[str, dict[str, list[str]]]:
    """A PEP 503 project page -> {torch version: {variant: [python "3.12", ...]}}.

    Only torch 2.x CPython Linux x86_64 wheels with a local label (+cu128, +cpu) count;
    free-threaded builds (cp313t), other platforms and 1.x are skipped. ValueError when the
    page is not an index page."""
    parser = _Anchors()
    try:
        parser.feed(html)
        parser.close()
    except Exception as exc:  # html.parser raises plain exceptions on broken markup
        raise ValueError(f"not HTML: {exc}") from exc
    if not parser.hrefs:
        raise ValueError("no links: not a PEP 503 index page")
    out: dict[str, dict[str, set[str]]] = {}
    for href in parser.hrefs:
        found = _torch_wheel(unquote(urlsplit(href).path.rsplit("/", 1)[-1]))
        if found is None:
            continue
        version, local, pythons = found
        out.setdefault(version, {}).setdefault(local, set()).update(pythons)
    if not out:
        raise ValueError(f"{len(parser.hrefs)} links but no torch Linux x86_64 wheels")
    return {
        v: {k: sorted(p, key=lambda s: tuple(map(int, s.split(".")))) for k, p in variants.items()}
        for v, variants in out.items()
    }


def validate(parsed: dict[str, dict[str, list[str]]], snapshot_versions: list[str]) -> list[str]:
    """Refuse a page that does not cover the shipped releases; return the versions it adds."""
    missing = [v for v in snapshot_versions if v not in parsed]
    covered = 1 - len(missing) / max(1, len(snapshot_versions))
    if covered < MIN_COVERAGE or (snapshot_versions and snapshot_versions[0] in missing):
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise ValueError(
            f"the page lacks {len(missing)} known torch releases ({shown}): truncated or wrong page"
        )
    return sorted(set(parsed) - set(snapshot_versions), key=lambda v: tuple(map(int, v.split("."))))


@dataclass(frozen=True)
class UpdateResult:
    status: str  # "updated" / "not-modified"
    url: str
    fetched_at: str
    versions: int
    new_versions: tuple[str, ...]
    changes: tuple[str, ...]
    path: str


def _session(retries: int, backoff: float) -> requests.Session:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        backoff_factor=backoff,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=frozenset({"GET"}),
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    from egpu_setup import __version__

    session.headers["User-Agent"] = f"egpu-setup/{__version__} (matrix update)"
    return session


class _Deadline(Exception):
    """The overall deadline of the fetch passed (raised from SIGALRM or the read loop)."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds`, raising _Deadline wherever the fetch is blocked (a socket read
    in the headers, a retry's back-off): only the main thread can take a signal, so elsewhere
    the read loop's own check is all there is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: FrameType | None) -> None:
        raise _Deadline()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _fetch(
    url: str,
    cache: Path,
    timeout: Timeout,
    retries: int,
    backoff: float,
    deadline_s: float = DEADLINE_S,
) -> tuple[str, str, dict[str, str]]:
    """GET `url` with the cached ETag -> (body, 'fetched'|'not-modified', validators), all of it
    within `deadline_s` seconds."""
    hint = "check the network or --index-url; the shipped matrix stays in force"
    try:
        with _alarm(deadline_s):
            return _get(url, cache, timeout, retries, backoff, time.monotonic() + deadline_s)
    except _Deadline:
        raise EgpuSetupError(f"{url}: no complete answer within {deadline_s:g} s", hint) from None


def _get(
    url: str, cache: Path, timeout: Timeout, retries: int, backoff: float, deadline: float
) -> tuple[str, str, dict[str, str]]:
    import requests

    body_file, meta_file = cache / "torch.html", cache / "torch.meta.json"
    headers: dict[str, str] = {}
    meta: dict[str, str] = {}
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if meta.get("url") == url and body_file.is_file():
            if meta.get("etag"):
                headers["If-None-Match"] = meta["etag"]
            if meta.get("last_modified"):
                headers["If-Modified-Since"] = meta["last_modified"]
    except (OSError, ValueError):
        meta = {}
    hint = "check the network or --index-url; the shipped matrix stays in force"
    try:
        with _session(retries, backoff) as session:
            guard_redirects(session, url)  # same host, never down to http (index_url.py)
            resp = session.get(url, headers=headers, timeout=timeout, stream=True)
            if resp.status_code == 304 and headers:
                return body_file.read_text(encoding="utf-8"), "not-modified", meta
            if resp.status_code != 200:
                raise EgpuSetupError(f"{url} answered HTTP {resp.status_code}", hint)
            chunks, size = [], 0
            for chunk in _chunks(resp, deadline):
                size += len(chunk)
                if size > MAX_PAGE:
                    raise EgpuSetupError(f"{url}: page larger than {MAX_PAGE >> 20} MiB", hint)
                chunks.append(chunk)
            text = b"".join(chunks).decode(resp.encoding or "utf-8", errors="replace")
            validators = {"url": url}
            if resp.headers.get("ETag"):
                validators["etag"] = resp.headers["ETag"]
            if resp.headers.get("Last-Modified"):
                validators["last_modified"] = resp.headers["Last-Modified"]
            return text, "fetched", validators
    except requests.exceptions.Timeout as exc:
        raise EgpuSetupError(f"{url}: timed out after {retries} retries", hint) from exc
    except requests.exceptions.RequestException as exc:
        raise EgpuSetupError(f"could not read {url}: {type(exc).__name__}", hint) from exc


def _chunks(resp: requests.Response, deadline: float) -> Iterator[bytes]:
    """The body as it arrives, checking the deadline after each read: urllib3's read1 returns
    whatever one socket read gave (iter_content would wait for 64 KiB, one trickled byte at a
    time), so a slow server cannot keep a read going past it."""
    read1 = getattr(resp.raw, "read1", None)
    chunks = iter(lambda: read1(1 << 16, decode_content=True), b"") if read1 else None
    for chunk in chunks or resp.iter_content(1 << 16):
        if time.monotonic() > deadline:
            raise _Deadline()
        yield chunk


def update_matrix(
    state: str | os.PathLike[str] | None = None,
    index_url: str | None = None,
    *,
    timeout: Timeout = TIMEOUT,
    retries: int = RETRIES,
    backoff: float = BACKOFF,
    deadline_s: float = DEADLINE_S,
) -> UpdateResult:
    """Fetch `<index>/torch/`, validate it against the snapshot, then replace the overlay."""
    from egpu_setup.compat.matrix import load_snapshot

    snapshot = load_snapshot()
    base = index_base(index_url)
    url = base + "torch/"
    root = state_dir(state)
    cache = root / CACHE_DIR
    text, status, validators = _fetch(url, cache, timeout, retries, backoff, deadline_s)
    try:
        parsed = parse_index(text)
        new_versions = validate(parsed, [t.version for t in snapshot.torch])
    except ValueError as exc:
        raise EgpuSetupError(
            f"{url}: {exc}",
            f"the shipped matrix ({snapshot.snapshot}) stays in force; "
            "try again later or check --index-url",
        ) from exc
    try:
        if status == "fetched":
            atomic_write(cache / "torch.html", text.encode(), 0o644)
            atomic_write(cache / "torch.meta.json", json.dumps(validators).encode(), 0o644)
        fetched_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        overlay = {
            "schema": OVERLAY_SCHEMA,
            "fetched_at": fetched_at,
            "index_url": base,
            "etag": validators.get("etag"),
            "releases": parsed,
        }
        path = overlay_path(root)
        atomic_write(path, json.dumps(overlay, indent=1, sort_keys=True).encode(), 0o644)
    except OSError as exc:
        raise EgpuSetupError(
            f"cannot write the matrix cache under {root}: {exc.strerror}",
            f"run as root, or set {STATE_ENV} to a writable directory",
        ) from exc
    return UpdateResult(
        status="updated" if status == "fetched" else "not-modified",
        url=url,
        fetched_at=fetched_at,
        versions=len(parsed),
        new_versions=tuple(new_versions),
        changes=tuple(_changes(snapshot, parsed)),
        path=str(path),
    )


def _changes(snapshot: Matrix, parsed: dict[str, dict[str, list[str]]]) -> list[str]:
    """Where the live index and the shipped snapshot disagree on variants (for the user)."""
    out = []
    for row in snapshot.torch:
        live = parsed.get(row.version)
        if live is None:
            continue
        mine = {v.name for v in row.variants}
        added, gone = sorted(set(live) - mine), sorted(mine - set(live))
        if added:
            out.append(f"torch {row.version}: index also has {', '.join(added)}")
        if gone:
            out.append(f"torch {row.version}: index lacks {', '.join(gone)}")
    return out
