"""Run as root only what root owns: the one rule, for every program root is about to start.

Before root runs an interpreter or a program (verify's child, `doctor --venv`, `record --venv`,
pip in an existing venv, the verify after an install), `run_as` looks, with lstat and without
following anything it has not checked, at everything that decides which code that process runs:

- the executable and every directory above it, then each symbolic link of its chain and the
  directories its target lies in (a link is followed only after the link itself was checked);
- for a Python, every pyvenv.cfg CPython honours: beside the executable and one directory up
  (the executable not dereferenced; PEP 405, https://peps.python.org/pep-0405/, and
  https://docs.python.org/3/library/sys_path_init.html), and the `home` it names;
- the standard library directory of the interpreter the chain ends at;
- every file and directory of the site-packages trees it will import from: the venv's (or the
  prefix's), each directory a `.pth` file there adds to sys.path (site(7)), the base prefix's
  when `include-system-site-packages = true`, and the user site of $HOME when it is enabled.

Each must be owned by root and writable by no group and no other user; a directory with the
sticky bit set (/tmp) is fine as an ancestor, since there nobody may rename or remove an entry
they do not own (unlink(2), rename(2): EPERM on a sticky directory). Otherwise:

- everything that is not root's belongs to one user: the program runs as that user, with that
  user's primary group and no supplementary groups (what the user could run anyway);
- something is writable by a group or by everyone, or two users own parts of it: no user to run
  it as is safe, so it is refused (`error:`/`hint:`), and nothing runs.

A process that is not root runs everything as itself: there is nothing to drop.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from egpu_setup.errors import UsageError

_MAX_LINKS = 40  # the kernel's own limit on symlinks followed in one lookup (path_resolution(7))


@dataclass
class _Scan:
    """What has been seen: who (besides root) can change it, and whether anyone else can."""

    owners: dict[int, str] = field(default_factory=dict)  # uid -> the first path it owns
    open_to: tuple[str, int] | None = None  # (path, mode) writable by a group or everyone
    no_home: tuple[str, str] | None = None  # (pyvenv.cfg, its home) when that home is missing
    seen: set[tuple[int, int]] = field(default_factory=set)  # (st_dev, st_ino) already walked

    @property
    def refused(self) -> bool:
        return self.open_to is not None or self.no_home is not None or len(self.owners) > 1

    def note(self, path: str, st: os.stat_result) -> None:
        if st.st_uid != 0:
            self.owners.setdefault(st.st_uid, path)
        if stat.S_ISLNK(st.st_mode):
            return  # a link's own mode bits mean nothing (symlink(7)); its directory decides
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not sticky_dir and self.open_to is None:
            self.open_to = (path, st.st_mode & 0o7777)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _chain(path: str, scan: _Scan, hops: int = 0) -> str | None:
    """Check `path` component by component from /, following links only after checking them;
    return the path it resolves to (None when a component is missing or loops)."""
    parts = [p for p in os.path.abspath(path).split("/") if p]
    current = "/"
    st = _lstat("/")
    if st is None:
        return None
    scan.note("/", st)
    while parts:
        name = parts.pop(0)
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        st = _lstat(candidate)
        if st is None:
            return None
        scan.note(candidate, st)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        current = candidate
    return current


def _tree(directory: str, scan: _Scan) -> None:
    """Every entry below `directory` (already checked itself), without following links into
    places that were not checked: a link's target goes through `_chain` first."""
    stack = [directory]
    while stack and not scan.refused:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            scan.note(entry.path, st)
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) not in scan.seen:
                    scan.seen.add((st.st_dev, st.st_ino))
                    stack.append(entry.path)
            elif stat.S_ISLNK(st.st_mode):
                resolved = _chain(entry.path, scan)
                if resolved and os.path.isdir(resolved):
                    _walk(resolved, scan)


def _walk(directory: str, scan: _Scan) -> None:
    """`directory`, its ancestors, and everything below it."""
    resolved = _chain(directory, scan)
    if resolved is None or not os.path.isdir(resolved):
        return
    st = os.lstat(resolved)
    if (st.st_dev, st.st_ino) in scan.seen:
        return
    scan.seen.add((st.st_dev, st.st_ino))
    _tree(resolved, scan)


