"""The per-test copies of the cached debootstrap roots are overlay mounts (tests/helpers/debroot.py,
`layered_copy`): what a test, or the tool it runs as root inside the copy, writes, deletes or
renames there must never reach the shared cached root that every other test's copy reads, and
the copy must behave as a root of its own (a lower directory renamed, a file's mode changed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import debroot, image

pytestmark = pytest.mark.debootstrap


@pytest.fixture
def cached() -> Path:
    try:
        return debroot.build("bookworm")
    except debroot.DebrootUnavailable as exc:
        pytest.skip(str(exc))


def _mounted(path: Path) -> bool:
    real = os.path.realpath(path)
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return real in points


def test_what_a_copy_changes_as_root_stays_in_the_copy_and_the_cached_root_is_untouched(
    cached: Path, tmp_path: Path
) -> None:
    before = image.tree_state(cached)
    copy = debroot.copy_root("bookworm", tmp_path / "root")
    assert debroot.is_layer(copy) and _mounted(copy)
    assert not (copy / ".egpu-setup-debroot-complete").exists()  # the cache's marker hidden
    script = (
        "set -e; echo changed > /etc/hostname; rm /etc/debian_version; chmod 700 /etc/apt;"
        " mv /usr/share/doc /usr/share/doc-moved; mkdir -p /opt/new; echo x > /opt/new/file;"
        " ln -sf /etc/shadow /etc/motd; rm -r /var/lib/apt/lists"
    )
    done = debroot.chroot(copy, "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    assert (copy / "etc/hostname").read_text() == "changed\n"
    assert not (copy / "etc/debian_version").exists()
    assert (copy / "usr/share/doc-moved").is_dir() and not (copy / "usr/share/doc").exists()
    assert (copy / "etc/apt").stat().st_mode & 0o777 == 0o700
    assert image.tree_state(cached) == before
    assert (cached / ".egpu-setup-debroot-complete").is_file()
    # a second copy sees the cached root, not the first copy's changes
    other = debroot.copy_root("bookworm", tmp_path / "other")
    assert (other / "etc/debian_version").is_file() and (other / "usr/share/doc").is_dir()
    debroot.release(other)
    debroot.release(copy)
    assert not _mounted(copy) and not copy.exists()
    assert not (tmp_path / ".root.layer").exists()
    assert image.tree_state(cached) == before


def test_a_copy_is_its_own_root_for_the_image_helpers_and_gone_after_remove_image(
    tmp_path: Path,
) -> None:
    copy = debroot.copy_root("bookworm", tmp_path / "root")
    assert image.mounts_under(copy) == []  # the harness's own overlay is not a leftover
    os.makedirs(copy / "proc", exist_ok=True)
    done = debroot.chroot(copy, "true")
    assert done.returncode == 0, done.stderr
    image.remove_image(copy)
    assert not copy.exists() and not debroot.is_layer(copy)


def test_release_all_unmounts_every_copy_a_process_mounted(tmp_path: Path) -> None:
    """What conftest.py's pytest_sessionfinish calls, in a process of its own (release_all here
    would unmount the copies other tests' module fixtures of this session still use)."""
    program = (
        "import sys; from pathlib import Path; from helpers import debroot;"
        " copies = [debroot.copy_root('bookworm', Path(sys.argv[1]) / n) for n in 'ab'];"
        " print(all(debroot.is_layer(c) for c in copies)); debroot.release_all()"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and done.stdout == "True\n", done.stderr
    assert not any(_mounted(tmp_path / n) or (tmp_path / n).exists() for n in "ab")
    assert sorted(os.listdir(tmp_path)) == []
