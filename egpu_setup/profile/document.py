"""One profile file, read and checked on its own: size, UTF-8, strict YAML, the schema, its name."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError
from egpu_setup.profile.problems import Marks, Problem, ProblemError
from egpu_setup.profile.schema import load_schema, schema_problems, type_of
from egpu_setup.profile.strict_yaml import parse_yaml

MAX_PROFILE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Document:
    data: dict[str, Any]
    marks: Marks
    path: Path


def _read_capped(path: Path) -> bytes:
    """At most MAX_PROFILE_BYTES + 1 bytes of a regular file: a 3 GB file is refused after
    256 KiB, and a FIFO or a device (/dev/zero, /dev/tty) is never read at all."""
    file = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise UsageError(
            f"cannot read profile {file}: {exc.strerror or exc}",
            "check the path and its permissions",
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{file} is not a regular file", "pass a profile YAML file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(
            f"cannot read profile {file}: {exc.strerror or exc}",
            "check the path and its permissions",
        ) from None
    finally:
        os.close(fd)


def _not_a_profile(file: str, why: str) -> UsageError:
    """A file that shows no sign of being a profile: named, never quoted (it may be any file
    on this machine, /etc/shadow passed by mistake or on purpose, and errors are often logged)."""
    return UsageError(
        f"{file} is not an egpu-setup profile ({why})",
        "pass a profile name (`egpu-setup profiles list`) or a YAML file that starts with "
        "`name: ...`",
    )


def looks_like_profile(text: str) -> bool:
    """True when some line starts with a top-level key of the profile schema (`name:`, `gpu:`)."""
    keys = "|".join(re.escape(k) for k in load_schema().get("properties", {}))
    return re.search(rf"^(?:{keys})[ \t]*:", text, re.MULTILINE) is not None


def refuse_untrusted(path: Path, origin: str) -> None:
    """As root, a profile that is not shipped inside the tool is read only when it and every
    directory from / down to it are root's and closed to group and other writes (the rule for
    what root trusts, egpu_setup/host/trust.py): the profile decides which enclosure root
    authorizes, and a user who could swap the file could decide it. UsageError naming it."""
    from egpu_setup.host.trust import owned_by_root
    from egpu_setup.profile.search import as_root

    if origin == "package" or not as_root() or owned_by_root([str(path)]):
        return
    where = _first_untrusted(Path(os.path.abspath(path)))
    raise UsageError(
        f"profile {path}: {where} is not root's, or others may write it: root does not read a "
        "profile that another user can change",
        f"copy it into a folder root owns (`sudo install -m 0644 {path} "
        f"/etc/egpu-setup/profiles/`), then pass that path or its name",
    )


def _first_untrusted(path: Path) -> Path:
    """The first of / ... path that another user owns or may write (for the message)."""
    for part in (*reversed(path.parents), path):
        try:
            st = os.lstat(part)
        except OSError:
            return part
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0 or (st.st_mode & 0o022 and not sticky and not stat.S_ISLNK(st.st_mode)):
            return part
    return path


def read_document(path: Path, origin: str) -> Document:
    file = str(path)
    refuse_untrusted(path, origin)
    raw = _read_capped(path)
    if len(raw) > MAX_PROFILE_BYTES:
        raise UsageError(
            f"{file}: profile is larger than {MAX_PROFILE_BYTES // 1024} KiB",
            "a profile is a short YAML file",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UsageError(
            f"{file}:{line}:{column}: not UTF-8 text", "save the profile as UTF-8"
        ) from None
    text = text.removeprefix("\ufeff")
    # Before any message may quote the file: does it look like a profile at all?
    profile_like = looks_like_profile(text)
    try:
        data, marks = parse_yaml(text, file)
    except ProblemError as exc:
        if not profile_like:
            raise _not_a_profile(file, "not valid YAML, and no line starts with `name:`") from None
        raise exc.problem.error() from None
    if data is None:
        raise UsageError(
            f"{file}: the profile is empty", "start from `egpu-setup profiles show generic-nvidia`"
        )
    if not isinstance(data, dict):
        raise Problem(
            marks.value(()),
            (),
            f"expected a mapping of keys, got {type_of(data)}",
            "a profile starts with `name: ...`",
        ).error()
    if not profile_like:
        raise _not_a_profile(file, "none of its keys is one a profile has")
    problems = schema_problems(data, marks)
    if problems:
        raise problems[0].error(len(problems) - 1)
    if origin in ("package", "system", "user", "custom") and data["name"] != path.stem:
        raise Problem(
            marks.value(("name",)),
            ("name",),
            f"{data['name']!r} differs from the file name {path.name!r}",
            f"profiles are found by file name: rename the file to {data['name']}.yaml or set "
            f"name: {path.stem}",
        ).error()
    return Document(data, marks, path)
