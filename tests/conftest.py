"""Shared test setup: state goes to a temp dir, and recorded hosts are easy to reach.

Two options of this suite (docs/testing.md):
  --quick    leaves out the tests marked `slow` (debootstrap roots, QEMU, Xorg, Vagrant,
             Chromium, Ansible, torch-sized installs): a developer's loop between edits.
  --no-skip  a skipped test fails instead, unless it is marked `gpu`: CI (.ci/run) installs
             every tool the suite drives, so a skip there means a check silently did not run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from helpers.tiers import HEAVY, running

if TYPE_CHECKING:
    from pluggy import Result  # pluggy 1.1's name (pytest 7.4 allows older)

    # helpers.sentinel imports this module: the fixture imports it when it runs
    from helpers.sentinel import Sentinel

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
# Where the slow helpers keep what they build once per run (tests/helpers/debroot.py, image.py,
# pypi_index.py): the debootstrap roots, the image base, the .debs, the torch wheels.
CACHE_ENV = "EGPU_SETUP_TEST_CACHE"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("egpu-setup")
    group.addoption(
        "--quick",
        action="store_true",
        help="leave out the tests marked slow (debootstrap, QEMU, Xorg, Vagrant, Chromium, "
        "Ansible); CI runs everything",
    )
    group.addoption(
        "--no-skip",
        action="store_true",
        help="a skipped test fails unless it is marked gpu (CI installs every tool the suite uses)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """In an unpacked sdist, which cannot carry symlinks, rebuild the recorded sysfs trees first.

    A git checkout has them committed (a test checks they equal the generator's output). Then,
    unless the caller named one, a cache directory for this run only, removed when it ends:
    a root built from last week's archive must not stand in for today's."""
    if hasattr(config, "workerinput"):
        return  # a pytest-xdist worker: the controller has done it, and its environment holds
    if FIXTURES.is_dir() and not (FIXTURES / "tb3-rtx3090-ubuntu2204" / "root").is_dir():
        subprocess.run([sys.executable, str(FIXTURES.parent / "build_hosts.py")], check=True)
    if not os.environ.get(CACHE_ENV):
        # set before pytest-xdist starts its workers (pytest_sessionstart), which inherit it
        run_cache = tempfile.mkdtemp(prefix="egpu-setup-test-cache-")
        os.environ[CACHE_ENV] = run_cache
        config.add_cleanup(lambda: _remove_cache(Path(run_cache)))
    # the wheels egpu-setup keeps of itself (scripts/install.sh makes them), which `install
    # --root` and `bundle` put into images and bundles: of this checkout as it is now
    from helpers.kept_wheels import keep

    keep(Path(os.environ[CACHE_ENV]))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The overlay copies of the debootstrap roots this process mounted (helpers/debroot.py's
    layered_copy, one per test that asked) are unmounted: no mount outlives its session."""
    from helpers import debroot

    debroot.release_all()


def _remove_cache(cache: Path) -> None:
    """The run's cache, never across a mount (rm's --one-file-system: a bound /dev stays)."""
    subprocess.run(["rm", "-rf", "--one-file-system", str(cache)], check=False)
    if cache.exists():
        print(f"egpu-setup tests: {cache} was not removed (a mount below it?)", file=sys.stderr)


# pytest-xdist hands out whole files (--dist loadfile) in the order of the queue this hook leaves
# (pyproject.toml turns off xdist's own reordering, which sorts files by how many tests they
# hold: the lab-image file, 19 tests and the longest by far, went out 33rd of 108, and files of
# 2 to 4 long tests last, to run alone at the end). Longest first, so they overlap the rest:
# the files measured slowest (`--durations`, docs/testing.md), then any other file with a slow
# test, then the rest by their number of tests, as xdist would.
LONGEST_FIRST = (
    "test_image_boot.py",  # about 11 min: the image (DKMS), its boot under TCG, two rollbacks
    "test_verify_cuda.py",  # 26 real verify children, DDP ranks among them
    "test_ansible_rollout.py",
    "test_pip_kill.py",
    "test_bundle.py",
    "test_apt_kill.py",
    "test_ansible.py",
)


def _heavy_kinds(item: pytest.Item) -> frozenset[str]:
    return frozenset(kind for kind in HEAVY if item.get_closest_marker(kind) is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """A heavy tool started by this test's setup (a module's shared fixture too), call or
    teardown must be one its markers name (helpers/tiers.py)."""
    with running(_heavy_kinds(item)):
        yield


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection, so "not slow" sees it too
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # each heavy kind (helpers/tiers.py) is slow too: one marker says both
        if item.get_closest_marker("slow") is None and _heavy_kinds(item):
            item.add_marker(pytest.mark.slow)
    if config.getoption("quick"):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    items.sort(key=_longest_first(items))  # stable: a file's tests stay together and in order


def _longest_first(items: list[pytest.Item]) -> Callable[[pytest.Item], tuple[int, int, int]]:
    count = Counter(item.path for item in items)
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def key(item: pytest.Item) -> tuple[int, int, int]:
        name = item.path.name
        rank = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return rank, item.path not in slow, -count[item.path]

    return key


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Result[pytest.TestReport]]:
    """Under --no-skip a skip is a failure that says what did not run and why."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and item.config.getoption("no_skip")
        and item.get_closest_marker("gpu") is None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under --no-skip (CI installs what this needs): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, Result[pytest.CollectReport]]:
    """A whole module skipped while collecting (importorskip at its top) fails the same way."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and collector.config.getoption("no_skip"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under --no-skip (CI installs what this needs): {reason}"


@pytest.fixture(autouse=True)
def _isolated_state(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """No test writes to /var/lib/egpu-setup or reads a developer's own profiles."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(state))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))
    yield


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a child process (errors are printed by cli.main)."""
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


class RunCli(Protocol):
    """The `cli` fixture's type: run_cli's signature."""

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...


@pytest.fixture
def cli() -> RunCli:
    return run_cli


@pytest.fixture
def sentinel(tmp_path: Path) -> Sentinel:
    """Files outside the target that a hostile input points at (helpers/sentinel.py)."""
    from helpers.sentinel import Sentinel

    return Sentinel(tmp_path / "outside")


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty image root whose state lives inside it (not in the test's state dir)."""
    monkeypatch.delenv("EGPU_SETUP_STATE_DIR")
    img = tmp_path / "img"
    img.mkdir()
    return img
