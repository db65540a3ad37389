"""A PEP 503 "simple" index on 127.0.0.1, served by a real http.server from a temp directory.

Holds the torch 2.13.0 CPU wheel that `pip download` finds with this machine's own pip
configuration (plus its dependencies), and small wheels built here. Requests are logged so a
test can prove where pip/uv got their files from.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

from helpers.loopback import LoopbackServer

TORCH_SPEC = "torch==2.13.0"


def build_wheel(
    directory: Path,
    name: str,
    version: str,
    body: str = "",
    *,
    script: bool = False,
    tag: str = "py3-none-any",
    requires: tuple[str, ...] = (),
) -> Path:
    """A minimal, valid wheel (METADATA, WHEEL, RECORD with hashes); `script`: a console script
    named `name` (entry_points.txt), which the installer writes into bin/ as torch's torchrun
    is. `tag`: its compatibility tag (PEP 425), a platform one for a stand-in of a binary wheel
    such as torch's; `requires`: its Requires-Dist lines."""
    mod = name.replace("-", "_")
    dist = f"{mod}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{mod}/__init__.py": f"__version__ = {version!r}\ndef main():\n    print(__version__)\n"
        + body,
        f"{dist}.dist-info/METADATA": metadata,
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: egpu-setup-tests\n"
        f"Root-Is-Purelib: {'true' if tag.endswith('-any') else 'false'}\nTag: {tag}\n",
    }
    if script:
        files[f"{dist}.dist-info/entry_points.txt"] = f"[console_scripts]\n{name} = {mod}:main\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    out = directory / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return out


def download_torch(directory: Path) -> list[Path]:
    """torch 2.13.0 (CPU) and its dependencies, as this machine's pip finds them."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / ".complete"
    if not marker.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "-d", str(directory), TORCH_SPEC],
            check=True,
        )
        marker.write_text("ok\n")
    return sorted(directory.glob("*.whl"))


def cache_dir() -> Path:
    base = os.environ.get("EGPU_SETUP_TEST_CACHE") or tempfile.gettempdir()
    return Path(base) / "wheels-torch-2.13.0"


class LocalIndex:
    """`with LocalIndex(wheels) as idx: idx.url` -> "http://127.0.0.1:PORT/simple/".

    trickle=S: the pages answer at once, every wheel one byte each S seconds (a stalled mirror
    that never quite goes silent), until the client hangs up or the index closes."""

    def __init__(self, wheels: list[Path], *, trickle: float | None = None) -> None:
        self.trickle = trickle
        self._closed = threading.Event()
        self._tmp = tempfile.TemporaryDirectory(prefix="egpu-setup-index-")
        self.dir = Path(self._tmp.name)
        by_project: dict[str, list[Path]] = {}
        for whl in wheels:
            by_project.setdefault(canonicalize_name(whl.name.split("-")[0]), []).append(whl)
        simple = self.dir / "simple"
        (self.dir / "files").mkdir(parents=True)
        for project, files in by_project.items():
            (simple / project).mkdir(parents=True)
            links = []
            for whl in files:
                target = self.dir / "files" / whl.name
                os.symlink(whl.resolve(), target)
                digest = hashlib.sha256(whl.read_bytes()).hexdigest()
                href = f"../../files/{html.escape(whl.name.replace('+', '%2B'))}#sha256={digest}"
                links.append(f'<a href="{href}">{html.escape(whl.name)}</a><br>')
            (simple / project / "index.html").write_text(
                "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
            )
        (simple / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n"
            + "\n".join(f'<a href="{p}/">{p}</a>' for p in sorted(by_project))
            + "\n</body></html>\n"
        )

    def __enter__(self) -> LocalIndex:
        self.server = LoopbackServer(
            root=self.dir, respond=self._trickle if self.trickle is not None else None
        )
        return self

    def replace(self, old: Path, new: Path) -> None:
        """Serve `new` where `old` was, at the same URL, its page listing new's sha256 (a
        mirror that fixed a broken file in place)."""
        served = self.dir / "files" / old.name
        served.unlink()
        os.symlink(new.resolve(), served)
        for page in (self.dir / "simple").glob("*/index.html"):
            before, after = (hashlib.sha256(w.read_bytes()).hexdigest() for w in (old, new))
            page.write_text(page.read_text().replace(before, after))

    def _trickle(self, h: http.server.BaseHTTPRequestHandler) -> bool:
        if not h.path.startswith("/files/"):
            return False
        body = (self.dir / h.path.removeprefix("/")).read_bytes()
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        for i in range(len(body)):
            if self._closed.wait(self.trickle):
                break
            try:
                h.wfile.write(body[i : i + 1])
                h.wfile.flush()
            except OSError:  # the client gave up: what the test waits for
                break
        h.close_connection = True
        return True

    @property
    def requests(self) -> list[str]:
        """The path of every request the index answered, in order."""
        return self.server.paths

    @property
    def url(self) -> str:
        return f"{self.server.url}simple/"

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self.server.close()
        self._tmp.cleanup()
