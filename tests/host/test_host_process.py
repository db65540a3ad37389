"""The Host's processes (host/process.py): live output, a deadline that holds, the whole session
ended on timeout, and what a child is given (env, cwd, closed stdin, another user)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from egpu_setup.errors import ExecutionError
from egpu_setup.host.machine import LiveHost, RecordedHost, RootHost
from egpu_setup.host.process import session_members, spawn

PY = sys.executable


def _gone(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # a zombie waiting for a parent that is not us: dead
            return True
        time.sleep(0.05)
    return False


def test_lines_reach_the_callback_while_the_child_still_runs() -> None:
    seen: list[tuple[str, float]] = []
    started = time.monotonic()
    res = LiveHost().stream(
        [PY, "-u", "-c", "import time; print('first'); time.sleep(1.5); print('second')"],
        on_line=lambda line: seen.append((line, time.monotonic() - started)),
        timeout=30,
    )
    assert res.ok and [s for s, _ in seen] == ["first", "second"]
    assert seen[0][1] < seen[1][1] - 1.0  # the first line came before the child slept
    assert res.out == "first\nsecond\n"


def test_stderr_is_merged_into_the_stream_and_kept() -> None:
    lines: list[str] = []
    res = LiveHost().stream(
        ["sh", "-c", "echo out; echo err >&2; exit 4"], on_line=lines.append, timeout=30
    )
    assert res.rc == 4 and not res.ok and sorted(lines) == ["err", "out"]
    assert res.tail() == res.out.strip()


def test_run_captures_stdout_and_stderr_apart_in_the_c_locale() -> None:
    res = LiveHost().run(["sh", "-c", 'echo "$LC_ALL"; echo oops >&2'], timeout=30)
    assert (res.rc, res.out, res.err) == (0, "C.UTF-8\n", "oops\n")


def test_a_timeout_ends_the_whole_session_even_a_process_in_a_group_of_its_own(
    tmp_path: Path,
) -> None:
    """A grandchild that moved to a process group of its own (as a shell's job control does)
    is out of reach of killpg; it is still in the child's session, and goes with it."""
    pids = tmp_path / "pids"
    child = (
        "import os, subprocess, sys, time\n"
        "def own_group():\n"
        "    os.setpgid(0, 0)\n"
        f"g = subprocess.Popen([{PY!r}, '-c', 'import time; time.sleep(60)'],"
        " preexec_fn=own_group)\n"
        f"s = subprocess.Popen([{PY!r}, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write("
        "f'{g.pid} {s.pid} {os.getpgid(g.pid)} {os.getpgid(0)}')\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    res = LiveHost().stream([PY, "-c", child], timeout=10)  # time to start on a busy machine
    assert res.timed_out and not res.ok and not res.stuck
    assert time.monotonic() - started < 30
    assert "ready" in res.out
    own_group, same_group, its_group, child_group = (int(p) for p in pids.read_text().split())
    assert its_group != child_group  # killpg(child) alone would have missed it
    assert _gone(own_group) and _gone(same_group)


def test_term_grace_lets_the_child_clean_up_before_sigkill(tmp_path: Path) -> None:
    mark = tmp_path / "cleaned"
    child = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(mark)!r}, 'w'), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    res = LiveHost().stream([PY, "-c", child], timeout=8, term_grace=5)
    assert res.timed_out and mark.exists() and res.rc == 0


