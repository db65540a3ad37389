"""The sleep guard (install/sleep_guard.py) for real: real processes holding a device node,
the guard started as `egpu-setup sleep-guard` the way its unit starts it, and a stand-in for
systemd-inhibit (logind does not run here), given by the same --inhibitor the unit passes.

The stand-in does what systemd-inhibit(1) does with a lock: reads its options, runs COMMAND and
waits for it. It writes the argv it was given to a file, so each test asserts the exact lock
(what, mode, who, the reason naming PID, command and user) and the command that holds it.
"""

from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from egpu_setup.detect.processes import ProcEntry, probe_procs
from egpu_setup.host.process import start_time
from egpu_setup.install.sleep_guard import (
    GuardConfig,
    Holder,
    cuda_holders,
    inhibit_why,
    lock_for,
)

STANDIN = """#!/bin/sh
# systemd-inhibit's shape: --options, then COMMAND, held while it runs
printf '%s\\n' "$@" > "{log}/argv.$$"
while [ "${{1#--}}" != "$1" ]; do shift; done
"$@"
echo "released $?" >> "{log}/argv.$$"
"""

INTERVAL = 0.3
ME = pwd.getpwuid(os.getuid()).pw_name
# the holders' command name as the kernel keeps it (proc(5) comm: at most 15 bytes)
COMM = Path(sys.executable).name[:15]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """The stand-in inhibitor, a fake CUDA node and the folder the stand-in logs to."""
    logs = tmp_path / "locks"
    logs.mkdir()
    inhibitor = tmp_path / "bin" / "systemd-inhibit"
    inhibitor.parent.mkdir()
    inhibitor.write_text(STANDIN.format(log=logs))
    inhibitor.chmod(0o755)
    node = tmp_path / "dev" / "nvidia-uvm"
    node.parent.mkdir()
    node.write_text("")
    yield {"inhibitor": inhibitor, "node": node, "logs": logs, "tmp": tmp_path}


def _holder(node: Path) -> subprocess.Popen[bytes]:
    """A real process holding the node open, as a CUDA process holds /dev/nvidia-uvm."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; f = open({str(node)!r}); print(1, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
    return proc


def _guard(rig: dict[str, Path], *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "egpu_setup",
            "sleep-guard",
            "--inhibitor",
            str(rig["inhibitor"]),
            "--node",
            str(rig["node"]),
            "--interval",
            str(INTERVAL),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


T = TypeVar("T")


def _wait(cond: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _gone(tmp: Path) -> Callable[[], bool]:
    return lambda: not _left_over(tmp)


def _locks(logs: Path) -> list[list[str]]:
    """Every lock taken so far, oldest first: the argv each stand-in got (and its end)."""
    files = sorted(logs.glob("argv.*"), key=lambda p: p.stat().st_mtime_ns)
    return [p.read_text().splitlines() for p in files]


def _expected(rig: dict[str, Path], guard: int, mode: str, why: str, pids: list[int]) -> list[str]:
    return [
        "--what=sleep",
        f"--mode={mode}",
        "--who=egpu-setup",
        f"--why={why}",
        sys.executable,
        "-I",
        "-m",
        "egpu_setup",
        "sleep-guard",
        f"--node={rig['node']}",
        f"--interval={INTERVAL:g}",
        f"--guard={guard}:{start_time(guard)}",
        "--hold",
        *(str(p) for p in pids),
    ]


def _left_over(tmp: Path) -> list[str]:
    """Processes still running that the guard started: the stand-in inhibitor (its script is
    its first argument) and the --hold child (its command line ends `--hold PID...`)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            args = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in args]
        standin = text[1:2] == [str(tmp / "bin" / "systemd-inhibit")]
        holding = "--hold" in text and f"--node={tmp / 'dev' / 'nvidia-uvm'}" in text
        if (standin or holding) and state != "Z":
            out.append(f"{name}: {' '.join(text)}")
    return out


def test_lock_names_the_holder_and_ends_with_it(rig: dict[str, Path]) -> None:
    job = _holder(rig["node"])
    guard = _guard(rig)
    try:
        (lock,) = _wait(lambda: _locks(rig["logs"]), "the lock")
        why = f"CUDA on the eGPU: pid {job.pid} {COMM} ({ME})"
        assert lock == _expected(rig, guard.pid, "block", why, [job.pid])
        job.kill()
        job.wait()
        # the --hold child sees the holder gone and exits: the stand-in (the lock) ends
        _wait(lambda: _locks(rig["logs"])[0][-1] == "released 0", "the lock to be released")
        _wait(lambda: not _left_over(rig["tmp"]), "no leftover process")
        time.sleep(INTERVAL * 4)
        assert len(_locks(rig["logs"])) == 1  # nobody holds the node: no new lock
        assert guard.poll() is None
    finally:
        job.kill()
        guard.terminate()
        guard.wait(10)


