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
from pathlib import Path

import pytest

from egpu_setup.host.machine import RootHost
from egpu_setup.plan.installed import dpkg_interrupted, unfinished_packages
from helpers import debroot as _debroot

pytestmark = pytest.mark.slow


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


def _plan(cli, root: Path) -> list[dict]:
    res = cli(
        "install", "--profile", "rtx3080", "--only", "driver", "--root", str(root),
        "--dry-run", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)["steps"]


def _first(steps: list[dict]) -> str:
    return json.dumps(steps[0])


def test_a_clean_image_plans_no_recovery(cli, image: Path) -> None:
    assert dpkg_interrupted(RootHost(image)) is None
    assert all("--configure" not in json.dumps(s) for s in _plan(cli, image))


@pytest.mark.parametrize(
    "status",
    [
        "install ok half-configured",
        "install ok unpacked",
        "install reinstreq half-installed",
        "install ok triggers-pending",  # installed, its triggers not run: configure finishes it
    ],
)
def test_a_package_a_failed_script_left_is_finished_first(cli, image: Path, status: str) -> None:
    _set_state(image, "hostname", status)
    assert unfinished_packages(RootHost(image)) == ["hostname"]
    steps = _plan(cli, image)
    assert '"dpkg", "--configure", "-a"' in _first(steps)
    assert "did not finish (hostname)" in _first(steps)
    assert any("apt-get" in json.dumps(s) for s in steps[1:])  # the driver's packages after it


def test_dpkgs_journal_left_by_a_kill_is_finished_first(cli, image: Path) -> None:
    (image / "var/lib/dpkg/updates/0000").write_text("Package: hostname\n")
    steps = _plan(cli, image)
    assert '"dpkg", "--configure", "-a"' in _first(steps)
    assert "was interrupted" in _first(steps)
