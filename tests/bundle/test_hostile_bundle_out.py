"""`bundle --out DIR` when a user owns DIR: root writes the bundle only through DIR's OutputTree.

The user `nobody` owns --out (so every file of the bundle is theirs, and so is every rename in
it). While pip downloads torch, a real process as nobody swaps the bundle's `wheels` folder for a
link to a sentinel directory of root's. pip writes into a private directory of root's, and the
wheels reach --out only through directory descriptors, so the link is refused (exit 2, error and
hint) and nothing lands in the sentinel. The loopback index stands in for the vendor's torch
index: it serves a small wheel named as the CPU torch wheel and holds its answer until the swap
is done, so the swap happens mid-download every time, with no sleep.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from conftest import RunCli
from helpers import pypi_index
from helpers import racer as racers
from helpers.sentinel import AS_NOBODY, NOBODY, Sentinel, clean_error

REPO = Path(__file__).resolve().parents[2]
SWAP = """
import os, sys
fd, sentinel = int(sys.argv[1]), sys.argv[2]
try:
    os.rename("wheels", "wheels.old", src_dir_fd=fd, dst_dir_fd=fd)
except FileNotFoundError:
    pass
os.symlink(sentinel, "wheels", dir_fd=fd)
print("swapped", flush=True)
"""
pytestmark = AS_NOBODY


def _profile(tmp: Path) -> Path:
    text = (REPO / "profiles" / "rtx4090.yaml").read_text()
    path = tmp / "lab-cpu.yaml"
    path.write_text(text.replace("extras: [torchvision]", "extras: []"))
    return path


class _HeldIndex(pypi_index.LocalIndex):
    """A LocalIndex whose wheel answers wait for `before_wheel()` to return."""

    def __init__(self, wheels: list[Path], before_wheel: Callable[[], object]) -> None:
        super().__init__(wheels)
        self.before_wheel = before_wheel

    def __enter__(self) -> _HeldIndex:
        from helpers.loopback import LoopbackServer

        def respond(h: http.server.BaseHTTPRequestHandler) -> bool:
            if h.path.startswith("/files/"):
                self.before_wheel()
            return False  # then served from the directory as usual

        self.server = LoopbackServer(root=self.dir, respond=respond)
        return self


def _bundle(
    cli: RunCli, tmp: Path, out: Path, before_wheel: Callable[[], object]
) -> subprocess.CompletedProcess[str]:
    stand_in = pypi_index.build_wheel(tmp, "torch", "2.13.0+cpu")
    with _HeldIndex([stand_in], before_wheel) as idx:
        return cli(
            "bundle", "--profile", str(_profile(tmp)), "--out", str(out), "--cuda", "cpu",
            "--torch", "2.13.0", "--python", "3.11", "--distro", "debian-12",
            "--index-url", idx.url, "--only", "torch", "--json", timeout=300,
        )  # fmt: skip


def _users_out(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)  # nobody reaches --out; root's tmp_path stays closed to its writes
    out = tmp_path / "bundle"
    out.mkdir(mode=0o755)
    os.chown(out, NOBODY, NOBODY)
    return out


def test_a_wheels_folder_swapped_for_a_link_mid_download_is_refused(
    cli: RunCli, tmp_path: Path, sentinel: Sentinel
) -> None:
    out = _users_out(tmp_path)
    swapped: list[str] = []

    def swap() -> None:
        if swapped:
            return
        swapped.append(racers.run(SWAP, out, str(sentinel.directory)))

    res = _bundle(cli, tmp_path, out, swap)
    assert swapped == ["swapped"], res.stderr
    assert res.returncode == 2, res.stderr[-2000:]
    clean_error(res)
    assert "wheels" in res.stderr and "symbolic link" in res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    assert not (out / "manifest.json").exists()


def test_a_users_out_gets_a_whole_bundle_of_their_own(
    cli: RunCli, tmp_path: Path, sentinel: Sentinel
) -> None:
    out = _users_out(tmp_path)
    res = _bundle(cli, tmp_path, out, lambda: None)
    assert res.returncode == 0, res.stderr[-2000:]
    pin = json.loads(res.stdout)["manifest_sha256"]
    assert (out / "manifest.sha256").read_text().split()[0] == pin
    manifest = json.loads((out / "manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert "wheels/py3.11/torch-2.13.0+cpu-py3-none-any.whl" in paths
    for dirpath, dirnames, filenames in os.walk(out):
        for name in dirnames + filenames:
            st = os.lstat(Path(dirpath) / name)
            assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), Path(dirpath) / name
    assert sentinel.unchanged(), sentinel.changes()
