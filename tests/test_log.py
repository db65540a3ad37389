"""Loggers that import `logging` only when a record could be shown (egpu_setup/log.py)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from egpu_setup.log import get_logger


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )


def test_debug_and_info_cost_no_import_and_a_warning_still_shows() -> None:
    res = _child(
        "import sys\n"
        "from egpu_setup.log import get_logger\n"
        "log = get_logger('egpu_setup.x')\n"
        "log.debug('d %s', 1); log.info('i')\n"
        "print('logging' in sys.modules)\n"
        "log.warning('careful: %s', 'disk')\n"
    )
    assert res.stdout == "False\n"
    assert res.stderr == "careful: disk\n"  # Python's last-resort handler: the bare message


def test_records_reach_logging_once_it_is_imported(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("egpu_setup.test")
    with caplog.at_level(logging.DEBUG, logger="egpu_setup"):
        log.debug("seen %s", "here")
        log.info("and %s", "this")
    assert [r.getMessage() for r in caplog.records] == ["seen here", "and this"]
    # each record names the line that logged it, not the stand-in's
    assert {(r.filename, r.funcName) for r in caplog.records} == {
        ("test_log.py", "test_records_reach_logging_once_it_is_imported")
    }
    assert log.isEnabledFor(logging.DEBUG) is False  # every other name is the real logger's


@pytest.mark.parametrize(
    ("flags", "shown"),
    [((), ""), (("-vv",), "DEBUG: ")],
)
def test_verbose_flags_configure_logging(flags: tuple[str, ...], shown: str) -> None:
    res = _child(
        "import sys; from egpu_setup.cli import main; sys.argv = ['egpu-setup', *sys.argv[1:]]; "
        "main()",
        *flags,
        "detect",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    prefixes = {line.split(":", 1)[0] + ": " for line in res.stderr.splitlines()} - {"warning: "}
    assert (shown in prefixes) if shown else not prefixes & {"INFO: ", "DEBUG: "}
