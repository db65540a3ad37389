"""Hostile: the state read back (what rollback restores from) through a directory swapped for a
link after its paths were worked out. Every state read walks from the anchor by descriptor, as
the writes do (state/paths.read_state), so it is refused, naming the link, instead of reading
a manifest, a journal or reports someone else put there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egpu_setup.state.atomic import LinkInPath
from egpu_setup.state.journal import Journal
from egpu_setup.state.manifest import MANIFEST_SCHEMA, Manifest
from egpu_setup.state.paths import StatePaths
from egpu_setup.state.reports import highest_sequence


@pytest.fixture
def swapped(tmp_path: Path) -> tuple[StatePaths, Path]:
    """An image's state paths, worked out; then its var/lib swapped for a link to a folder
    holding a state of someone else's (a manifest naming /etc/shadow as ours)."""
    root = tmp_path / "image"
    (root / "var/lib/egpu-setup").mkdir(parents=True)
    paths = StatePaths.system(root)
    assert paths.anchor == root
    planted = tmp_path / "planted"
    (planted / "egpu-setup/reports").mkdir(parents=True)
    manifest = {"schema": MANIFEST_SCHEMA, "files": {"/etc/shadow": {"created": True}}}
    (planted / "egpu-setup/manifest.json").write_text(json.dumps(manifest))
    (planted / "egpu-setup/journal.jsonl").write_text('{"event": "run-start", "run": "x"}\n')
    (planted / "egpu-setup/reports/verify-1.json").write_text('{"sequence": 99}')
    (root / "var/lib").rename(tmp_path / "moved")
    (root / "var/lib").symlink_to(planted)
    return paths, root / "var/lib"


def test_the_manifest_is_not_read_through_a_swapped_directory(
    swapped: tuple[StatePaths, Path],
) -> None:
    paths, link = swapped
    with pytest.raises(LinkInPath) as refused:
        Manifest.load(paths)
    assert str(link) in refused.value.message


def test_the_journal_is_not_read_through_a_swapped_directory(
    swapped: tuple[StatePaths, Path],
) -> None:
    paths, _ = swapped
    with pytest.raises(LinkInPath):
        list(Journal(paths).events())


def test_report_sequences_are_not_read_through_a_swapped_directory(
    swapped: tuple[StatePaths, Path],
) -> None:
    paths, _ = swapped
    assert highest_sequence(paths.state_dir / "reports", paths.anchor) == 0
