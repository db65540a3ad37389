"""Hostile: a local user's process that names itself NVIDIA's daemon while it holds the eGPU's
device node. /proc/PID/comm is the process's own to set (proc(5)); `eject` would take it for
nvidia-persistenced, leave it out of the users, and unplug a GPU still in use. Replayed through
the same fake /proc the eject tests use (no GPU here), and the real comm write checked as nobody."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import run_cli
from execute.test_eject import CHAIN, _process, fake_root
from helpers.sentinel import AS_NOBODY, SYSTEM_PYTHON, drop_to_nobody

pytestmark = AS_NOBODY


def test_nobody_can_name_its_process_nvidia_persistenced() -> None:
    code = (
        "open('/proc/self/comm', 'w').write('nvidia-persistenced')\n"
        "print(open('/proc/self/comm').read().strip())"
    )
    res = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", code],
        preexec_fn=drop_to_nobody,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.stdout.strip() == "nvidia-persiste", res.stderr  # cut to 15, as the daemon's


def test_a_process_named_like_the_daemon_still_blocks_the_eject(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    _process(root, 4242, "nvidia-persiste", ["/dev/nvidia0"])
    (root / "proc/4242/exe").symlink_to("/tmp/not-the-daemon")
    res = run_cli("eject", "--yes", "--root", str(root))
    assert res.returncode == 5, res.stderr
    assert "pid 4242 (nvidia-persiste)" in res.stderr
    assert (root / CHAIN / "0000:3c:00.0/remove").read_text() == ""


def test_the_daemon_itself_does_not_block_the_eject(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    _process(root, 4242, "nvidia-persiste", ["/dev/nvidia0"])
    (root / "proc/4242/exe").symlink_to("/usr/bin/nvidia-persistenced")
    res = run_cli("eject", "--yes", "--root", str(root))
    assert "pid 4242" not in res.stderr, res.stderr
