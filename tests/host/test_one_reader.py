"""One reader for untrusted trees: what reads `--root`, `--from`, a bundle, a folder of reports
or a state directory does it through host/machine.py's `open_beneath` (openat(2) with
O_NOFOLLOW on every component, a size limit in `read_beneath`) or the writers' descriptors
(state/atomic.py: `open_file`, `directory`; state/paths.py `read_state`), never by path.
Checked over the syntax trees of every module that reads those trees: a builtin open(),
Path.read_text/read_bytes/iterdir, os.open, os.listdir or os.scandir there fails this test
unless the function is one of the few below, each with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "egpu_setup"
READERS = [
    "host/machine.py",
    "bundle/format.py",
    *sorted(str(p.relative_to(PKG)) for p in (PKG / "detect").glob("*.py")),
    *sorted(str(p.relative_to(PKG)) for p in (PKG / "doctor").glob("*.py")),
    *sorted(
        str(p.relative_to(PKG))
        for package in ("install", "fleet", "execute", "state", "image", "rollback", "verify")
        + ("plan",)
        for p in (PKG / package).glob("*.py")
        # a program of its own, run by the target venv's Python, which has no egpu_setup to
        # import: it reads only the config the parent wrote for it and the running system
        if p.name != "_child.py"
    ),
]
# (module, function): why it may open by path
ALLOWED = {
    ("host/machine.py", "read_regular"): "the running system's own files (root `/`), O_NOFOLLOW",
    ("host/machine.py", "listdir"): "os.listdir of the descriptor Host._open gave",
    ("host/machine.py", "write_attr"): "a sysfs write on the running system, not a read",
    ("doctor/record.py", "record"): "checks that the output folder record makes is empty",
    ("install/mok_key.py", "new_lab_key"): "checks that the new key's folder is empty, reads none",
    ("host/machine.py", "open_beneath"): "the reader itself",
    ("host/machine.py", "walk_dirs"): "the one directory walk, openat(2) by descriptor",
    ("host/machine.py", "listdir_beneath"): "os.listdir of open_beneath's descriptor",
    ("bundle/format.py", "sha256_file"): "open_beneath with a bundle; else builder's private copy",
    ("bundle/format.py", "_nofollow"): "the opener sha256_file uses for the private copy",
    ("detect/release_files.py", "_write"): "a write into detect's own temp directory",
    # the writers themselves: every call is relative to a directory descriptor they walked to
    ("state/atomic.py", "empty_dir"): "os.listdir of the descriptor `directory` gave",
    ("state/atomic.py", "_remove_at"): "os.listdir of the descriptor walk_dirs gave",
    ("state/atomic.py", "open_file"): "os.open relative to the descriptor `directory` gave",
    ("state/atomic.py", "_replace"): "the temp file, O_EXCL relative to its directory's fd",
    ("state/atomic.py", "clean_temp_files"): "os.scandir of the descriptor `directory` gave",
    ("state/atomic.py", "atomic_copy"): "the source, O_NOFOLLOW: a file of root's mkdtemp",
    ("state/output.py", "names"): "os.listdir of the descriptor `directory` gave",
    ("state/output.py", "_open"): "os.open relative to the descriptor `directory` gave",
    ("state/reports.py", "highest_sequence"): "os.listdir of the descriptor open_dir gave",
    ("state/reports.py", "_sequence_at"): "os.open relative to the reports folder's fd",
    ("execute/apt_key.py", "fetch_verified_key"): "the keyring gpg wrote in root's mkdtemp",
}
# Path's own readers take no positional argument (Host.read_bytes(path) is the one reader's)
BY_PATH_METHODS = {"read_text", "read_bytes", "iterdir"}
BY_PATH_OS = {"listdir", "scandir", "open"}  # os.open: a read unless a writer's own


def _by_path_calls(tree: ast.AST) -> list[tuple[str, int, str]]:
    """(enclosing function, line, call) of every by-path read in `tree`."""
    found = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = func
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = child.name if func == "<module>" else func
            if isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Name) and f.id == "open":
                    found.append((name, child.lineno, "open()"))
                elif isinstance(f, ast.Attribute):
                    owner = f.value.id if isinstance(f.value, ast.Name) else None
                    if owner == "os" and f.attr in BY_PATH_OS:
                        found.append((name, child.lineno, f"os.{f.attr}()"))
                    elif owner != "os" and f.attr in BY_PATH_METHODS and not child.args:
                        found.append((name, child.lineno, f".{f.attr}()"))
            visit(child, name)

    visit(tree, "<module>")
    return found


@pytest.mark.parametrize("module", READERS)
def test_no_by_path_read_outside_the_one_reader(module: str) -> None:
    tree = ast.parse((PKG / module).read_text(encoding="utf-8"))
    bad = [
        f"{module}:{line} {call} in {func}()"
        for func, line, call in _by_path_calls(tree)
        if (module, func) not in ALLOWED
    ]
    assert bad == []
