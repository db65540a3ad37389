"""Hostile: nothing under --root, --out or --from reaches a file outside it.

Each case plants, in a temp image / output directory / recorded bundle, a link (absolute, the
way a tarball or a careless image build leaves them) to a sentinel tree beside it, or a FIFO,
a loop, a name with a newline; then runs the real command as root and checks the sentinel is
byte for byte what it was, its secret in no output, and the error (if any) is an `error:` and a
`hint:`, no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from conftest import FIXTURES
from helpers.sentinel import Sentinel

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks run as root")
TB4 = FIXTURES / "tb4-rtx4090-ubuntu2404"
STATE = "var/lib/egpu-setup"
UDEV = "etc/udev/rules.d/71-egpu-setup.rules"


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty image root whose state lives inside it (not in the test's state dir)."""
    monkeypatch.delenv("EGPU_SETUP_STATE_DIR")
    img = tmp_path / "img"
    img.mkdir()
    return img


@pytest.fixture
def sentinel(tmp_path: Path) -> Sentinel:
    return Sentinel(tmp_path / "outside")


def install(cli, img: Path, *extra: str, timeout: float = 120):
    return cli(
        "install", "--profile", "rtx4090", "--only", "config", "--root", str(img), "--from",
        str(TB4), "--yes", *extra, timeout=timeout,
    )  # fmt: skip


def clean_error(res) -> None:
    assert res.stderr.startswith("error: ") or "\nerror: " in res.stderr, res.stderr
    assert "\nhint: " in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr


# -- the state under --root: a planted link is refused, named, and never followed --------------

STATE_LINKS = {
    # where the link goes -> what it points at in the sentinel
    "journal": (f"{STATE}/journal.jsonl", "sudoers"),
    "state-dir": (STATE, "dir"),
    "manifest": (f"{STATE}/manifest.json", "shadow"),
    "backups": (f"{STATE}/backups", "dir"),
}


@pytest.mark.parametrize("where", sorted(STATE_LINKS))
def test_a_link_planted_in_the_state_is_refused(cli, image, sentinel, where) -> None:
    """Was: journal.jsonl -> /etc/sudoers made root append JSON to it; a linked state dir put
    the manifest, journal and backups outside the image."""
    rel, target = STATE_LINKS[where]
    link = image / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(getattr(sentinel, {"dir": "directory"}.get(target, target)))
    extra: tuple[str, ...] = ()
    if where == "backups":  # a file from before egpu-setup: its bytes go to backups/
        (image / UDEV).parent.mkdir(parents=True)
        (image / UDEV).write_text("# the admin's own rule\n")
        extra = ("--force",)
    res = install(cli, image, *extra)
    assert res.returncode in (1, 2), res.stderr
    clean_error(res)
    assert str(link) in res.stderr  # the error names the link
    assert sentinel.unchanged(), sentinel.changes()
    assert not (image / UDEV).exists() or where == "backups"  # refused before any write
    assert where != "backups" or (image / UDEV).read_text() == "# the admin's own rule\n"
    assert not sentinel.leaked(res.stdout, res.stderr)


def test_reports_through_a_link_are_not_written(cli, image, sentinel) -> None:
    (image / STATE).mkdir(parents=True)
    (image / STATE / "reports").symlink_to(sentinel.directory)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr  # a report that cannot be saved fails nothing
    assert "could not save the install report" in res.stderr
    assert sentinel.unchanged(), sentinel.changes()


def test_an_image_whose_run_is_an_absolute_link_keeps_its_lock_inside(cli, image, sentinel) -> None:
    """/run -> (the sentinel): the lock resolves inside the image, as after a chroot."""
    (image / "run").symlink_to(sentinel.directory)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    inside = image / sentinel.directory.relative_to("/") / "lock/egpu-setup.lock"
    assert inside.is_file()


def test_a_lock_planted_as_a_link_is_replaced_never_followed(cli, image, sentinel) -> None:
    (image / "run/lock").mkdir(parents=True)
    (image / "run/lock/egpu-setup.lock").symlink_to(sentinel.sudoers)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    assert not (image / "run/lock/egpu-setup.lock").is_symlink()


