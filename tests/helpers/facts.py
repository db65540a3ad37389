"""Host facts for tests, read from the recorded hosts (tests/fixtures/hosts/), never typed in.

`recorded(name)` is what detect_host reads from that recording, through the same code path as a
live machine; a test that needs something else says exactly what, with dataclasses.replace, and
every other fact stays the real one.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from conftest import FIXTURES
from egpu_setup.detect.facts import HostFacts, NvidiaFacts
from egpu_setup.detect.probe import detect_host
from egpu_setup.host.machine import RecordedHost


@functools.cache
def recorded(name: str) -> HostFacts:
    """The facts of the recorded host `name` (a directory of tests/fixtures/hosts/)."""
    return detect_host(RecordedHost(FIXTURES / name))


def without_driver(facts: HostFacts) -> HostFacts:
    """The same machine before any NVIDIA driver was installed (what `install` starts from)."""
    gpus = tuple(replace(g, driver=None) if g.vendor == "nvidia" else g for g in facts.gpus)
    return replace(facts, gpus=gpus, nvidia=NvidiaFacts())