def test_lock_is_taken_again_when_the_holders_change(rig: dict[str, Path]) -> None:
    first = _holder(rig["node"])
    guard = _guard(rig, "--inhibit", "delay")
    try:
        _wait(lambda: _locks(rig["logs"]), "the first lock")
        second = _holder(rig["node"])
        try:
            locks = _wait(lambda: _locks(rig["logs"]) if len(_locks(rig["logs"])) == 2 else [], "2")
            pids = sorted([first.pid, second.pid])
            why = f"CUDA on the eGPU: pid {pids[0]} {COMM} ({ME}), pid {pids[1]} {COMM} ({ME})"
            assert locks[0][-1] == "released 0"
            assert locks[1] == _expected(rig, guard.pid, "delay", why, pids)
        finally:
            second.kill()
    finally:
        first.kill()
        guard.terminate()
        guard.wait(10)
    _wait(lambda: not _left_over(rig["tmp"]), "no leftover process")


def test_guard_killed_with_sigkill_leaves_nothing_running(rig: dict[str, Path]) -> None:
    """PR_SET_PDEATHSIG ends the inhibitor with the guard; the --hold child then finds its
    parent gone and ends itself: no lock outlives the guard."""
    job = _holder(rig["node"])
    guard = _guard(rig)
    try:
        _wait(lambda: _locks(rig["logs"]), "the lock")
        assert _left_over(rig["tmp"])
        os.kill(guard.pid, signal.SIGKILL)
        guard.wait()
        _wait(_gone(rig["tmp"]), "the inhibitor and --hold to end")
        assert job.poll() is None  # the student's job is left alone
    finally:
        job.kill()


