"""The quick tier leaves every heavy test out, and a heavy tool started unmarked fails its test.

docs/testing.md, "Running them": `--quick` (or `-m "not slow"`) is the tier without debootstrap,
QEMU, Xorg, Vagrant, Chromium or Ansible; each kind's marker implies `slow`
(tests/conftest.py), and the helpers that start those tools check the running test's markers
(tests/helpers/tiers.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import debroot, tiers

TESTS = Path(__file__).resolve().parent
# one module of each heavy kind, wholly or in part
HEAVY_FILES = {
    "debootstrap": "install/test_install_root.py",
    "qemu": "test_image_boot.py",
    "xorg": "render/test_checkers.py",
    "vagrant": "test_vagrant.py",
    "chromium": "fleet/test_report_browser.py",
    "ansible": "test_ansible_rollout.py",
}


def _collect(*args: str) -> tuple[set[str], int]:
    """The test ids pytest selects from the heavy files with `args`, and how many it
    collected in all (collection only, no test runs)."""
    files = [str(TESTS / f) for f in HEAVY_FILES.values()]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n0", "-q", "--collect-only", "-p", "no:cacheprovider",
         *args, *files],
        capture_output=True, text=True, cwd=TESTS.parent, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]  # 5: none left
    summary = re.search(r"^(\d+)/(\d+) tests collected", proc.stdout, re.MULTILINE)
    assert summary, proc.stdout[-3000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}, int(summary[2])


def test_the_quick_tier_leaves_out_every_heavy_kind() -> None:
    quick, total = _collect("--quick")
    heavy, total_again = _collect("-m", " or ".join(HEAVY_FILES))
    assert total == total_again
    assert quick and heavy and not quick & heavy
    for file in HEAVY_FILES.values():
        assert any(test.startswith(f"tests/{file}::") for test in heavy), file
    # each kind by name: the boot, an Xorg parse, a Chromium page, a playbook, vagrant validate
    for name in ("test_the_image_boots_to_multi_user", "test_xorg_parser_catches_a_broken",
                 "test_the_page_renders_charts", "test_canary_then_batches", "test_validate_"):  # fmt: skip
        assert any(name in test for test in heavy), name
    # what stays are the tests of those files that start none of the tools (shellcheck, ruby -c)
    assert any("test_shellcheck_catches_a_bad_script" in test for test in quick)


def test_a_heavy_tool_fails_a_test_not_marked_for_it(tmp_path: Path) -> None:
    # this test carries no heavy marker: building a root fails before debootstrap starts
    with pytest.raises(pytest.fail.Exception, match=r"not marked debootstrap: add @pytest\.mark"):
        debroot.build("bookworm", dest=tmp_path / "root")
    assert list(tmp_path.iterdir()) == []  # no root, no lock file
    with pytest.raises(pytest.fail.Exception, match="starts qemu but is not marked qemu"):
        tiers.require("qemu")


def test_a_test_marked_for_one_kind_may_start_only_that_one() -> None:
    with tiers.running(frozenset({"qemu"})):
        tiers.require("qemu")
        with pytest.raises(pytest.fail.Exception, match="not marked debootstrap"):
            tiers.require("debootstrap")
    with pytest.raises(pytest.fail.Exception):
        tiers.require("qemu")  # the running test's kinds again, not the block's


@pytest.fixture(scope="module")
def shared_fixture_failure() -> str:
    """A module's shared fixture is built inside the first test that asks for it, and is held
    to that test's markers too."""
    with pytest.raises(pytest.fail.Exception) as failed:
        tiers.require("ansible")
    return str(failed.value)


def test_a_shared_fixture_is_held_to_the_markers_of_the_test_that_builds_it(
    shared_fixture_failure: str,
) -> None:
    assert "starts ansible but is not marked ansible" in shared_fixture_failure
