"""The host-access rule (docs/design.md): only the gateway touches the machine.

Everything else receives a Host and calls its methods, which is what makes every command
replayable from a recorded bundle. This walks the package's syntax trees and fails on a forbidden
import or call outside the packages (or, where a package would be too wide, the modules) allowed
to make it. Allowances name packages and modules, never a prefix of a file name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "egpu_setup"

# Who may start or signal a process, and why.
PROCESSES = {
    "host/": "the gateway: every process egpu-setup starts goes through host/process.py",
    "verify/_child.py": "runs inside the target venv, where egpu_setup cannot be imported",
}
# Who may reach the network, and why.
NETWORK = {
    "compat/fetch.py": "`matrix update`: the PyTorch wheel index",
    "compat/index_url.py": "asks a torch index for its first page, to refuse a redirect off the "
    "host before pip or uv follows it",
    "execute/apt_key.py": "the pinned third-party apt key, checked before it is written",
    "verify/session.py": "the report's hostname (socket.gethostname)",
    "verify/_child.py": "DDP ranks rendezvous on 127.0.0.1",
}
# Who may read and write any file of the machine, and why.
SYSTEM_FILES = {
    "host/": "the gateway itself: reads for every other module, /proc for process sessions",
    "state/": "manifest, backups, journal, lock and reports: egpu-setup's own state",
    "execute/": "the executor writes the plan's files and links, and undoes them",
    "rollback/": "rollback restores and removes what the executor wrote, and makes again a "
    "directory dpkg's purge deleted that a kept package still lists",
    "doctor/record.py": "writes the bundle directory the user named (reads go through the Host)",
    "cli.py": "writes the crash log",
    "compat/fetch.py": "caches the index page it read (and its validators) in the state directory",
    "verify/": "its state directory, the progress marker and the child's scratch directory",
    "detect/release_files.py": "copies of release files the Host read, in a private temporary "
    "directory, for the distro package (which reads only a directory)",
}
# Who may read or write files the user named on the command line (a profile, a report, an
# output directory) or our own package data, and why: file I/O yes, processes and network no.
USER_FILES = {
    "profile/": "profile files: the shipped ones, the search path, or the path given",
    "bundle/": "the bundle directory (`bundle --out`, `install --bundle`)",
    "fleet/": "the report folders `egpu-setup report` is given",
    "render/tree.py": "`render --out DIR`",
    "compat/shipped.py": "our own package data: the compiled data files, read once a process",
    "compat/overlay.py": "the overlay `matrix update` cached",
    "commands/bundle.py": "checks that --out is a bundle or empty",
    "commands/report.py": "`report --html FILE`",
    "commands/profiles.py": "`profiles check FILE`",
    "install/mok_key.py": "the lab's key directory the admin names (`mok-key new DIR`, `install "
    "--mok-key DIR`): new or empty, and the private key's mode",
}

FORBIDDEN_PROCESS_MODULES = {"subprocess", "multiprocessing", "ctypes"}
FORBIDDEN_NETWORK_MODULES = {"socket", "requests", "urllib.request", "http.client", "ssl"}
FILE_MODULES = {"shutil", "tempfile"}
PROCESS_OS = {
    "system",
    "popen",
    "execv",
    "execvp",
    "execve",
    "spawnv",
    "fork",
    "kill",
    "killpg",
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
    "statvfs",
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
    "iterdir",
    "rmdir",
    "symlink_to",
}


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(PKG).as_posix()


def allowed(rel: str, table: dict[str, str]) -> bool:
    """`rel` is a module named in `table`, or lies in a package (a key ending in "/") there."""
    return any(rel == key or (key.endswith("/") and rel.startswith(key)) for key in table)


def _is_package_data(node: ast.Call) -> bool:
    """`files("egpu_setup.x").joinpath(...).read_text()`: our own package data, not the system."""
    inner = node.func.value if isinstance(node.func, ast.Attribute) else None
    while isinstance(inner, ast.Call | ast.Attribute):
        if isinstance(inner, ast.Call):
            f = inner.func
            if (isinstance(f, ast.Name) and f.id == "files") or (
                isinstance(f, ast.Attribute) and f.attr == "files"
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


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module]
    return []


def violations(path: Path, rel: str | None = None) -> list[str]:
    rel = rel or _rel(path)
    processes, network = allowed(rel, PROCESSES), allowed(rel, NETWORK)
    files = allowed(rel, SYSTEM_FILES) or allowed(rel, USER_FILES)
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)  # an import statement's, where names are imported
        for name in _imported(node):
            if name in FORBIDDEN_PROCESS_MODULES and not processes:
                found.append(f"{rel}:{line} imports {name}")
            if name in FORBIDDEN_NETWORK_MODULES and not network:
                found.append(f"{rel}:{line} imports {name}")
            if name in FILE_MODULES and not files:
                found.append(f"{rel}:{line} imports {name}")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        on_os = (
            isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "os"
        )
        attr = f.attr if isinstance(f, ast.Attribute) else ""
        if on_os and attr in PROCESS_OS and not processes:
            found.append(f"{rel}:{node.lineno} calls os.{attr}")
        if files:
            continue
        if on_os and attr in FILE_OS:
            found.append(f"{rel}:{node.lineno} calls os.{attr}")
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


def test_every_allowance_names_a_package_or_module_that_exists() -> None:
    for table in (PROCESSES, NETWORK, SYSTEM_FILES, USER_FILES):
        for key in table:
            target = PKG / key
            assert target.is_dir() if key.endswith("/") else target.is_file(), key


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import subprocess\nimport requests\nopen('/etc/os-release')\nos.killpg(1, 9)\n"
        "Path('/etc/x').write_text('')\n"
    )
    assert len(violations(bad, "detect/_probe_for_rule_test.py")) == 5
    # an allowance for a package covers its modules, and nothing that merely starts like it
    assert violations(bad, "host/anything.py") == ["host/anything.py:2 imports requests"]
    assert len(violations(bad, "hostile.py")) == 5
