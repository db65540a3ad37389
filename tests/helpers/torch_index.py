"""The PyTorch wheel-index page `matrix update` reads, served on 127.0.0.1 in the ways it can
answer: the recorded good page (with an ETag, 304 on a repeat), malformed or truncated pages, a
dropped connection, 503s before success. Used by the fetch tests and the matrix-pin tests."""

from __future__ import annotations

import http.server
import socket
from pathlib import Path

from helpers.loopback import LoopbackServer

PAGES = Path(__file__).parents[1] / "data" / "torch-index"
ETAG = '"torch-index-v1"'


def page(mode: str) -> bytes:
    """The body for a mode. "truncated" is good.html cut a third of the way in, mid-line: what
    a proxy that drops the connection leaves (derived, so it can never drift from good.html)."""
    if mode == "truncated":
        good = (PAGES / "good.html").read_bytes()
        return good[: len(good) // 3]
    return (PAGES / f"{mode}.html").read_bytes()


class IndexServer:
    """A tiny index on the loopback server: `mode` decides how /whl/torch/ answers."""

    def __init__(self) -> None:
        self.mode = "good"
        self.fail_first = 0
        self.loopback = LoopbackServer(respond=self._respond)
        self.requests = self.loopback.requests
        self.url = f"{self.loopback.url}whl/"

    def _respond(self, h: http.server.BaseHTTPRequestHandler) -> bool:
        if h.path != "/whl/torch/":
            h.send_error(404)
        elif self.fail_first > 0:
            self.fail_first -= 1
            h.send_error(503)
        elif self.mode == "drop":
            # Read the request, then hang up without a status line.
            h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
        elif h.headers.get("If-None-Match") == ETAG and self.mode == "good":
            h.send_response(304)
            h.send_header("ETag", ETAG)
            h.end_headers()
        else:
            body = page(self.mode)
            h.send_response(200)
            h.send_header("Content-Type", "text/html; charset=utf-8")
            h.send_header("Content-Length", str(len(body)))
            if self.mode == "good":
                h.send_header("ETag", ETAG)
            h.end_headers()
            h.wfile.write(body)
        return True

    def close(self) -> None:
        self.loopback.close()