def test_a_lock_path_that_is_a_directory_is_an_error(cli, image) -> None:
    """Was: "internal error" (IsADirectoryError)."""
    lock = image / "run/lock/egpu-setup.lock"
    lock.mkdir(parents=True)
    res = install(cli, image)
    assert res.returncode == 1, res.stderr
    clean_error(res)
    assert f"the run lock {lock} is a directory" in res.stderr
    assert lock.is_dir() and not (image / UDEV).exists()


def test_a_fifo_as_the_lock_is_replaced_never_opened(cli, image) -> None:
    lock = image / "run/lock/egpu-setup.lock"
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock)  # opening it for writing would block until a reader came
    res = install(cli, image, timeout=60)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISREG(os.lstat(lock).st_mode)


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


def test_the_verify_marker_planted_as_a_link_is_replaced_not_written_through(
    tmp_path: Path, sentinel
) -> None:
    from egpu_setup.host.machine import RootHost
    from egpu_setup.state.verify_marker import (
        VERIFY_MARKER,
        remove_verify_marker,
        write_verify_marker,
    )

    img = tmp_path / "img"
    marker = img / VERIFY_MARKER.lstrip("/")
    marker.parent.mkdir(parents=True)
    marker.symlink_to(sentinel.sudoers)
    write_verify_marker(RootHost(img), "run-1", "a new driver")
    assert not marker.is_symlink() and json.loads(marker.read_text())["run"] == "run-1"
    marker.unlink()
    marker.symlink_to(sentinel.sudoers)
    assert remove_verify_marker(RootHost(img))
    assert sentinel.unchanged(), sentinel.changes()


@pytest.mark.parametrize("command", ["install", "rollback", "eject"])
@pytest.mark.parametrize("spelling", ["slash", "link-to-slash", "dotdot"])
def test_a_root_that_is_the_running_system_is_refused(cli, tmp_path: Path, command, spelling):
    """Was: `--root` resolving to / silently meant the live system."""
    root = {"slash": "/", "dotdot": str(tmp_path) + "/" + "../" * 12}.get(spelling)
    if root is None:
        (tmp_path / "slash").symlink_to("/")
        root = str(tmp_path / "slash")
    args = {
        "install": ["install", "--profile", "rtx4090", "--only", "config", "--from", str(TB4)],
        "rollback": ["rollback", "--yes"],
        "eject": ["eject", "--yes"],
    }[command]
    res = cli(*args, "--root", root)
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert "the running system, not an image" in res.stderr


# -- render --out DIR ---------------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["etc", "etc/udev", "etc/udev/rules.d"])
def test_render_does_not_follow_a_directory_link_planted_in_out(
    cli, tmp_path: Path, sentinel, planted
) -> None:
    out = tmp_path / "out"
    link = out / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(sentinel.directory)
    res = cli("render", "--profile", "rtx4090", "--out", str(out), "--from", str(TB4))
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert f"{link} is a symbolic link" in res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    assert not (out / "usr/local/bin/egpu-hotplug").exists()  # nothing written at all


def test_render_replaces_a_file_link_planted_in_out(cli, tmp_path: Path, sentinel) -> None:
    out = tmp_path / "out"
    (out / UDEV).parent.mkdir(parents=True)
    (out / UDEV).symlink_to(sentinel.sudoers)
    res = cli("render", "--profile", "rtx4090", "--out", str(out), "--from", str(TB4))
    assert res.returncode == 0, res.stderr
    assert not (out / UDEV).is_symlink()
    assert sentinel.unchanged(), sentinel.changes()


