"""Hostile: `matrix update` has one overall deadline, whatever the server does.

Was: a server trickling a byte every 2 s kept each read under the socket timeout and held the
command for ever. The trickle here is real: a loopback server writes one byte at a time.
"""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest

from egpu_setup.compat import fetch
from egpu_setup.errors import EgpuSetupError
from helpers.loopback import LoopbackServer


def test_a_trickling_server_is_cut_off_at_the_deadline(tmp_path: Path) -> None:
    stop = threading.Event()

    def trickle(h: http.server.BaseHTTPRequestHandler) -> bool:
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.send_header("Content-Length", "100000")
        h.end_headers()
        while not stop.is_set():  # each byte well inside the socket read timeout
            try:
                h.wfile.write(b"<")
                h.wfile.flush()
            except OSError:
                break
            time.sleep(0.2)
        return True

    with LoopbackServer(respond=trickle) as server:
        try:
            with pytest.raises(EgpuSetupError, match=r"no complete answer within 1\.5 s") as err:
                fetch.update_matrix(
                    tmp_path, server.url, timeout=(2.0, 5.0), retries=0, deadline_s=1.5
                )
        finally:
            stop.set()
    assert err.value.hint
    assert not list(tmp_path.glob("*.json"))  # no overlay written from half a page