def test_a_child_that_exits_is_not_held_up_by_a_grandchild_keeping_the_pipe(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    res = LiveHost().stream(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; echo done"])
    took = time.monotonic() - started
    assert res.ok and "done" in res.out and took < 15, took
    os.kill(int(pidfile.read_text()), 9)  # not ours to end: the child finished on its own


def test_env_cwd_and_a_closed_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGPU_SETUP_TEST_OURS", "leaks")
    script = (
        "import os, sys\n"
        "print(os.getcwd())\n"
        "print(os.environ.get('EGPU_SETUP_TEST_OURS'), os.environ.get('GIVEN'))\n"
        "print(repr(sys.stdin.read()))\n"
    )
    host = LiveHost()
    added = host.stream([PY, "-c", script], env={"GIVEN": "1"}, cwd=tmp_path, timeout=30)
    assert added.out.splitlines() == [str(tmp_path), "leaks 1", "''"]
    whole = host.stream(
        [PY, "-c", script], env={"GIVEN": "2", "PATH": os.environ["PATH"]}, replace_env=True
    )
    assert whole.out.splitlines()[1] == "None 2"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_run_as_another_user_with_no_extra_groups() -> None:
    res = LiveHost().stream(["id", "-u"], run_as=(65534, 65534), timeout=30)
    assert res.out.strip() == "65534"
    groups = LiveHost().stream(["id", "-G"], run_as=(65534, 65534), timeout=30)
    assert groups.out.split() == ["65534"]


def test_run_checked_names_the_exit_status_and_quotes_the_output() -> None:
    with pytest.raises(ExecutionError) as info:
        LiveHost().run_checked(["sh", "-c", "echo why it failed; exit 7"], timeout=30)
    err = info.value
    assert err.rc == 7 and "exited with 7" in err.message and "why it failed" in err.stderr_tail


def test_a_missing_program_is_an_execution_error_with_127() -> None:
    for call in (LiveHost().run, LiveHost().stream):
        with pytest.raises(ExecutionError) as info:
            call(["egpu-setup-no-such-program"])
        assert info.value.rc == 127 and "command not found" in info.value.message


def test_root_and_recorded_hosts_say_how_a_command_runs(tmp_path: Path) -> None:
    # entered with its API filesystems, in namespaces of its own (host/image_root.py)
    argv = RootHost(tmp_path).argv_for(["true"])
    assert argv[argv.index("unshare") :][:8] == [
        "unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--"
    ]  # fmt: skip
    assert argv[-3:] == [str(tmp_path.resolve()), "--", "true"]
    (tmp_path / "commands").mkdir()
    recorded = RecordedHost(tmp_path)
    for call in (recorded.run, recorded.stream, recorded.run_checked):
        with pytest.raises(ExecutionError, match="a recorded host cannot run commands"):
            call(["true"])


def test_session_members_finds_our_own_session() -> None:
    assert session_members(os.getsid(0))[os.getpid()] == os.getpgid(0)


def test_spawn_keeps_the_newest_output_when_it_is_huge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("egpu_setup.host.process.MAX_OUTPUT", 1000)
    res = spawn([PY, "-c", "print('x' * 5000); print('end')"], timeout=30)
    assert len(res.out) == 1000 and res.out.endswith("end\n")


def test_a_child_dies_when_egpu_setup_is_killed_with_sigkill(tmp_path: Path) -> None:
    """kill -9 of the parent during a long child: the kernel ends the child (PR_SET_PDEATHSIG)."""
    import signal as _signal
    import time as _time

    pidfile = tmp_path / "child.pid"
    script = (
        "from egpu_setup.host import process\n"
        f"process.spawn(['sh', '-c', 'echo $$ > {pidfile}; exec sleep 300'])\n"
    )
    parent = subprocess.Popen([PY, "-c", script], cwd=str(Path(__file__).parents[2]))
    deadline = _time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()) and _time.monotonic() < deadline:
        _time.sleep(0.05)
    child = int(pidfile.read_text())
    os.kill(parent.pid, _signal.SIGKILL)
    parent.wait()
    deadline = _time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and _time.monotonic() < deadline:
        _time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the child outlived its killed parent"


def test_bare_and_relative_programs_come_from_the_system_path_only() -> None:
    from egpu_setup.host.process import prepare

    assert prepare(["sh", "-c", "true"])[0] in ("/usr/bin/sh", "/bin/sh")
    with pytest.raises(ExecutionError, match="relative path"):
        prepare(["./python3", "-c", "1"])
    assert prepare(["/usr/bin/python3", "-m", "venv", "x"])[:3] == ["/usr/bin/python3", "-I", "-m"]
    # a launcher that looks its program up by name would run a Python without -I, off PATH
    for launcher in ("env", "/usr/bin/env", "nice", "timeout"):
        with pytest.raises(ExecutionError, match="starts a program by name"):
            prepare([launcher, "python3", "-m", "pip"])


def test_input_reaches_stdin_and_never_the_argv() -> None:
    """A secret (the MokManager password openssl hashes) goes on stdin, then end of file; without
    `input` stdin is /dev/null, so a child that reads never waits for a terminal."""
    from egpu_setup.host import process
    from egpu_setup.host.machine import LiveHost

    res = LiveHost().run(["sh", "-c", 'read -r line; echo "got:$line"; cat /proc/$$/cmdline'],
                         input=b"s3cret\n", timeout=10)  # fmt: skip
    assert res.rc == 0 and res.out.startswith("got:s3cret\n"), res
    assert "s3cret" not in res.out.split("\n", 1)[1]
    assert LiveHost().run(["cat"], timeout=10).out == ""  # /dev/null: end of file at once
    with pytest.raises(ValueError, match="at most"):
        process.spawn(["cat"], input=b"x" * (process.MAX_INPUT + 1), timeout=10)
    # a child that exits without reading is no error of ours: its status says
    assert LiveHost().run(["true"], input=b"unread\n", timeout=10).rc == 0
