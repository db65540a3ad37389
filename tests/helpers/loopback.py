"""One HTTP server on 127.0.0.1 for every test that needs the network: a PEP 503 index, the
PyTorch wheel-index page `matrix update` reads, an apt key.

It serves a directory, or answers each GET through `respond(handler) -> bool` first (True: it
answered); every request is logged (path and headers), so a test can prove what was asked for and
where a file came from. Bound to port 0: the kernel picks a free port, tests run in parallel.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Respond = Callable[[http.server.BaseHTTPRequestHandler], bool]


class LoopbackServer:
    """`with LoopbackServer(root=dir) as srv: srv.url` -> "http://127.0.0.1:PORT/"."""

    def __init__(self, root: Path | None = None, respond: Respond | None = None) -> None:
        self.requests: list[dict[str, str]] = []
        log, serve_dir = self.requests, str(root) if root is not None else None

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, directory=serve_dir, **kw)

            def log_message(self, *args: object) -> None:
                pass  # the request log below is the record; stderr stays quiet

            def do_GET(self) -> None:
                log.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                if respond is not None and respond(self):
                    return
                if serve_dir is None:
                    self.send_error(404)
                    return
                super().do_GET()

            def do_HEAD(self) -> None:
                log.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                if serve_dir is None:
                    self.send_error(404)
                    return
                super().do_HEAD()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    @property
    def paths(self) -> list[str]:
        """The path of every request, in order."""
        return [r["path"] for r in self.requests]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
