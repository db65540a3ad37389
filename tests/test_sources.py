"""Sources a reader of the repository can follow: public documents (an upstream file, a manual
page, a vendor page, an upstream project's issue), docs/ (docs/design.md holds the contracts), or
an entry of docs/sources.md; never a note that lives outside the repository ("§3.1 of some
reference", "[K2]", "the brief", a design document that is not in it) nor this project's own
issue tracker ("issue 20"): the reader has neither.

Recorded data is what the world printed (tests/fixtures, tests/data) and is left as it is.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO

OUTSIDE = re.compile(
    r"§"
    r"|\breference/"
    r"|/tmp/brief|\(brief[,:]|\bthe brief\b"
    r"|\b(?:matrix-facts|hotplug-security|fleet-and-testing|egpu-tools|aesthetics)(?:\.md)?\b"
)
# A design document outside the repository, or an issue of this project's tracker by number. An
# upstream project's issue is cited with its repository and a hash ("pytorch/pytorch#150733",
# "NVIDIA/open-gpu-kernel-modules issue #842"), which this leaves alone.
PRIVATE = re.compile(r"\bDESIGN\.md\b|\b[Ii]ssues? \d+\b|\bissue-\d+\b")
# A key into a note's source list: [K2], [N1], [R11]. pci.ids names read the same ("GA102GL [A10]"),
# so the GPU table, what it is built from and its compiled form are not searched for them.
NOTE_KEY = re.compile(r"\[[A-Z]{1,2}\d+[a-z]?\]")
# "issue #N" names an upstream issue only right after its project ("owner/name issue #N",
# "all-ways-egpu issues #12, #64"); bare ("(issue #7)", "only: issue #7") it is this project's.
HASH_ISSUE = re.compile(r"\b[Ii]ssues? #\d+")
PROJECT_BEFORE = re.compile(r"[\w.]+[-/][\w./-]*\s$")


def _private(line: str, above: str = "") -> bool:
    """A private citation in `line`; `above` is the line before it (a comment wraps a project's
    name onto the line above its "issue #N")."""
    if PRIVATE.search(line):
        return True
    for m in HASH_ISSUE.finditer(line):
        before = line[: m.start()]
        if not before.strip(" #*/>-"):  # the line starts with it: its project ends the line above
            before = above.rstrip() + " "
        if not PROJECT_BEFORE.search(before):
            return True
    return False


PCI_NAMES = (
    "scripts/gpu_table/",
    "egpu_setup/data/gpus.yaml",
    "egpu_setup/data/compiled/gpus.json",
)
RECORDED = ("tests/fixtures/", "tests/data/")
# Files other branches are rewriting now; their comments are cleaned there, and each leaves this
# list (test_the_owed_files_still_owe says when) once both branches are merged.
OWED: dict[str, str] = {}
SOURCES = REPO / "docs" / "sources.md"


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.split()
    return [p for p in out if (REPO / p).is_file()] or [
        p.relative_to(REPO).as_posix() for p in REPO.rglob("*") if p.is_file()
    ]


def _text(rel: str) -> str | None:
    try:
        return (REPO / rel).read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary


def _hits(rel: str) -> list[str]:
    lines = (_text(rel) or "").splitlines()
    return [
        f"{rel}:{n}: {line.strip()[:120]}"
        for n, line in enumerate(lines, 1)
        if OUTSIDE.search(line)
        or _private(line, lines[n - 2] if n > 1 else "")
        or (not rel.startswith(PCI_NAMES) and NOTE_KEY.search(line))
    ]


def _owed(rel: str) -> bool:
    return any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in OWED)


def test_no_comment_or_data_row_cites_a_note_outside_the_repo() -> None:
    found = [
        hit
        for rel in _tracked()
        if not rel.startswith(RECORDED) and not _owed(rel) and rel != "tests/test_sources.py"
        for hit in _hits(rel)
    ]
    assert found == []


def test_the_owed_files_still_owe() -> None:
    """An entry of OWED whose files are clean by now is stale: remove it."""
    files = _tracked()
    for key in OWED:
        owing = [rel for rel in files if rel == key or (rel.startswith(key) and key.endswith("/"))]
        assert any(_hits(rel) for rel in owing), f"{key} cites nothing outside: drop it from OWED"


def test_every_citation_of_docs_sources_names_an_entry_there() -> None:
    known = SOURCES.read_text(encoding="utf-8").lower()
    cited = re.compile(r'docs/sources\.md, (?:"([^"]+)"|([A-Za-z][A-Za-z ]*[A-Za-z]))')
    missing = []
    for rel in _tracked():
        for m in cited.finditer(_text(rel) or ""):
            name = (m.group(1) or m.group(2)).lower()
            if name not in known:
                missing.append(f"{rel}: {name}")
    assert missing == []


@pytest.mark.parametrize(
    ("line", "outside"),
    [
        ("# see hotplug-security.md §3.7", True),
        ("# (sysfs-bus-thunderbolt [K2])", True),
        ("# Interfaces pinned (brief: 'Resolution')", True),
        ("# Linux Documentation/ABI/testing/sysfs-bus-thunderbolt", False),
        ("# NVIDIA H100 product brief PB-11133-001 (mirror)", False),
        ("# [unverified] [3rd-party] [inferred]", False),
        ("# Exit codes are a contract (DESIGN.md)", True),
        ("# 2.5-5 min on 2 cores (issue 20)", True),
        ('"""Issue 19: the situations a fresh laptop meets', True),
        ("Goals (issue-16):", True),
        ("# Exit codes are a contract (docs/design.md)", False),
        ("# NVIDIA/open-gpu-kernel-modules issue #842 (fallen off the bus)", False),
        ("# pytorch/pytorch issues #150733 and #167244", False),
        ("# the Issue Tracker of the kernel", False),
        ("# never success without the GPU (issue #7)", True),
        ('"""Checks from the samples (warnings only: issue #7)."""', True),
        ("runtime PM), issue #979 (Blackwell hard locks over TB5).", True),
        ("# see issue 27 and reference/matrix-facts.md", True),
        ("# after bolt has authorized it (all-ways-egpu issues #12, #64).", False),
        ("egpu-switcher issue #61, optimus-manager issues #539 and #448", False),
        ("# Management ..., NVIDIA/open-gpu-kernel-modules\n# issue #830, terrapkg", False),
        ("# the lock is refused.\n# issue #7 says why", True),
    ],
)
def test_the_pattern(line: str, outside: bool) -> None:
    above, _, line = line.rpartition("\n")
    found = OUTSIDE.search(line) or _private(line, above) or NOTE_KEY.search(line)
    assert bool(found) is outside


def test_pci_ids_names_are_not_note_keys_in_the_gpu_table() -> None:
    assert _hits("scripts/gpu_table/pci.ids-nvidia.txt") == []
    assert NOTE_KEY.search("2236  GA102GL [A10]")