def test_no_node_no_lock(rig: dict[str, Path]) -> None:
    """Without the node (no eGPU, no driver loaded) nothing is scanned and no lock is taken."""
    rig["node"].unlink()
    guard = _guard(rig)
    try:
        time.sleep(INTERVAL * 5)
        assert guard.poll() is None
        assert _locks(rig["logs"]) == []
    finally:
        guard.terminate()
        guard.wait(10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inhibit", "sideways"], "error: --inhibit 'sideways' is not one of block, delay"),
        (["--inhibitor", "bin/systemd-inhibit"], "error: --inhibitor 'bin/systemd-inhibit' is"),
        (["--inhibitor", "/nonexistent/systemd-inhibit"], "is not an executable file"),
        (["--node", "dev/nvidia-uvm"], "error: --node 'dev/nvidia-uvm' is not an absolute"),
        (["--interval", "0"], "error: --interval 0 is out of range"),
        (["4242"], "PIDS go with --hold only"),
    ],
)
def test_bad_options_exit_2_and_start_nothing(
    rig: dict[str, Path], args: list[str], message: str
) -> None:
    job = _holder(rig["node"])
    try:
        base = ["--inhibitor", str(rig["inhibitor"]), "--node", str(rig["node"])]
        res = subprocess.run(
            [sys.executable, "-m", "egpu_setup", "sleep-guard", *base, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        job.kill()
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert "hint:" in res.stderr or "Usage:" in res.stderr
    assert "Traceback" not in res.stderr
    assert _locks(rig["logs"]) == []


# -- the decision, pure -------------------------------------------------------------------------

CONFIG = GuardConfig("/usr/bin/systemd-inhibit", "/dev/nvidia-uvm", "block", 5.0)


FUSER = Path(__file__).parents[1] / "data/real/fuser/desktop-gtx1080-python-holds-uvm.txt"
# one row of `fuser -v`: NODE: (first row of a node only), USER, PID, ACCESS, COMMAND
_FUSER_ROW = re.compile(r"^(?:(/dev/\S+):)?\s+(\S+)\s+(\d+) ([F.][R.][e.][f.][m.]) (\S+)$")
UIDS = {"root": 0, "raytroop": 1000}  # the paste names users, not uids


def _fuser_listings(text: str) -> list[list[tuple[str, str, int, str, str]]]:
    """Each `fuser -v` listing in a pasted terminal session: (node, user, pid, access, command)."""
    listings: list[list[tuple[str, str, int, str, str]]] = []
    node = ""
    for line in text.splitlines():
        if "$ sudo fuser -v" in line:
            listings.append([])
        elif (m := _FUSER_ROW.match(line)) and listings:
            node = m.group(1) or node
            listings[-1].append((node, m.group(2), int(m.group(3)), m.group(4), m.group(5)))
    return listings


def _proc_tree(root: Path, rows: list[tuple[str, str, int, str, str]]) -> None:
    """The /proc a listing was read from: an `F` is an fd linking to the node, an `m` a line of
    maps naming it (fuser(1) ACCESS), comm and the owner's uid in status (proc(5))."""
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for node, user, pid, access, command in rows:
        (root / node.lstrip("/")).touch()
        proc = root / "proc" / str(pid)
        (proc / "fd").mkdir(parents=True, exist_ok=True)
        (proc / "comm").write_text(command + "\n")
        (proc / "status").write_text(f"Name:\t{command}\nUid:\t{UIDS[user]}\t{UIDS[user]}\n")
        if access.startswith("F"):
            (proc / "fd" / str(len(list((proc / "fd").iterdir())) + 3)).symlink_to(node)
        if access.endswith("m"):
            with (proc / "maps").open("a") as maps:
                maps.write(f"7f3c5a000000-7f3c5a100000 rw-s 00000000 00:06 446 {node}\n")


def test_a_real_fuser_listing_is_read_as_fuser_read_it(tmp_path: Path) -> None:
    """A user's `fuser -v /dev/nvidia*`, before and after killing the CUDA job, rebuilt as the
    /proc it came from and read through the guard's own probe and eject's: the display server,
    compositor and browsers hold the card and never the CUDA node, python alone holds it."""
    from egpu_setup.execute.eject import gpu_users
    from egpu_setup.host.machine import RootHost

    listings = _fuser_listings(FUSER.read_text(encoding="utf-8").split("\n", 1)[1])
    want = yaml.safe_load((FUSER.parent / "expected.yaml").read_text())[FUSER.name]
    assert len(listings) == len(want) == 2
    names = {uid: user for user, uid in UIDS.items()}
    for n, (rows, expect) in enumerate(zip(listings, want, strict=True)):
        root = tmp_path / f"listing-{n}"
        _proc_tree(root, rows)
        host = RootHost(root)
        procs = list(probe_procs(host))
        holders = cuda_holders(procs, "/dev/nvidia-uvm", names)
        assert [h.describe() for h in holders] == expect["cuda"]
        lock = lock_for(CONFIG, holders, ("hold",))
        if expect["cuda"]:
            assert lock is not None and lock.pids == (6943,)
            assert "--why=CUDA on the eGPU: pid 6943 python (raytroop)" in lock.argv
        else:
            assert lock is None  # the display stack alone takes no lock
        users = gpu_users(host, (), None, only_gpu=True)
        assert [int(u.split()[1]) for u in users] == sorted(expect["any_node"])


def test_reason_is_cut_with_a_count_and_printable() -> None:
    holders = tuple(Holder(1000 + i, "pt_data_worker", "student") for i in range(40))
    why = inhibit_why(holders)
    assert len(why) <= 400
    assert why.startswith("CUDA on the eGPU: pid 1000 pt_data_worker (student), ")
    assert why.endswith(" more")
    assert inhibit_why((Holder(7, "evil\nname", "u"),)) == "CUDA on the eGPU: pid 7 evil?name (u)"


def test_unknown_uid_is_shown_as_digits_and_self_is_left_out() -> None:
    procs = [
        ProcEntry(5, "python3", 4242, ("/dev/nvidia-uvm",)),
        ProcEntry(6, "egpu-setup", 0, ("/dev/nvidia-uvm",)),
    ]
    assert cuda_holders(procs, "/dev/nvidia-uvm", {}, exclude=(6,)) == (
        Holder(5, "python3", "4242"),
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("sideways", 'hotplug.sleep_inhibit: "sideways" is not one of: block, delay, off'),
        ("off", "hotplug.sleep_inhibit: `off` is a YAML 1.1 boolean"),
    ],
)
def test_profile_key_is_checked_against_the_schema(
    tmp_path: Path, value: str, message: str
) -> None:
    """hotplug.sleep_inhibit (profile.schema.json): block, delay or "off", nothing else reaches
    the unit's command line; an unquoted off is YAML 1.1's false and is refused too."""
    path = tmp_path / "lab.yaml"
    path.write_text(f"name: lab\nextends: rtx4090\nhotplug:\n  sleep_inhibit: {value}\n")
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "profiles", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert message in res.stderr and "hint:" in res.stderr
    path.write_text('name: lab\nextends: rtx4090\nhotplug:\n  sleep_inhibit: "off"\n')
    ok = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "profiles", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
