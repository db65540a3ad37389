"""May root run this? Only what root owns and nobody else can change (issue 13, rule 1).

A program, an interpreter and the code it imports are safe for root to run only when the file
and every directory above it, up to `/`, are owned by root and writable by nobody else (group and
other write bits clear; a sticky world-writable directory such as /tmp does not count: anyone may
create the next component there). Links are checked as links (lstat), then where they lead.

This is the minimal local check of issue 13's trust rule that the units and helpers need; the
`security` branch writes the full one (host/trust.py), which the integrator makes the only one.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

_MAX_LINKS = 40


def problem(path: str | os.PathLike[str]) -> str | None:
    """Why root must not run or import `path`, or None when root owns it and all above it."""
    seen = 0
    current = os.path.abspath(path)
    checked: set[str] = set()
    while True:
        for part in _ancestors(current):
            if part in checked:
                continue
            why = _bad(part)
            if why:
                return why
            checked.add(part)
        if not os.path.islink(current):
            return None
        seen += 1
        if seen > _MAX_LINKS:
            return f"{path}: too many symbolic links"
        target = os.readlink(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))


def _ancestors(path: str) -> list[str]:
    out = [path]
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        out.append(path)
    return out


def _bad(path: str) -> str | None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not root"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def running_tool_problem(argv0: str | None = None) -> str | None:
    """Why root must not run the egpu-setup that is running now, or None.

    Checked: the console script (argv0, when it is one), the interpreter, every pyvenv.cfg
    location Python honours (beside the executable and one directory up: the `site` module and
    getpath), and the egpu_setup package with every file in it."""
    import egpu_setup

    paths: list[str] = []
    if argv0 and argv0.startswith("/"):
        paths.append(argv0)
    exe = sys.executable
    paths.append(exe)
    for cfg in (Path(exe).parent / "pyvenv.cfg", Path(exe).parent.parent / "pyvenv.cfg"):
        if cfg.exists() or cfg.is_symlink():
            paths.append(str(cfg))
    package = Path(egpu_setup.__file__).resolve().parent
    paths.append(str(package))
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        paths += [os.path.join(dirpath, name) for name in filenames]
    for p in paths:
        why = problem(p)
        if why:
            return why
    return None
