"""Hostile round: a local user (`nobody`, as a real process) against root running egpu-setup,
on classes the earlier rounds did not name: a link swapped under the filesystem lookups, hard
links to root's files, descriptors a child inherits, the umask, resource limits and a closed
output, sudo's variables forged, /proc read while a process changes. Each test is one attempt;
the written list (class, attempts, outcome, defect) is docs/testing.md, "A local user against
root"."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import RunCli
from egpu_setup.host import process
from egpu_setup.host.machine import RecordedHost, RootHost
from egpu_setup.state.atomic import directory
from egpu_setup.state.lock import RunLock
from egpu_setup.state.output import OutputTree
from helpers import racer as racers
from helpers.sentinel import (
    AS_NOBODY,
    NOBODY,
    SYSTEM_PYTHON,
    Sentinel,
    clean_error,
    drop_to_nobody,
    tree_digest,
)

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
    racer = racers.start(FLIPPER, home, str(time.monotonic() + SECONDS))
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
        flips = racers.finish(racer, SECONDS + 10)
    assert flips > 0 and calls > 0, "the racer raced nothing"
    if ask == "filesystem_of":
        assert answers <= {mine}, f"{answers - {mine}} is not the image's filesystem ({mine})"
    elif ask == "free_bytes":
        assert free.f_bavail > 0
        assert answers == {"on the image"}
    else:
        # a link to /proc read inside the root is the image's /proc: never this machine's
        assert answers <= {"/home/a/b/venv", "/proc/b/venv"}


# -- hard links: fs.protected_hardlinks may be 0 (a container, an image build), and then nobody
# may link(2) any file it can see into a folder of its own. The kernel here has it on, so root
# makes the link nobody would have made (the attempt as nobody is checked to say which it is).


def _nobody_may_hard_link(target: Path, folder: Path) -> bool:
    code = "import os, sys\ntry: os.link(sys.argv[1], sys.argv[2])\nexcept OSError: sys.exit(1)"
    res = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", code, str(target), str(folder / "probe")],
        preexec_fn=drop_to_nobody,
        check=False,
    )
    if res.returncode == 0:
        os.unlink(folder / "probe")
    return res.returncode == 0


def _users_folder(tmp_path: Path, name: str) -> Path:
    tmp_path.chmod(0o755)
    folder = tmp_path / name
    folder.mkdir()
    os.chown(folder, NOBODY, NOBODY)
    return folder


def test_a_hard_link_to_roots_file_in_a_users_recording_is_not_read(
    tmp_path: Path, sentinel: Sentinel
) -> None:
    rec = _users_folder(tmp_path, "rec")
    etc = rec / "root" / "etc"
    etc.mkdir(parents=True)
    for d in (rec / "root", etc):
        os.chown(d, NOBODY, NOBODY)
    protected = not _nobody_may_hard_link(sentinel.shadow, etc)
    assert protected == (Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "0")
    os.link(sentinel.shadow, etc / "os-release")  # what nobody does where the setting is 0
    host = RecordedHost(rec)
    assert host.read("/etc/os-release") is None
    assert host.read_bytes("/etc/os-release") is None
    assert not host.exists("/etc/os-release")
    # nobody's own file with two names is theirs to give: still read
    os.unlink(etc / "os-release")
    (etc / "os-release").write_text("ID=debian\n")
    os.chown(etc / "os-release", NOBODY, NOBODY)
    os.link(etc / "os-release", etc / "os-release.bak")
    assert host.read("/etc/os-release") == "ID=debian\n"
    assert sentinel.unchanged(), sentinel.changes()


def test_a_hard_link_to_roots_file_in_a_users_output_folder_is_neither_read_nor_changed(
    tmp_path: Path, sentinel: Sentinel
) -> None:
    out = _users_folder(tmp_path, "out")
    os.link(sentinel.shadow, out / "index.html")
    tree = OutputTree.open(out, what="--out")
    assert tree.read(out / "index.html", 1 << 20) is None
    assert tree.digest(out / "index.html") is None
    tree.write(out / "index.html", b"<html>report</html>\n")
    st = (out / "index.html").stat()
    assert (st.st_uid, st.st_nlink) == (NOBODY, 1)  # a new file of nobody's: the link replaced
    assert sentinel.unchanged(), sentinel.changes()


def test_a_hard_link_planted_at_the_lock_is_replaced_not_truncated(
    tmp_path: Path, sentinel: Sentinel
) -> None:
    tmp_path.chmod(0o755)
    run_lock = tmp_path / "lock"  # a /run/lock of its own: root's, sticky, open to all
    run_lock.mkdir()
    run_lock.chmod(0o1777)
    os.link(sentinel.shadow, run_lock / "egpu-setup.lock")
    with RunLock(run_lock / "egpu-setup.lock"):
        st = (run_lock / "egpu-setup.lock").stat()
        assert st.st_nlink == 1 and st.st_ino != sentinel.shadow.stat().st_ino
    assert sentinel.unchanged(), sentinel.changes()


def test_a_journal_or_report_appended_to_is_refused_when_it_has_a_second_name(
    tmp_path: Path, sentinel: Sentinel
) -> None:
    from egpu_setup.state.atomic import open_file

    folder = tmp_path / "state"
    folder.mkdir()
    os.link(sentinel.shadow, folder / "journal.jsonl")
    with pytest.raises(OSError) as exc:
        open_file(folder / "journal.jsonl", os.O_WRONLY | os.O_APPEND, anchor=tmp_path)
    assert "hard link" in str(exc.value)
    assert sentinel.unchanged(), sentinel.changes()


# -- descriptors: nothing root holds open (the run lock, a state folder, a report being
# written) reaches a child; a child that is a user's Python could read or write through it.

FD_LISTER = [
    str(SYSTEM_PYTHON),
    "-c",
    "import os\nfor n in os.listdir('/proc/self/fd'):\n"
    "    t = os.readlink('/proc/self/fd/' + n) if os.path.exists('/proc/self/fd/' + n) else ''\n"
    "    print(n, t)",
]


def test_a_child_inherits_no_descriptor_but_its_three_streams(tmp_path: Path) -> None:
    lock = tmp_path / "run.lock"
    held = os.open(tmp_path, os.O_RDONLY)  # an inheritable one, as a careless open would be
    os.set_inheritable(held, True)
    try:
        with RunLock(lock), directory(tmp_path) as dfd:
            for result in (
                process.spawn(FD_LISTER),
                process.spawn(FD_LISTER, run_as=(NOBODY, NOBODY)),
            ):
                fds = dict(line.split(" ", 1) for line in result.out.splitlines())
                # the listing's own descriptor of /proc/self/fd is gone by readlink time
                extra = {n: t for n, t in fds.items() if n not in "012" and t}
                assert extra == {}, (extra, dfd)
    finally:
        os.close(held)


# -- umask: a root shell with `umask 000` (a user's sudo shell, a careless script) must not make
# what egpu-setup or its children create writable by everyone.


def _open_to_others(base: Path) -> list[str]:
    return [k for k, v in tree_digest(base).items() if v[0] != "link" and int(v[1], 8) & 0o022]


def test_a_child_started_from_a_umask_000_shell_gets_022() -> None:
    code = "import os\nprint(oct(os.umask(0)))"
    old = os.umask(0)
    try:
        own = process.spawn([str(SYSTEM_PYTHON), "-c", code])
        as_user = process.spawn([str(SYSTEM_PYTHON), "-c", code], run_as=(NOBODY, NOBODY))
    finally:
        os.umask(old)
    assert (own.out.strip(), as_user.out.strip()) == ("0o22", "0o22")
    old = os.umask(0o077)  # a stricter mask stays
    try:
        assert process.spawn([str(SYSTEM_PYTHON), "-c", code]).out.strip() == "0o77"
    finally:
        os.umask(old)


def test_an_install_from_a_umask_000_shell_creates_nothing_writable_by_others(
    image: Path,
) -> None:
    image.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "EGPU_SETUP_STATE_DIR"}
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup", *_install_args(image)],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=lambda: os.umask(0),
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert _open_to_others(image) == []


def _install_args(img: Path) -> list[str]:
    from helpers.sentinel import TB4

    return [
        "install", "--profile", "rtx4090", "--only", "config", "--root", str(img), "--from",
        str(TB4), "--yes",
    ]  # fmt: skip


# -- resource limits and signals set by the caller: a file size limit that stops a write half
# way, a descriptor limit, a closed stdout. A half-written file is never taken for a whole one.


def _limited(limit: int, which: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write(2) then fails with EFBIG, not a kill
    resource.setrlimit(which, (limit, limit))


@pytest.mark.parametrize(
    ("which", "limit"), [(resource.RLIMIT_FSIZE, 200), (resource.RLIMIT_NOFILE, 12)]
)
def test_an_install_under_a_callers_low_limit_fails_cleanly_and_leaves_no_half_file(
    image: Path, which: int, limit: int
) -> None:
    image.chmod(0o755)
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup", *_install_args(image)],
        capture_output=True,
        text=True,
        preexec_fn=lambda: _limited(limit, which),
        timeout=120,
        check=False,
    )
    if which == resource.RLIMIT_FSIZE or res.returncode != 0:
        assert res.returncode == 1, res.stdout  # 200 bytes: the first state file is cut off
        clean_error(res)
    # what was replaced is whole; the run with the limit lifted finishes the same install
    full = subprocess.run(
        [sys.executable, "-m", "egpu_setup", *_install_args(image)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert full.returncode == 0, full.stderr


def test_a_closed_stdout_ends_the_run_without_a_traceback(cli: RunCli) -> None:
    from helpers.sentinel import TB4

    r, w = os.pipe()
    os.close(r)  # the terminal or the pager went away: every write to stdout is EPIPE
    try:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "egpu_setup",
                "plan",
                "--profile",
                "rtx4090",
                "--from",
                str(TB4),
            ],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(w)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode != 0


pytestmark = AS_NOBODY


# -- sudo's variables: a root shell reached without sudo may carry SUDO_USER and SUDO_UID stale
# or forged. Output folders never ask them (host/trust.py decides by owners); the plan's "run
# pip as the venv's owner" takes them only when passwd says they are one account.


@pytest.mark.parametrize(
    ("user", "uid", "caller"),
    [
        ("nobody", str(NOBODY), ("nobody", NOBODY)),
        ("root", str(NOBODY), None),  # a nobody-owned venv would get pip as root
        ("nobody", "0", None),
        ("no-such-user-here", str(NOBODY), None),
        ("nobody", "65534x", None),
    ],
)
def test_a_forged_sudo_pair_is_taken_only_when_passwd_agrees(
    monkeypatch: pytest.MonkeyPatch, user: str, uid: str, caller: tuple[str, int] | None
) -> None:
    from egpu_setup.host.identity import sudo_caller
    from egpu_setup.host.machine import LiveHost

    monkeypatch.setenv("SUDO_USER", user)
    monkeypatch.setenv("SUDO_UID", uid)
    assert sudo_caller(LiveHost()) == caller


def test_a_forged_sudo_uid_does_not_decide_who_owns_an_output_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from egpu_setup.host.trust import output_owner

    monkeypatch.setenv("SUDO_USER", "nobody")
    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    monkeypatch.setenv("SUDO_GID", str(NOBODY))
    out = tmp_path / "out"  # root's, closed: root writes as itself, whatever sudo's variables say
    tree = OutputTree.open(out, what="--out")
    tree.write(out / "report.txt", b"ok\n")
    assert output_owner(str(out)) is None
    st = (out / "report.txt").stat()
    assert (st.st_uid, st.st_gid) == (0, 0)
