"""The host-access rule (DESIGN.md): only the gateway modules touch the machine.

Everything else receives a Host and calls its methods, which is what makes every command
replayable from a recorded bundle. This walks the package's syntax trees and fails on a
forbidden import or call outside the modules allowed to make it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "egpu_setup"

# Modules that may touch the system, and why.
ALLOWED = {
    "host/machine.py": "the gateway itself",
    "execute/executor.py": "the executor writes files and runs the plan",
    "state/manifest.py": "manifest, journal and lock of the executor",
    "compat/fetch.py": "the only network client (matrix update)",
    "doctor/record.py": "writes the bundle directory the user named (reads go through the Host)",
    "cli.py": "writes the crash log",
}
ALLOWED_PREFIXES = ("execute/", "verify/", "state/")
# Modules that read or write only files the user named on the command line (a profile, a
# report, an output directory) or our own package data: file I/O yes, processes and network no.
USER_FILES = {
    "profile/document.py",
    "profile/search.py",
    "compat/overlay.py",
    "bundle/format.py",
    "bundle/wheels.py",
    "fleet/report.py",
    "bundle/builder.py",
    "render/files.py",
    "commands/render.py",
    "commands/report.py",
    "commands/bundle.py",
    "commands/profiles.py",
    "compat/matrix.py",
}
FORBIDDEN_MODULES = {
    "subprocess",
    "socket",
    "requests",
    "urllib.request",
    "http.client",
    "ctypes",
    "shutil",
}
PROCESS_OS = {
    "system",
    "popen",
    "execv",
    "execvp",
    "execve",
    "spawnv",
    "fork",
    "kill",
    "posix_spawn",
}
FILE_OS = {
    "listdir",
    "scandir",
    "walk",
    "readlink",
    "remove",
    "unlink",
    "rename",
    "replace",
    "makedirs",
    "mkdir",
    "rmdir",
    "chmod",
    "chown",
    "symlink",
    "open",
}
FILE_METHODS = {
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "open",
    "mkdir",
    "unlink",
    "touch",
}


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(PKG).as_posix()


def _allowed(rel: str) -> bool:
    return (
        rel in ALLOWED
        or rel.startswith(ALLOWED_PREFIXES)
        or any(rel.split("/")[-1].startswith(pre) for pre in ALLOWED_PREFIXES)
    )


def _is_package_data(node: ast.Call) -> bool:
    """`files("egpu_setup.x").joinpath(...).read_text()`: our own package data, not the system."""
    inner = node.func.value if isinstance(node.func, ast.Attribute) else None
    while isinstance(inner, ast.Call | ast.Attribute):
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Name)
            and inner.func.id == "files"
        ):
            return True
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr == "files"
        ):
            return True
        inner = inner.func if isinstance(inner, ast.Call) else inner.value
    return False


def _on_host(f: ast.Attribute) -> bool:
    """`host.read_bytes(...)` / `self.host.read(...)`: a call through the gateway."""
    v = f.value
    return (isinstance(v, ast.Name) and v.id == "host") or (
        isinstance(v, ast.Attribute) and v.attr == "host"
    )


def violations(path: Path) -> list[str]:
    rel = _rel(path)
    if _allowed(rel):
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"{rel}:{node.lineno} imports {a.name}"
                for a in node.names
                if a.name in FORBIDDEN_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_MODULES:
            found.append(f"{rel}:{node.lineno} imports from {node.module}")
        elif isinstance(node, ast.Call):
            f = node.func
            on_os = (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and f.value.id == "os"
            )
            if on_os and f.attr in PROCESS_OS:
                found.append(f"{rel}:{node.lineno} calls os.{f.attr}")
            if rel in USER_FILES:
                continue
            if on_os and f.attr in FILE_OS:
                found.append(f"{rel}:{node.lineno} calls os.{f.attr}")
            if isinstance(f, ast.Name) and f.id == "open":
                found.append(f"{rel}:{node.lineno} calls open()")
            if (
                isinstance(f, ast.Attribute)
                and f.attr in FILE_METHODS
                and not _on_host(f)
                and not _is_package_data(node)
            ):
                found.append(f"{rel}:{node.lineno} calls .{f.attr}()")
    return found


@pytest.mark.parametrize("module", _modules(), ids=_rel)
def test_only_the_gateway_touches_the_machine(module: Path) -> None:
    assert violations(module) == []


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = PKG / "detect" / "_probe_for_rule_test.py"
    bad.write_text("import subprocess\nopen('/etc/os-release')\n")
    try:
        assert len(violations(bad)) == 2
    finally:
        bad.unlink()
