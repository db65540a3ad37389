"""Hostile round: a local user (`nobody`, as a real process) against root running egpu-setup,
on classes the earlier rounds did not name: a link swapped under the filesystem lookups, hard
links to root's files, descriptors a child inherits, the umask, resource limits and a closed
output, sudo's variables forged, /proc read while a process changes. Each test is one attempt;
the written list (class, attempts, outcome, defect) is docs/testing.md, "Hostile round 6"."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from egpu_setup.host.machine import RootHost
from helpers.sentinel import AS_NOBODY, NOBODY, SYSTEM_PYTHON, drop_to_nobody

SECONDS = 2.0  # how long a racer runs at most

# nobody, holding a descriptor of a folder it owns, flips DIR/a between a real directory and
# a link to /proc (another filesystem), as fast as it can, until the deadline
FLIPPER = r"""
import os, sys, time
dfd, deadline = int(sys.argv[1]), float(sys.argv[2])
print("ready", flush=True)
flips = 0
while time.monotonic() < deadline:
    os.rename("a", "a.real", src_dir_fd=dfd, dst_dir_fd=dfd)
    os.symlink("/proc", "a", dir_fd=dfd)
    os.unlink("a", dir_fd=dfd)
    os.rename("a.real", "a", src_dir_fd=dfd, dst_dir_fd=dfd)
    flips += 1
print(flips)
"""


def _racer(script: str, folder: Path, *args: str) -> subprocess.Popen[str]:
    """`script` as nobody, given a descriptor of `folder` (nobody cannot walk root's tmp_path)."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        proc = subprocess.Popen(
            [str(SYSTEM_PYTHON), "-c", script, str(dfd), *args],
            pass_fds=(dfd,),
            preexec_fn=drop_to_nobody,
            stdout=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(dfd)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        out, _ = proc.communicate(timeout=SECONDS + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


def _image(tmp_path: Path) -> tuple[Path, Path]:
    """An image root of root's, with a home folder nobody owns (a user's folder in it)."""
    img = tmp_path / "img"
    home = img / "home"
    (home / "a" / "b").mkdir(parents=True)
    img.chmod(0o755)
    for d in (home, home / "a", home / "a" / "b"):
        os.chown(d, NOBODY, NOBODY)
    return img, home


@pytest.mark.parametrize("ask", ["filesystem_of", "free_bytes", "resolve"])
def test_a_link_swapped_between_lookup_and_stat_never_sends_the_answer_out_of_the_root(
    tmp_path: Path, ask: str
) -> None:
    img, home = _image(tmp_path)
    host = RootHost(img)
    mine = os.stat(img).st_dev
    free = os.statvfs(img)
    racer = _racer(FLIPPER, home, str(time.monotonic() + SECONDS))
    answers: set[object] = set()
    calls = 0
    try:
        while racer.poll() is None:
            if ask == "filesystem_of":
                answers.add(host.filesystem_of("/home/a/b/venv"))
            elif ask == "free_bytes":
                got = host.free_bytes("/home/a/b/venv")
                # /proc has no blocks: 0 free is the answer a stat of the link's target gives
                answers.add(got if got == 0 else "on the image")
            else:
                answers.add(host.resolve("/home/a/b/venv"))
            calls += 1
    finally:
        flips = int(_finish(racer).split()[-1])
    assert flips > 0 and calls > 0, "the racer raced nothing"
    if ask == "filesystem_of":
        assert answers <= {mine}, f"{answers - {mine}} is not the image's filesystem ({mine})"
    elif ask == "free_bytes":
        assert free.f_bavail > 0
        assert answers == {"on the image"}
    else:
        # a link to /proc read inside the root is the image's /proc: never this machine's
        assert answers <= {"/home/a/b/venv", "/proc/b/venv"}


pytestmark = AS_NOBODY
