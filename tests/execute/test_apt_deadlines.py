"""apt's download deadlines, for real: apt-get in a Debian 12 root fetching a package from a
server on 127.0.0.1 that stops answering, or trickles a byte at a time.

A silent server: apt gives it up after Acquire::http::Timeout (the step's fetch_timeout, set
on apt-get's command line), and the error names the server. A server that keeps sending too
slowly never trips that timer: the step's overall deadline ends apt-get (its whole session,
host/process.py), and the error names the server it was downloading from.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_setup.errors import ExecutionError, TimedOut
from egpu_setup.execute import apt as execute_apt
from egpu_setup.execute.files import Context
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.installed import present_packages
from egpu_setup.plan.steps import AptInstall
from egpu_setup.state.manifest import Manifest
from egpu_setup.state.paths import StatePaths
from helpers import debroot as _debroot
from helpers.local_apt import build_deb, local_repository
from helpers.loopback import LoopbackServer

pytestmark = pytest.mark.debootstrap

PACKAGE = "lab-slow"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], str]]:
    """(a Debian 12 root whose lab source is a loopback server, how that server answers a .deb
    - "serve", "silent" or "trickle" - which the test sets, the server's URL)."""
    root = _debroot.copy_or_skip("bookworm", tmp_path / "root")
    mode = {"deb": "serve"}
    stop = threading.Event()

    def respond(handler: http.server.BaseHTTPRequestHandler) -> bool:
        if not handler.path.endswith(".deb") or mode["deb"] == "serve":
            return False
        if mode["deb"] == "silent":
            stop.wait(120)  # the request read, no byte back
            return True
        data = (root / "tmp/repo" / Path(handler.path).name).read_bytes()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        for byte in data:  # a byte every 0.3 s: apt's stall timer never runs out
            if stop.wait(0.3):
                break
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
        return True

    with LoopbackServer(root=root / "tmp/repo", respond=respond) as srv:
        deb = build_deb(root, PACKAGE, files=("usr/lib/lab-slow/data",))
        local_repository(root, [deb], uri=srv.url)
        try:
            yield root, mode, srv.url.rstrip("/")
        finally:
            stop.set()


def _install(root: Path, step: AptInstall) -> None:
    ctx = Context(RootHost(root), Manifest.load(StatePaths.for_root(root)), "test-run")
    execute_apt.install(ctx, step)


def test_apt_gives_up_a_silent_server_and_the_error_names_it(
    served: tuple[Path, dict[str, str], str],
) -> None:
    root, mode, url = served
    mode["deb"] = "silent"
    step = AptInstall((PACKAGE,), True, lock_timeout=5, fetch_timeout=2, deadline=120)
    argv = step.argv()
    assert "Acquire::http::Timeout=2" in argv and "Acquire::https::Timeout=2" in argv
    started = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        _install(root, step)
    # apt's own timer (and its retries, Acquire::Retries), well before the step's deadline
    assert time.monotonic() - started < 90
    err = info.value
    assert not isinstance(err, TimedOut)
    assert f"could not download from {url}" in err.message, err.message
    assert "silent for 2 s" in err.message and err.exit_code == 1
    assert "check the network and that server" in (err.hint or "")
    assert PACKAGE not in present_packages(RootHost(root))


def test_a_trickling_server_meets_the_steps_deadline_and_is_named(
    served: tuple[Path, dict[str, str], str],
) -> None:
    root, mode, url = served
    mode["deb"] = "trickle"
    step = AptInstall((PACKAGE,), True, lock_timeout=1, fetch_timeout=30, deadline=5)
    started = time.monotonic()
    with pytest.raises(TimedOut) as info:
        _install(root, step)
    took = time.monotonic() - started
    assert 6 <= took < 30, took  # the deadline is the lock wait plus the step's own
    err = info.value
    assert "did not finish within 6 s" in err.message, err.message
    assert f"it was downloading from {url}" in err.message
    assert err.exit_code == 1 and "stalled mirror" in (err.hint or "")
    # recorded before apt ran, though nothing got in: rollback --packages finds nothing to do
    recorded = Manifest.load(StatePaths.for_root(root)).packages
    assert [p["name"] for p in recorded] == [PACKAGE]
    assert PACKAGE not in present_packages(RootHost(root))


def test_a_server_that_answers_installs(served: tuple[Path, dict[str, str], str]) -> None:
    root, _mode, _url = served
    _install(root, AptInstall((PACKAGE,), True, fetch_timeout=2, deadline=120))
    assert present_packages(RootHost(root))[PACKAGE] == "installed"
