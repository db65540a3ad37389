"""One directory walk: every descriptor-by-descriptor walk below an anchor (the one reader's
open_beneath, the writers' atomic.open_dir, the tree removal) is host/machine.py's
`walk_dirs`. Checked over the syntax trees: a flag O_DIRECTORY anywhere else in the package is
a second walk, which would have to get O_NOFOLLOW, the error it reports and the directories it
makes right a second time. And the walk itself, on a real tree: a link on the way is refused
wherever it is, and the error names where."""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest

from egpu_setup.host.machine import open_beneath, walk_dirs
from egpu_setup.state.atomic import LinkInPath, open_dir

PKG = Path(__file__).resolve().parents[2] / "egpu_setup"
# (module, the function or module-level name that may spell O_DIRECTORY)
HOME = {("host/machine.py", "walk_dirs"), ("host/machine.py", "_BENEATH_DIR")}


def _o_directory_uses(tree: ast.Module) -> list[tuple[str, int]]:
    found = []
    for top in tree.body:
        if isinstance(top, ast.FunctionDef | ast.ClassDef):
            name = top.name
        elif isinstance(top, ast.Assign) and isinstance(top.targets[0], ast.Name):
            name = top.targets[0].id
        else:
            name = "<module>"
        for node in ast.walk(top):
            if isinstance(node, ast.Attribute) and node.attr == "O_DIRECTORY":
                found.append((name, node.lineno))
    return found


def test_o_directory_is_spelled_only_by_the_one_walk() -> None:
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        module = str(path.relative_to(PKG))
        for name, line in _o_directory_uses(ast.parse(path.read_text(encoding="utf-8"))):
            if (module, name) not in HOME:
                bad.append(f"{module}:{line} in {name}")
    assert bad == []


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("outside\n")
    return tmp_path


@pytest.mark.parametrize("link", ["a", "a/b"])
def test_a_link_anywhere_on_the_way_stops_both_users_of_the_walk(tree: Path, link: str) -> None:
    moved = tree / f"{link}.real"
    (tree / link).rename(moved)
    (tree / link).symlink_to(tree / "outside")
    with pytest.raises(OSError) as raised:
        walk_dirs(tree, ["a", "b"])
    assert raised.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert raised.value.filename == str(tree / link)
    with pytest.raises(OSError):
        open_beneath(tree, "a/b/f")
    with pytest.raises(LinkInPath) as refused:
        open_dir(tree / "a" / "b", anchor=tree, create=True)
    assert str(tree / link) in refused.value.message
    assert not (tree / "outside" / "b").exists()  # nothing was made where the link points


def test_the_walk_makes_what_is_missing_only_when_asked(tree: Path) -> None:
    with pytest.raises(FileNotFoundError):
        walk_dirs(tree, ["a", "new", "deeper"])
    fd = walk_dirs(tree, ["a", "new", "deeper"], create_mode=0o700)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tree / "a" / "new" / "deeper"))
    finally:
        os.close(fd)
    assert (tree / "a" / "new").stat().st_mode & 0o777 == 0o700 & ~_umask()


def test_a_descriptor_anchor_is_walked_from_and_left_open(tree: Path) -> None:
    top = os.open(tree, os.O_RDONLY)
    try:
        fd = walk_dirs(top, ["a", "b"])
        os.close(fd)
        os.fstat(top)  # still open: the caller's
    finally:
        os.close(top)


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
