"""Hostile: the files install manages under --root are written, backed up and rolled back inside
the image, never through a link to the host.

Each case plants a link (absolute, the way a tarball or a careless image build leaves them)
to a sentinel tree beside the target, or a FIFO, a loop, a name with a newline; then runs the real
command as root and checks the sentinel is byte for byte what it was, its secret in no output, and
the error (if any) is an `error:` and a `hint:`, no traceback (helpers/sentinel.py).
"""

from __future__ import annotations

import os
import stat

import pytest

from helpers.sentinel import UDEV, clean_error, install

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks run as root")


def test_a_managed_directory_planted_as_an_absolute_link_stays_in_the_image(
    cli, image, sentinel
) -> None:
    """etc/udev/rules.d -> (the sentinel's dir): resolved inside the image, never the host's."""
    (image / "etc/udev").mkdir(parents=True)
    (image / "etc/udev/rules.d").symlink_to(sentinel.directory)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    inside = image / sentinel.directory.relative_to("/") / "71-egpu-setup.rules"
    assert inside.is_file()


def test_a_link_loop_deeper_than_the_kernel_follows_is_refused(cli, image, sentinel) -> None:
    """41 links: the raw path would be handed to the kernel, which follows them out."""
    etc = image / "etc"
    etc.mkdir()
    for i in range(41):
        (etc / f"l{i}").symlink_to(f"/etc/l{i + 1}")
    (etc / "l41").symlink_to(sentinel.directory)
    (etc / "udev").symlink_to("/etc/l0")
    res = install(cli, image)
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert "symbolic links on the way" in res.stderr
    assert sentinel.unchanged(), sentinel.changes()


def test_a_managed_file_swapped_for_a_link_is_not_copied_into_backups(cli, image, sentinel) -> None:
    """Was: after a first install, a managed path replaced by a link to a host file had that
    file's content copied into the image's backups/ as "your edited version" (--force)."""
    assert install(cli, image).returncode == 0
    (image / UDEV).unlink()
    (image / UDEV).symlink_to(sentinel.shadow)
    res = install(cli, image)
    assert res.returncode == 1 and "was changed by someone" in res.stderr
    forced = install(cli, image, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (image / UDEV).is_symlink() and "egpu-setup" in (image / UDEV).read_text()
    assert sentinel.unchanged(), sentinel.changes()
    assert sentinel.leaked_into(image) == []  # not in backups/, not anywhere in the image
    back = cli("rollback", "--yes", "--root", str(image))
    assert back.returncode == 0, back.stderr
    assert sentinel.unchanged(), sentinel.changes()


def test_a_managed_file_swapped_for_a_link_is_kept_by_rollback(cli, image, sentinel) -> None:
    assert install(cli, image).returncode == 0
    (image / UDEV).unlink()
    (image / UDEV).symlink_to(sentinel.shadow)
    res = cli("rollback", "--yes", "--root", str(image))
    assert res.returncode == 1  # kept: said, exit 1
    assert os.readlink(image / UDEV) == str(sentinel.shadow)
    assert sentinel.unchanged(), sentinel.changes()


def test_a_fifo_at_a_managed_path_neither_blocks_nor_is_read(cli, image) -> None:
    fifo = image / UDEV
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    res = install(cli, image)
    assert res.returncode in (1, 2), res.stderr
    clean_error(res)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
