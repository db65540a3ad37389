"""An image left by a killed or failed package run: the next install finishes dpkg's work first.

Two shapes of an interrupted dpkg (both reproduced in a Debian 12 image): killed
mid-unpack, dpkg's journal files are left in /var/lib/dpkg/updates/ and apt refuses everything
("dpkg was interrupted, you must manually run 'dpkg --configure -a'"); or a maintainer script
failed, leaving packages half-configured or unpacked, which `dpkg --audit` lists but exits 0
for (dpkg 1.21). Either way the plan starts with `dpkg --configure -a`, before the apt steps.
Planned through the CLI on a copy of the cached debootstrap root (a dry run: nothing changes).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import RunCli
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.installed import dpkg_interrupted, unfinished_packages
from helpers import debroot as _debroot

pytestmark = pytest.mark.debootstrap


@pytest.fixture
def image(tmp_path: Path) -> Path:
    return _debroot.copy_or_skip("bookworm", tmp_path / "image")


def _set_state(root: Path, package: str, status: str) -> None:
    db = root / "var/lib/dpkg/status"
    text, n = re.subn(
        rf"(^Package: {re.escape(package)}\n(?:[^\n]+\n)*?)Status: [^\n]+",
        rf"\1Status: {status}",
        db.read_text(),
        count=1,
        flags=re.M,
    )
    assert n == 1, package
    db.write_text(text)


def _plan(cli: RunCli, root: Path) -> list[dict[str, Any]]:
    res = cli(
        "install", "--profile", "rtx3080", "--only", "driver", "--root", str(root),
        "--dry-run", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    result: list[dict[str, Any]] = json.loads(res.stdout)["steps"]
    return result


def _first(steps: list[dict[str, Any]]) -> str:
    return json.dumps(steps[0])


RECOVERY = '"dpkg", "--configure", "-a"'  # (the plan's one trigger run is `--configure --pending`)


def test_a_clean_image_plans_no_recovery(cli: RunCli, image: Path) -> None:
    assert dpkg_interrupted(RootHost(image)) is None
    assert all(RECOVERY not in json.dumps(s) for s in _plan(cli, image))


@pytest.mark.parametrize(
    "status",
    [
        "install ok half-configured",
        "install ok unpacked",
        "install reinstreq half-installed",
        "install ok triggers-pending",  # installed, its triggers not run: configure finishes it
    ],
)
def test_a_package_a_failed_script_left_is_finished_first(
    cli: RunCli, image: Path, status: str
) -> None:
    _set_state(image, "hostname", status)
    assert unfinished_packages(RootHost(image)) == ["hostname"]
    steps = _plan(cli, image)
    assert RECOVERY in _first(steps)
    assert "did not finish (hostname)" in _first(steps)
    assert any("apt-get" in json.dumps(s) for s in steps[1:])  # the driver's packages after it


def test_dpkgs_journal_left_by_a_kill_is_finished_first(cli: RunCli, image: Path) -> None:
    (image / "var/lib/dpkg/updates/0000").write_text("Package: hostname\n")
    steps = _plan(cli, image)
    assert RECOVERY in _first(steps)
    assert "was interrupted" in _first(steps)


def test_a_running_package_manager_is_not_taken_for_an_interrupted_one(
    cli: RunCli, image: Path, tmp_path: Path
) -> None:
    """A dpkg at work leaves the same journal files; while a live process holds dpkg's lock
    (fcntl, as dpkg takes it) the plan names that process and plans no recovery."""
    (image / "var/lib/dpkg/updates/0000").write_text("Package: hostname\n")
    lock = image / "var/lib/dpkg/lock"
    lock.touch()
    ready = tmp_path / "ready"
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            if ready.exists():
                break
            time.sleep(0.05)
        res = cli(
            "install", "--profile", "rtx3080", "--only", "driver", "--root", str(image),
            "--dry-run", "--json",
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        plan = json.loads(res.stdout)
        assert all(RECOVERY not in json.dumps(s) for s in plan["steps"])
        assert any(f"pid {holder.pid}" in w and "not an interrupted one" in w
                   for w in plan["plan_warnings"]), plan["plan_warnings"]  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    # the lock released, the same journal is an interrupted dpkg again
    assert RECOVERY in _first(_plan(cli, image))
