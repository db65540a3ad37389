"""Root writes in a folder another user can write: that user renaming a link over root's temp
file while root writes it changes nothing outside the folder.

The racer is a real process running as `nobody` (uid 65534). It is handed a descriptor of the
folder (owned by nobody, so nobody may write there; the racer never needs a path to reach it)
and loops: list the folder, and rename a symlink to a sentinel file over every temp name it sees.
A writer that set mode or owner by name (chmod(2)/chown(2) follow links) would hand the sentinel
to nobody with mode 0666; the one writer sets both on its own descriptor (state/atomic.py), and
refuses the rename when the temp name no longer holds its file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from egpu_setup.errors import UsageError
from egpu_setup.state.atomic import TMP_MARK, atomic_write
from helpers import racer as racers
from helpers.sentinel import AS_NOBODY, NOBODY

SWAPS = 200  # the racer stops after this many renames ...
SECONDS = 20  # ... or this long, whichever comes first

# argv: folder fd, sentinel path, swap bound, time bound. Prints the swaps it made.
RACER = f"""
import os, sys, time
fd, sentinel, most, until = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
print("ready", flush=True)
swaps, n = 0, 0
while swaps < most and time.monotonic() < until:
    for name in os.listdir(fd):
        if {TMP_MARK!r} not in name:
            continue
        n += 1
        link = f"link-{{n}}"
        try:
            os.symlink(sentinel, link, dir_fd=fd)
            os.rename(link, name, src_dir_fd=fd, dst_dir_fd=fd)
            swaps += 1
        except OSError:
            try:
                os.unlink(link, dir_fd=fd)
            except OSError:
                pass
print(swaps, flush=True)
"""

pytestmark = AS_NOBODY


def test_a_link_renamed_over_the_temp_file_never_reaches_a_file_outside(tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    sentinel.write_bytes(b"root's own\n")
    sentinel.chmod(0o600)
    folder = tmp_path / "users-folder"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)  # nobody may write here, and nowhere else on the way
    target = folder / "out.bin"
    data = os.urandom(2 * 1024 * 1024)  # a temp file that lives long enough to be seen
    before = sentinel.stat()

    racer = racers.start(RACER, folder, str(sentinel), str(SWAPS), str(time.monotonic() + SECONDS))
    try:
        written = refused = 0
        deadline = time.monotonic() + SECONDS
        while racer.poll() is None and time.monotonic() < deadline:
            try:
                # what the racer would get by name: the sentinel made nobody's and 0666
                atomic_write(target, data, 0o666, anchor=tmp_path, owner=(NOBODY, NOBODY))
            except UsageError as exc:
                assert "was replaced while egpu-setup wrote it" in str(exc)
                refused += 1
            else:
                written += 1
                st = target.lstat()
                if target.is_file() and not target.is_symlink():
                    assert (st.st_uid, st.st_mode & 0o7777) == (NOBODY, 0o666)
    finally:
        swaps = racers.finish(racer, SECONDS)
    assert swaps > 0, "the racer never caught a temp file: the test raced nothing"
    assert refused > 0  # at least one swap was caught before the rename
    after = sentinel.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, 0o100600)
    assert (after.st_ino, after.st_nlink) == (before.st_ino, 1)
    assert sentinel.read_bytes() == b"root's own\n"
    assert not [p for p in tmp_path.iterdir() if p.name != "users-folder" and p != sentinel]
