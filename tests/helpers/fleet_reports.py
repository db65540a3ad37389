"""Reports in today's shape for the fleet tests, and writing them as the Ansible role lays
them out (<dest>/<inventory_hostname>/<file>, identity.json beside them)."""

from __future__ import annotations

import hashlib
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any


def verify_report(
    hostname: str | None, *, ok: bool = True, time: str = "2026-11-28T10:00:00Z", **host: object
) -> dict[str, Any]:
    """A verify report of a CUDA run, as egpu_setup/verify/report.py writes one."""
    return {
        "schema": "egpu-setup/verify/1",
        "ok": ok,
        "device_kind": "cuda",
        "time": time,
        "hostname": hostname,
        "host": {"hostname": hostname, **host},
        "device": {"type": "cuda", "name": "NVIDIA GeForce RTX 4090"},
        "checks": [
            {"id": "torch-import", "ok": True, "status": "pass", "detail": "", "value": "2.9.1"},
            {"id": "h2d-bandwidth", "ok": ok, "status": "pass" if ok else "fail",
             "detail": "2.50 GB/s pinned", "value": 2.5, "expected": 2.0},
            {"id": "amp-training", "ok": ok, "status": "pass" if ok else "fail",
             "detail": "loss fell", "value": 0.1, "expected": 0.5},
        ],
    }  # fmt: skip


def write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def machine_id(n: int) -> str:
    """The sha256 of a machine-id(5) file holding the n-th made-up id."""
    return hashlib.sha256(f"{n:032x}\n".encode()).hexdigest()


def write_identity(folder: Path, machine_id: str | None, name: str | None = None) -> None:
    """identity.json as ansible/roles/egpu_setup/tasks/fetch.yml writes it."""
    write(
        folder / "identity.json",
        {"schema": "egpu-setup/identity/1", "inventory_hostname": name or folder.name,
         "machine_id_sha256": machine_id, "root": None},
    )  # fmt: skip


class Page(HTMLParser):
    """The tags, attributes, table cells and chart marks of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.cells: list[str] = []
        self.marks: dict[str, list[str]] = {}  # chart -> data-machine of each mark
        self._chart: str | None = None
        self._in_td = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)
        a = dict(attrs)
        if tag == "svg":
            self._chart = a.get("data-chart") or "?"
            self.marks.setdefault(self._chart, [])
        if "mark" in (a.get("class") or "").split() and self._chart is not None:
            self.marks[self._chart].append(a.get("data-machine") or "")
        if tag == "td":
            self._in_td += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_td -= 1
        if tag == "svg":
            self._chart = None

    def handle_data(self, data: str) -> None:
        if self._in_td:
            self.cells.append(data)