def _read_small(path: str, limit: int = 64 * 1024) -> str:
    """A small text file that was checked already, read without following a final link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, limit).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _pyvenv(executable: str) -> tuple[str | None, dict[str, str]]:
    """(the directory holding the pyvenv.cfg CPython would use, its keys) or (None, {})."""
    exe_dir = os.path.dirname(os.path.abspath(executable))
    for prefix in (exe_dir, os.path.dirname(exe_dir)):
        cfg = os.path.join(prefix, "pyvenv.cfg")
        if os.path.lexists(cfg):
            keys = {}
            for line in _read_small(cfg).splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    keys[key.strip().lower()] = value.strip()
            return prefix, keys
    return None, {}


def _site_dirs(prefix: str) -> list[str]:
    """The site-packages directories a Python with this prefix imports from (site(7); Debian's
    site.py adds local/lib/pythonX.Y/dist-packages, lib/python3/dist-packages and
    lib/pythonX.Y/dist-packages for every prefix, so /usr/local's for /usr)."""
    out: list[str] = []
    base = Path(prefix)
    patterns = ("python3*/site-packages", "python3*/dist-packages", "python3/dist-packages")
    for lib in ("lib", "lib64", "local/lib"):
        for pattern in patterns:
            out += [str(p) for p in sorted(base.glob(f"{lib}/{pattern}"))]
    return out


def _pth_dirs(site: str) -> list[str]:
    """Directories the .pth files of `site` add to sys.path (lines that are not comments or
    `import` statements and name an existing directory, relative to `site`)."""
    out = []
    try:
        names = sorted(n for n in os.listdir(site) if n.endswith(".pth"))
    except OSError:
        return []
    for name in names:
        for line in _read_small(os.path.join(site, name)).splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = os.path.join(site, line)
            if os.path.isdir(path):
                out.append(path)
    return out


def _scan_python(python: str, scan: _Scan, home_site: str | None) -> None:
    real = _chain(python, scan)
    if real is None or scan.refused:
        return
    venv, keys = _pyvenv(python)
    prefixes: list[str] = []
    if venv is not None:
        _chain(os.path.join(venv, "pyvenv.cfg"), scan)
        # site.py makes the parent of the executable's directory sys.prefix, whichever of the
        # two places the pyvenv.cfg was found in (Lib/site.py, venv())
        prefixes += sorted({venv, os.path.dirname(os.path.dirname(os.path.abspath(python)))})
        home = keys.get("home")
        if home and _chain(home, scan) is None and scan.no_home is None:
            # CPython then looks for a standard library in the directories above the
            # executable (https://docs.python.org/3/library/sys_path_init.html): places
            # nothing here has checked, one of them perhaps a world-writable sticky /tmp
            scan.no_home = (os.path.join(venv, "pyvenv.cfg"), home)
        elif home and keys.get("include-system-site-packages", "").lower() == "true":
            prefixes.append(os.path.dirname(os.path.abspath(home)))
    else:
        prefixes.append(os.path.dirname(os.path.dirname(real)))
    # the standard library of the interpreter the chain ends at (its directory and lib-dynload)
    base = os.path.dirname(os.path.dirname(real))
    for lib in sorted(Path(base).glob("lib*/python3.*")):
        _chain(str(lib), scan)
        _chain(str(lib / "lib-dynload"), scan)
    sites = [s for prefix in prefixes for s in _site_dirs(prefix)]
    if home_site:
        sites += [str(p) for p in sorted(Path(home_site).glob(".local/lib/python3*/site-packages"))]
    for site in sites:
        if scan.refused:
            return
        _walk(site, scan)
        for extra in _pth_dirs(site):
            _walk(extra, scan)


def _refuse_open(what: str, scan: _Scan, act: str, then: str) -> None:
    """UsageError when the scan met something a group or everyone may write: root does not
    `act` (run code, enter an image) that other users can change."""
    if scan.open_to is not None:
        path, mode = scan.open_to
        raise UsageError(
            f"{what}: {path} is writable by others (mode {mode:04o}): root does not {act} "
            "that other users can change",
            f"make it root's and `chmod go-w {path}`, {then}",
        )


def _decide(what: str, scan: _Scan) -> tuple[int, int] | None:
    if scan.no_home is not None:
        cfg, home = scan.no_home
        raise UsageError(
            f"{what}: {cfg} names home = {home}, which does not exist: Python would look for "
            "its standard library in the folders above it, which root does not run code from",
            "recreate the venv with the Python it should use (python3 -m venv --clear DIR)",
        )
    _refuse_open(what, scan, "run code", "or run egpu-setup without sudo as the user it belongs to")
    if not scan.owners:
        return None
    if len(scan.owners) > 1:
        (a, pa), (b, pb) = list(scan.owners.items())[:2]
        raise UsageError(
            f"{what}: {pa} belongs to uid {a} and {pb} to uid {b}: there is no single user to "
            "run it as, and root does not run code that other users can change",
            "use a venv that one user (or root) owns entirely",
        )
    ((uid, path),) = scan.owners.items()
    try:
        gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        gid = os.lstat(path).st_gid
    return uid, gid


def run_as(
    program: str, *, python: bool = True, user_site_home: str | None = None
) -> tuple[int, int] | None:
    """(uid, gid) to run `program` as, or None to run it as we are (root owns all it reads, or
    we are not root). UsageError when it cannot be run safely as anybody (module docstring).

    python: also check what a Python reads at startup (pyvenv.cfg, stdlib, site-packages).
    user_site_home: the $HOME whose ~/.local user site the interpreter would import (not -I/-s)."""
    if os.geteuid() != 0:
        return None
    scan = _Scan()
    if python:
        _scan_python(program, scan, user_site_home)
    else:
        _chain(program, scan)
    return _decide(program, scan)


def owned_by_root(paths: Iterable[str]) -> bool:
    """True when every path (and what it resolves through) is root's and closed to others."""
    scan = _Scan()
    for path in paths:
        _chain(path, scan)
    return not scan.owners and scan.open_to is None


def root_may_run(script: str) -> bool:
    """Whether a unit or helper root starts may exec `script` (an egpu-setup console script):
    it, every directory above it, and the interpreter its `#!` line names (with that
    interpreter's pyvenv.cfg and site-packages) are all root's and closed to others."""
    if not owned_by_root([script]):
        return False
    try:
        with open(script, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return True  # not a script: the chain checked above is all it runs
    words = first[2:].decode("utf-8", errors="replace").split()
    if not words or not words[0].startswith("/"):
        return False
    scan = _Scan()
    _scan_python(words[0], scan, None)
    return not scan.owners and scan.open_to is None


def running_tool_problem(argv0: str | None = None) -> str | None:
    """Why root must not let its units run the egpu-setup that is running now, or None.

    Checked like any program root starts: the console script (argv0, when it is a path) with the
    interpreter its `#!` names, this interpreter with its pyvenv.cfg and site-packages, and the
    egpu_setup package with every file in it."""
    import sys

    import egpu_setup

    if argv0 and argv0.startswith("/") and not root_may_run(argv0):
        return f"{argv0} (or the Python it starts) can be changed by a user other than root"
    scan = _Scan()
    _scan_python(sys.executable, scan, None)
    _walk(str(Path(egpu_setup.__file__).resolve().parent), scan)
    if scan.open_to is not None:
        path, mode = scan.open_to
        return f"{path} is writable by group or others (mode {mode:04o})"
    if scan.owners:
        uid, path = next(iter(scan.owners.items()))
        return f"{path} is owned by uid {uid}, not root"
    return None


def output_owner(path: str) -> tuple[int, int] | None:
    """Whom root writes an output folder (`render --out`, `report --html`, `record DIR`) for:
    None when it and every directory above it are root's and closed to others (root writes as
    itself), else the one user who owns part of the way (the files are made theirs, as if that
    user had written them, on the descriptor: state/atomic.py). UsageError naming the path when a
    directory on the way is writable by a group or by everyone (sticky ones like /tmp aside) or
    two users own parts of it: nobody could be sure what the folder holds, so nothing is written.

    The path is looked at with lstat up to its deepest part that exists, the last component
    included (a link there is the caller's to refuse: the writer never follows one)."""
    if os.geteuid() != 0:
        return None
    scan = _Scan()
    probe = os.path.abspath(path)
    while not os.path.lexists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    _chain(os.path.dirname(probe) if os.path.islink(probe) else probe, scan)
    st = _lstat(probe)
    if st is not None and stat.S_ISLNK(st.st_mode):
        scan.note(probe, st)
    _refuse_open(
        path, scan, "write into a folder", "or write to a folder only you (or root) can change"
    )
    return _decide(path, scan)


# What root runs from inside an image it enters (dpkg, its maintainer scripts, DKMS, the tool's
# Python): the image root and these, and every directory on the way from /.
IMAGE_SYSTEM_DIRS = ("etc", "usr", "usr/bin", "usr/sbin", "usr/lib", "usr/local", "var", "var/lib")


def check_image(root: Path) -> None:
    """UsageError (exit 2) unless root owns the image at `root`, the way to it and the folders
    it runs programs from, none writable by a group or by others: root enters an image with
    its own powers, so an image a user can change is code that user gets root to run."""
    if os.geteuid() != 0:
        return
    scan = _Scan()
    for rel in ("", *IMAGE_SYSTEM_DIRS):
        path = os.path.join(root, rel) if rel else str(root)
        if rel == "" or os.path.lexists(path):
            _chain(path, scan)
        if scan.owners or scan.open_to is not None:
            break
    _refuse_open(f"--root {root}", scan, "enter an image", "then run again")
    if scan.owners:
        uid, path = next(iter(scan.owners.items()))
        raise UsageError(
            f"--root {root}: {path} belongs to uid {uid}, not root: root does not enter an "
            "image that another user can change",
            f"build the image as root, or `chown -R root:root {root}` once you trust it",
        )
