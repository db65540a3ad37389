"""Hostile: the files install manages under --root are written, backed up and rolled back inside
the image, never through a link to the host.

How each attack is planted and checked: tests/helpers/sentinel.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RunCli
from helpers import kill_points
from helpers.sentinel import STATE, UDEV, Sentinel, clean_error, install

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks run as root")


def test_a_managed_directory_planted_as_an_absolute_link_stays_in_the_image(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
    """etc/udev/rules.d -> (the sentinel's dir): resolved inside the image, never the host's."""
    (image / "etc/udev").mkdir(parents=True)
    (image / "etc/udev/rules.d").symlink_to(sentinel.directory)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    inside = image / sentinel.directory.relative_to("/") / "71-egpu-setup.rules"
    assert inside.is_file()


def test_a_link_loop_deeper_than_the_kernel_follows_is_refused(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
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


def test_a_managed_file_swapped_for_a_link_is_not_copied_into_backups(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
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


def test_a_managed_file_swapped_for_a_link_is_kept_by_rollback(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
    assert install(cli, image).returncode == 0
    (image / UDEV).unlink()
    (image / UDEV).symlink_to(sentinel.shadow)
    res = cli("rollback", "--yes", "--root", str(image))
    assert res.returncode == 1  # kept: said, exit 1
    assert os.readlink(image / UDEV) == str(sentinel.shadow)
    assert sentinel.unchanged(), sentinel.changes()


def test_a_fifo_at_a_managed_path_neither_blocks_nor_is_read(cli: RunCli, image: Path) -> None:
    fifo = image / UDEV
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    res = install(cli, image)
    assert res.returncode in (1, 2), res.stderr
    clean_error(res)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("how", ["user-owned", "a-folder-open-to-all"])
def test_an_image_a_user_can_change_is_never_entered(
    cli: RunCli, image: Path, sentinel: Sentinel, how: str
) -> None:
    """Was: --root never checked who owns the image and entered it as root; a user-owned image's
    sitecustomize.py, run by the tool install, escaped the chroot as uid 0."""
    (image / "usr/lib").mkdir(parents=True)
    (image / "etc").mkdir()
    if how == "user-owned":
        for path in (image, image / "usr", image / "usr/lib", image / "etc"):
            os.chown(path, NOBODY, NOBODY)
    else:
        (image / "usr/lib").chmod(0o777)
    before = sorted(str(p) for p in image.rglob("*"))
    for res in (install(cli, image), cli("rollback", "--yes", "--root", str(image))):
        assert res.returncode == 2, res.stderr
        clean_error(res)
        assert "root does not enter an image that" in res.stderr
    assert sorted(str(p) for p in image.rglob("*")) == before  # nothing written, no state
    assert sentinel.unchanged(), sentinel.changes()


# -- rollback: crash-idempotent, a bad backup skipped, only egpu-setup's paths deleted ---------

ADMIN = "# the admin's own rule\n"


def _installed_over_the_admins_rule(cli: RunCli, image: Path) -> None:
    (image / UDEV).parent.mkdir(parents=True)
    (image / UDEV).write_text(ADMIN)
    res = install(cli, image, "--force")  # the admin's bytes go to backups/
    assert res.returncode == 0, res.stderr


def _rollback(cli: RunCli, image: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return cli("rollback", "--yes", "--root", str(image), env=env)


def _rollback_argv(image: Path) -> list[str]:
    return [sys.executable, "-m", "egpu_setup", "rollback", "--yes", "--root", str(image)]


def _temp_files(image: Path) -> list[str]:
    return [str(p) for p in image.rglob("*.egpu-setup-tmp-*")]


@pytest.mark.parametrize("point", ["mid-write", "renamed"])
def test_a_rollback_killed_while_restoring_finishes_on_the_next_run(
    cli: RunCli, image: Path, point: str, tmp_path: Path
) -> None:
    """Was: a SIGKILL left temp files only install cleaned, and after some kills every later
    rollback called the just-restored original "edited" and exited 1 for ever. Killed as it
    puts the admin's rule back (mid-write: the restored copy written, not renamed) or right
    after (renamed: the directory's fsync, the manifest not yet told)."""
    _installed_over_the_admins_rule(cli, image)
    ref = tmp_path / "ref"
    shutil.copytree(image, ref, symlinks=True)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # the same calls in every run
    done, found = kill_points.points(_rollback_argv(ref), env=env)
    assert done.returncode == 0, done.stderr
    restore = next(
        i for i, p in enumerate(found)
        if p.syscall.startswith("rename") and p.args.endswith(f'"{UDEV.rsplit("/", 1)[-1]}"')
    )  # fmt: skip
    at = found[restore] if point == "mid-write" else found[restore + 1]
    assert point == "mid-write" or at.syscall == "fsync", at
    killed = kill_points.kill_at(at, _rollback_argv(image), env=env)
    assert kill_points.killed(killed), killed.stderr
    assert bool(_temp_files(image)) == (point == "mid-write")
    assert ((image / UDEV).read_text() == ADMIN) == (point == "renamed")
    again = _rollback(cli, image)
    assert again.returncode == 0, again.stderr
    assert (image / UDEV).read_text() == ADMIN
    assert _temp_files(image) == []
    assert not (image / "usr/local/bin/egpu-hotplug").exists()
    assert _rollback(cli, image).returncode == 0  # and for ever after: nothing left to undo


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_bad_backup_is_skipped_and_the_rest_undone(cli: RunCli, image: Path, damage: str) -> None:
    """Was: one missing or corrupt backup stopped rollback; the files after it were never
    undone."""
    _installed_over_the_admins_rule(cli, image)
    (backup,) = (image / STATE / "backups").iterdir()
    if damage == "missing":
        backup.unlink()
    else:
        backup.write_text("not what was backed up\n")
    res = _rollback(cli, image)
    assert res.returncode == 1, res.stderr
    assert f"backup {backup} is {damage}" in res.stderr and "Traceback" not in res.stderr
    assert not (image / "usr/local/bin/egpu-hotplug").exists()  # the rest was undone
    assert not (image / "etc/systemd/system/egpu-setup-wait.service").exists()
    manifest = json.loads((image / STATE / "manifest.json").read_text())
    assert list(manifest["files"]) == [f"/{UDEV}"]  # kept for a later run, the rest gone


def test_rollback_deletes_only_paths_egpu_setup_writes(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
    """Was: rollback deleted any path the manifest listed."""
    assert install(cli, image).returncode == 0
    path = image / STATE / "manifest.json"
    manifest = json.loads(path.read_text())
    created = manifest["files"]["/usr/local/bin/egpu-hotplug"]
    planted = {
        "/etc/shadow": "root:x:19000:0:99999:7:::\n",  # not a path egpu-setup writes
        "/etc/modprobe.d/egpu-setup-x.conf": "options x y=1\n",  # ours by name, no header
        "/" + str(sentinel.sudoers).lstrip("/"): "",  # the sentinel's path, inside the image
    }
    for rel, text in planted.items():
        (image / rel.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (image / rel.lstrip("/")).write_text(text)
        # the attacker hashes what they plant, so the entry looks like egpu-setup's own write
        digest = hashlib.sha256(text.encode()).hexdigest()
        manifest["files"][rel] = dict(created, created_dirs=[], sha256=digest)
    path.write_text(json.dumps(manifest))
    res = _rollback(cli, image)
    assert "Traceback" not in res.stderr
    for rel, text in planted.items():
        assert (image / rel.lstrip("/")).read_text() == text, rel
    assert not (image / "usr/local/bin/egpu-hotplug").exists()
    assert sentinel.unchanged(), sentinel.changes()


@pytest.fixture
def small_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An image root on a tmpfs of its own (4 MiB): it can be made read-only, or full."""
    import subprocess

    monkeypatch.delenv("EGPU_SETUP_STATE_DIR")
    img = tmp_path / "small"
    img.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(img)], check=False
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield img
    finally:
        subprocess.run(["umount", "-l", str(img)], check=False)


@pytest.mark.parametrize("trouble", ["read-only", "full"])
def test_rollback_on_a_read_only_or_full_disk_is_an_error_and_resumes(
    cli: RunCli, small_image: Path, trouble: str
) -> None:
    """Was: EROFS or ENOSPC during rollback gave "internal error"."""
    import subprocess

    _installed_over_the_admins_rule(cli, small_image)
    filler = small_image / "filler"
    if trouble == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", str(small_image)], check=True)
    else:
        with open(filler, "wb") as f, contextlib.suppress(OSError):
            while True:  # until ENOSPC
                f.write(b"\0" * 65536)
                f.flush()
    res = _rollback(cli, small_image)
    assert res.returncode == 1, res.stderr
    clean_error(res)
    assert ("Read-only file system" if trouble == "read-only" else "No space left") in res.stderr
    if trouble == "read-only":
        subprocess.run(["mount", "-o", "remount,rw", str(small_image)], check=True)
    else:
        filler.unlink()
    again = _rollback(cli, small_image)
    assert again.returncode == 0, again.stderr
    assert (small_image / UDEV).read_text() == ADMIN
    assert _temp_files(small_image) == []
