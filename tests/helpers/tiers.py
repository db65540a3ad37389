"""The suite's two tiers: the heavy kinds of test, and the check that keeps a heavy test marked.

A test that builds a debootstrap root, boots QEMU, runs Xorg, Vagrant, Chromium or Ansible
carries that kind's marker (pyproject.toml registers them); each kind is also `slow`
(tests/conftest.py adds it), so `--quick` and `-m "not slow"` leave it out (docs/testing.md).
The helpers that start those tools call `require(kind)` first: a test that reaches one
unmarked fails and says which marker it lacks, so the quick tier stays quick as tests are added.
conftest.py names the running test's kinds (`running`) around each test's setup, call and
teardown, which is when a module's shared fixture is built too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

HEAVY = ("debootstrap", "qemu", "xorg", "vagrant", "chromium", "ansible")

# The kinds the running test is marked with; None outside a pytest test (a helper run as a
# script, `python tests/helpers/debroot.py`, may build what it likes).
_marked: frozenset[str] | None = None


@contextmanager
def running(kinds: frozenset[str]) -> Iterator[None]:
    """While a test with these heavy markers runs (conftest.py's hook wrappers)."""
    global _marked
    before, _marked = _marked, kinds
    try:
        yield
    finally:
        _marked = before


def require(kind: str) -> None:
    """Fail the running test unless it is marked `kind` (a heavy tool is about to start)."""
    assert kind in HEAVY, kind
    if _marked is not None and kind not in _marked:
        pytest.fail(
            f"this test starts {kind} but is not marked {kind}: add @pytest.mark.{kind} "
            f"(or the module's pytestmark) so that --quick leaves it out (docs/testing.md)",
            pytrace=False,
        )
