"""The OS facts of python-distro's 65 recorded release trees (tests/data/real/distros/), against
the values distro's own test file writes for them (expected.json, transcribed by transcribe.py:
README.md there says which test each tree's values come from), and the reads staying inside.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import distro
import pytest

from conftest import REPO
from egpu_setup.detect.facts import OsFacts
from egpu_setup.detect.release_files import copy_release_files, distro_release
from egpu_setup.detect.system import probe_os
from egpu_setup.host.machine import Host, RecordedHost, RootHost
from helpers.sentinel import Sentinel

CORPUS = REPO / "tests" / "data" / "real" / "distros"
EXPECTED: dict[str, dict[str, str]] = json.loads((CORPUS / "expected.json").read_text())


def _as_distro_says(facts: OsFacts) -> dict[str, str]:
    """OsFacts in distro's terms: its id() maps two os-release IDs to older names
    (distro.NORMALIZED_OS_ID: ol -> oracle, opensuse-leap -> opensuse); OsFacts keeps the
    os-release ID the profiles match on."""
    values = {
        "id": distro.NORMALIZED_OS_ID.get(facts.id or "", facts.id or ""),
        "version": facts.version_id or "",
        "codename": facts.codename or "",
        "pretty_name": facts.pretty_name or "",
        "like": " ".join(facts.id_like),
    }
    return {k: v for k, v in values.items() if v}


def _distro_on(tree: Path) -> dict[str, str]:
    """distro itself on the tree, for the one tree no test of distro's gives values for."""
    info = distro.LinuxDistribution(root_dir=str(tree), include_lsb=False, include_uname=False)
    values = {
        "id": info.id(),
        "version": info.version(),
        "codename": info.codename(),
        "pretty_name": info.name(pretty=True),
        "like": info.like(),
    }
    return {k: v for k, v in values.items() if v}


def test_the_corpus_is_all_65_trees_and_each_has_values() -> None:
    trees = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and p.name != "__shared__")
    assert len(trees) == 65
    assert sorted(EXPECTED) == trees


@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_os_facts_of_a_recorded_release_tree(tree: str) -> None:
    want = {k: v for k, v in EXPECTED[tree].items() if k != "from"}
    if EXPECTED[tree]["from"].startswith("none"):
        want = _distro_on(CORPUS / tree)
        assert want["id"], "distro names this tree from its files"
    assert _as_distro_says(probe_os(RootHost(CORPUS / tree))) == want


@pytest.mark.parametrize(
    ("tree", "version", "codename"),
    [
        pytest.param("debiantesting", "bookworm/sid", "bookworm", id="debian-testing"),
        pytest.param("gentoo", "2.2", None, id="gentoo"),
        pytest.param("centos5", "5.11", "Final", id="centos5-no-os-release"),
        pytest.param("rhel6", "6.5", "Santiago", id="rhel6-no-os-release"),
    ],
)
def test_what_os_release_does_not_say(tree: str, version: str, codename: str | None) -> None:
    """Was: the fallback ran only without an os-release ID, so Debian testing and Gentoo had no
    version at all."""
    facts = probe_os(RootHost(CORPUS / tree))
    assert (facts.version_id, facts.codename) == (version, codename)


def test_a_recorded_bundle_gets_the_same_facts(tmp_path: Path) -> None:
    """A `--from` bundle (DIR/root) holds the tree: the same facts as the tree itself."""
    shutil.copytree(CORPUS / "gentoo", tmp_path / "root", symlinks=True)
    recorded = probe_os(RecordedHost(tmp_path))
    want = {k: v for k, v in EXPECTED["gentoo"].items() if k != "from"}
    assert _as_distro_says(recorded) == want
    assert recorded.version_id == "2.2"


def test_links_in_the_tree_resolve_inside_it(tmp_path: Path) -> None:
    """etc/os-release -> ../usr/lib/os-release (fedora30) and etc/redhat-release ->
    fedora-release are read inside the tree; an absolute link is followed inside it too, as
    after a chroot, never onto this machine's /etc."""
    root = tmp_path / "tree"
    shutil.copytree(CORPUS / "centos7", root, symlinks=True)
    for name in ("os-release", "centos-release"):
        (root / "etc" / name).unlink()
    (root / "etc/centos-release").symlink_to("/etc/redhat-release-real")
    (root / "etc/redhat-release-real").write_text("CentOS Linux release 7.9.2009 (Core)\n")
    (root / "etc/redhat-release").unlink()
    facts = probe_os(RootHost(root))
    assert (facts.id, facts.version_id, facts.codename) == ("centos", "7.9.2009", "Core")