# -- --from DIR: a recorded host is read inside itself ----------------------------------------


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A copy of a recorded laptop to plant things in."""
    dest = tmp_path / "bundle"
    shutil.copytree(TB4, dest, symlinks=True)
    return dest


@pytest.mark.parametrize("name", ["centos-release", "redhat-release", "lsb-release"])
def test_release_files_are_read_inside_the_bundle(cli, bundle, sentinel, name) -> None:
    """Was: the `distro` fallback read etc/*-release through a link to a host file (detect
    printed the first line of a fake shadow file)."""
    for rel in ("etc/os-release", "usr/lib/os-release"):
        if os.path.lexists(bundle / "root" / rel):
            (bundle / "root" / rel).unlink()
    (bundle / "root/etc" / name).symlink_to(sentinel.shadow)
    res = cli("detect", "--json", "--from", str(bundle))
    assert res.returncode == 0, res.stderr
    assert not sentinel.leaked(res.stdout, res.stderr)
    assert json.loads(res.stdout)["os"]["id"] != "sentinel"  # what the link pointed at, unread
    assert sentinel.unchanged()


@pytest.mark.parametrize("name", ["centos-release", "lsb-release", "os-release"])
def test_no_byte_sequence_in_a_release_file_crashes_a_command(cli, bundle, name) -> None:
    """Was: non-UTF-8 bytes in a release file crashed every command (exit 70)."""
    for rel in ("etc/os-release", "usr/lib/os-release"):
        if os.path.lexists(bundle / "root" / rel):
            (bundle / "root" / rel).unlink()
    body = b"CentOS \xff\xfe release 7.\xc3 (\x80Core)\n"
    if name != "centos-release":
        body = b'ID=\xff\xfeubuntu\nDISTRIB_ID=Ub\xc3untu\nVERSION_ID="\x80"\n'
    (bundle / "root/etc" / name).write_bytes(body)
    for args in (["detect"], ["doctor"], ["resolve"]):
        res = cli(*args, "--from", str(bundle))
        assert res.returncode in (0, 1, 2), res.stderr
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "rel", ["commands/dmesg.txt", "commands/lspci.txt", "meta.json", "commands/torch.json"]
)
def test_bundle_files_beside_root_are_read_inside_it(cli, bundle, sentinel, rel) -> None:
    target = bundle / rel
    target.parent.mkdir(exist_ok=True)
    if os.path.lexists(target):
        target.unlink()
    target.symlink_to(sentinel.shadow)
    res = cli("doctor", "--json", "--from", str(bundle))
    assert res.returncode in (0, 1, 2), res.stderr
    assert "Traceback" not in res.stderr
    assert not sentinel.leaked(res.stdout, res.stderr)
    assert sentinel.unchanged()


@pytest.mark.parametrize("part", ["root", "commands"])
def test_a_bundle_whose_root_is_a_link_is_refused(cli, tmp_path: Path, part) -> None:
    b = tmp_path / "b"
    b.mkdir()
    (b / part).symlink_to("/")
    res = cli("detect", "--from", str(b))
    assert res.returncode == 2
    clean_error(res)
    assert f"{b / part} is a symbolic link" in res.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_in_a_bundle_is_not_read(cli, bundle, kind) -> None:
    target = bundle / "root/proc/cmdline"
    if os.path.lexists(target):
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(target)  # a plain open() would block for ever
    else:
        os.mknod(target, 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: never ends
    res = cli("doctor", "--json", "--from", str(bundle), timeout=60)
    assert res.returncode in (0, 1), res.stderr


def test_a_pci_address_with_a_newline_never_reaches_a_rule(cli, bundle, tmp_path: Path) -> None:
    """A device directory named "0000:…0\\n" passed `^…$`: its address would split a udev rule."""
    devices = bundle / "root/sys/bus/pci/devices"
    for link in list(devices.iterdir()):
        os.rename(link, devices / (link.name + "\n"))
    out = tmp_path / "out"
    res = cli("render", "--profile", "rtx4090", "--out", str(out), "--from", str(bundle))
    assert "Traceback" not in res.stderr
    for path in out.rglob("*"):
        if path.is_file() and not path.is_symlink():
            text = path.read_text()
            assert not any(
                line.rstrip().endswith(('"0000:', ":00.0")) for line in text.splitlines()
            ), path
