"""Hostile: the state under --root (state dir, manifest, journal, backups, reports, lock, verify
marker) stays inside the image.

How each attack is planted and checked: tests/helpers/sentinel.py.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import RunCli
from helpers.sentinel import STATE, UDEV, Sentinel, clean_error, install

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks run as root")


# -- the state under --root: a planted link is refused, named, and never followed --------------

STATE_LINKS = {
    # where the link goes -> what it points at in the sentinel
    "journal": (f"{STATE}/journal.jsonl", "sudoers"),
    "state-dir": (STATE, "dir"),
    "manifest": (f"{STATE}/manifest.json", "shadow"),
    "backups": (f"{STATE}/backups", "dir"),
}


@pytest.mark.parametrize("where", sorted(STATE_LINKS))
def test_a_link_planted_in_the_state_is_refused(
    cli: RunCli, image: Path, sentinel: Sentinel, where: str
) -> None:
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


def test_reports_through_a_link_are_not_written(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
    (image / STATE).mkdir(parents=True)
    # under --root the report is the image's build report (build-reports/)
    (image / STATE / "build-reports").symlink_to(sentinel.directory)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr  # a report that cannot be saved fails nothing
    assert "could not save the install report" in res.stderr
    assert sentinel.unchanged(), sentinel.changes()


def test_an_image_whose_run_is_an_absolute_link_keeps_its_lock_inside(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
    """/run -> (the sentinel): the lock resolves inside the image, as after a chroot."""
    (image / "run").symlink_to(sentinel.directory)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    inside = image / sentinel.directory.relative_to("/") / "lock/egpu-setup.lock"
    assert inside.is_file()


def test_a_lock_planted_as_a_link_is_replaced_never_followed(
    cli: RunCli, image: Path, sentinel: Sentinel
) -> None:
    (image / "run/lock").mkdir(parents=True)
    (image / "run/lock/egpu-setup.lock").symlink_to(sentinel.sudoers)
    res = install(cli, image)
    assert res.returncode == 0, res.stderr
    assert sentinel.unchanged(), sentinel.changes()
    assert not (image / "run/lock/egpu-setup.lock").is_symlink()


def test_a_lock_path_that_is_a_directory_is_an_error(cli: RunCli, image: Path) -> None:
    """Was: "internal error" (IsADirectoryError)."""
    lock = image / "run/lock/egpu-setup.lock"
    lock.mkdir(parents=True)
    res = install(cli, image)
    assert res.returncode == 1, res.stderr
    clean_error(res)
    assert f"the run lock {lock} is a directory" in res.stderr
    assert lock.is_dir() and not (image / UDEV).exists()


def test_a_fifo_as_the_lock_is_replaced_never_opened(cli: RunCli, image: Path) -> None:
    lock = image / "run/lock/egpu-setup.lock"
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock)  # opening it for writing would block until a reader came
    res = install(cli, image, timeout=60)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISREG(os.lstat(lock).st_mode)


def test_the_verify_marker_planted_as_a_link_is_replaced_not_written_through(
    tmp_path: Path, sentinel: Sentinel
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


# -- state files of the wrong shape, and what goes into them ------------------------------------

WRONG_SHAPES = {
    "manifest-a-list": ("manifest.json", "[]\n"),
    "manifest-files-a-list": (
        "manifest.json",
        '{"schema": "egpu-setup/manifest/1", "files": [1, 2]}\n',
    ),
    "manifest-entry-a-string": (
        "manifest.json",
        '{"schema": "egpu-setup/manifest/1", "files": {"/etc/udev/rules.d/x.rules": "x"}}\n',
    ),
    "manifest-package-an-option": (
        "manifest.json",
        '{"schema": "egpu-setup/manifest/1", "packages": [{"name": "-oAPT::Get::Purge=x"}]}\n',
    ),
    "manifest-pulled-in-not-a-bool": (
        "manifest.json",
        '{"schema": "egpu-setup/manifest/1", "packages": [{"name": "libonig5", '
        '"pulled_in": "yes"}]}\n',
    ),
    "manifest-purging-not-a-bool": (
        "manifest.json",
        '{"schema": "egpu-setup/manifest/1", "packages": [{"name": "libonig5", '
        '"pulled_in": true, "purging": 1}]}\n',
    ),
    "journal-lines-of-the-wrong-shape": ("journal.jsonl", '[]\n{"run": 5}\n"x"\n{"event": []}\n'),
}


@pytest.mark.parametrize("case", sorted(WRONG_SHAPES))
@pytest.mark.parametrize("command", ["install", "rollback"])
def test_state_files_of_the_wrong_shape_are_an_error_not_a_crash(
    cli: RunCli, image: Path, case: str, command: str
) -> None:
    """Was: well-formed JSON of the wrong shape in the manifest or journal: "internal error"."""
    name, text = WRONG_SHAPES[case]
    (image / STATE).mkdir(parents=True)
    (image / STATE / name).write_text(text)
    if command == "install":
        res = install(cli, image)
    else:
        res = cli("rollback", "--yes", "--root", str(image))
    assert res.returncode in (0, 1, 2), res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    if res.returncode != 0:
        clean_error(res)
    assert (image / STATE / name).read_text() == text or name == "journal.jsonl"


def test_a_recorded_package_that_is_an_apt_option_never_reaches_apt(
    cli: RunCli, image: Path
) -> None:
    """rollback --packages hands the manifest's package names to apt-get: one that starts with
    `-o` would be an option. The manifest is refused on load, before apt runs."""
    (image / STATE).mkdir(parents=True)
    text = '{"schema": "egpu-setup/manifest/1", "packages": [{"name": "-oAPT::Get::Purge=x"}]}\n'
    (image / STATE / "manifest.json").write_text(text)
    res = cli("rollback", "--yes", "--packages", "--root", str(image))
    assert res.returncode == 1, res.stderr  # a state file egpu-setup did not write
    clean_error(res)
    assert "'-oAPT::Get::Purge=x' is not a Debian package name" in res.stderr
    assert (image / STATE / "manifest.json").read_text() == text


def test_an_index_token_stays_out_of_the_journal_and_the_report() -> None:
    """Was: a token in an index URL's query string landed in the 0644 install report and the
    journal. The journal and the report both go through text.redact_tree."""
    from egpu_setup.state.journal import Journal
    from egpu_setup.state.paths import StatePaths
    from egpu_setup.text import redact_tree

    url = "https://ada:pw@mirror.lab/whl/cu128?token=SECRET-1&x=2#SECRET-2"
    event = {"event": "step", "argv": ["pip", "install", "--index-url", url], "detail": url}
    assert "SECRET" not in json.dumps(redact_tree(event)) and "pw@" not in json.dumps(
        redact_tree(event)
    )
    paths = StatePaths.for_root(Path("/"))  # the test's own state dir (conftest)
    Journal(paths).append(event)
    text = (paths.state_dir / "journal.jsonl").read_text()
    assert "mirror.lab/whl/cu128?token=***&x=***#***" in text
    assert "SECRET" not in text and ":pw@" not in text