def test_a_link_out_of_the_tree_reads_nothing_of_this_machine(
    tmp_path: Path, sentinel: Sentinel
) -> None:
    """Was (a reported bug): distro pointed at an image opened IMAGE/etc/os-release with the
    kernel's link resolution and reported the build machine's Debian. Here every release file
    is a link to the sentinel's files: nothing of them may reach the facts."""
    root = tmp_path / "tree"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").symlink_to(sentinel.base / "etc/os-release")
    (root / "etc/centos-release").symlink_to(sentinel.shadow)
    (root / "etc/debian_version").symlink_to("../../outside/etc/shadow")
    (root / "etc/gentoo-release").symlink_to(os.path.relpath(sentinel.shadow, root / "etc"))
    facts = probe_os(RootHost(root))
    assert (facts.id, facts.version_id, facts.pretty_name) == (None, None, None)
    assert not sentinel.leaked(repr(facts))
    assert sentinel.unchanged()


def test_release_files_that_are_not_regular_files_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "etc/fedora-release").mkdir(parents=True)
    os.mkfifo(root / "etc/centos-release")  # a read would block
    (root / "etc/rocky-release").write_text("Rocky Linux release 9.4 (Blue Onyx)\n")
    facts = probe_os(RootHost(root))
    assert (facts.id, facts.version_id, facts.codename) == ("rocky", "9.4", "Blue Onyx")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'ID=debian\nPRETTY_NAME="Debian \\"unterminated\n', id="open-quote"),
        pytest.param(b"ID=debian\nPRETTY_NAME=\xff\xfe\n", id="not-utf8"),
        pytest.param(b"ID=debian\nVERSION=`reboot` $(id)\n", id="shell-syntax"),
    ],
)
def test_an_os_release_distro_could_not_parse_is_handed_over_clean(
    tmp_path: Path, body: bytes
) -> None:
    """distro's shlex raises on an unterminated quote; it gets our parse, re-quoted."""
    root = tmp_path / "tree"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_bytes(body)
    (root / "etc/debian_version").write_bytes(b"12.\xe97\n")  # distro opens it as ASCII
    facts = probe_os(RootHost(root))
    assert facts.id == "debian"
    assert facts.version_id == "12.?7"


def test_the_copies_are_private_and_gone_afterwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    seen: list[tuple[str, int]] = []
    real_copy = copy_release_files

    # records where the copies went, then copies
    def spy(host: Host, rel: dict[str, str], dest: str) -> list[str]:
        seen.append((dest, os.stat(dest).st_mode & 0o777))
        return real_copy(host, rel, dest)

    monkeypatch.setattr("egpu_setup.detect.release_files.copy_release_files", spy)
    assert distro_release(RootHost(CORPUS / "gentoo"), {"ID": "gentoo"})["VERSION_ID"] == "2.2"
    [(dest, mode)] = seen
    assert Path(dest).parent == tmp_path and mode == 0o700
    assert not Path(dest).exists()


def test_a_planted_etc_of_many_release_files_is_read_in_part(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "etc").mkdir(parents=True)
    for i in range(500):
        (root / f"etc/a{i:03d}-release").write_text(f"Distro{i} release {i}.0\n")
    (tmp_path / "out").mkdir()
    copied = copy_release_files(RootHost(root), {}, str(tmp_path / "out"))
    assert len(copied) == 64


def test_os_release_keys_are_kept_over_what_distro_says(tmp_path: Path) -> None:
    """os-release is the contract: its ID stays as written (distro's id() says "oracle" for
    ID=ol), and its version wins over a release file's longer one."""
    facts = probe_os(RootHost(CORPUS / "oracle7"))
    assert (facts.id, facts.version_id) == ("ol", "7.5")
    facts = probe_os(RootHost(CORPUS / "centos7"))
    assert facts.version_id == "7"  # os-release VERSION_ID, not centos-release's 7.1.1503


def test_lsb_release_fills_what_distro_cannot(tmp_path: Path) -> None:
    """distro reads LSB data only by running lsb_release; the file is parsed here."""
    root = tmp_path / "tree"
    (root / "etc").mkdir(parents=True)
    (root / "etc/lsb-release").write_text(
        "DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE=15.10\nDISTRIB_CODENAME=wily\n"
        'DISTRIB_DESCRIPTION="Ubuntu 15.10"\n'
    )
    facts = probe_os(RootHost(root))
    assert (facts.id, facts.version_id, facts.codename) == ("ubuntu", "15.10", "wily")
