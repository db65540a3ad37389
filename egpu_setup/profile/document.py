"""One profile file, read and checked on its own: size, UTF-8, strict YAML, the schema, its name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError
from egpu_setup.profile.problems import Marks, Problem, ProblemError
from egpu_setup.profile.schema import schema_problems, type_of
from egpu_setup.profile.strict_yaml import parse_yaml

MAX_PROFILE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Document:
    data: dict[str, Any]
    marks: Marks
    path: Path


def read_document(path: Path, origin: str) -> Document:
    file = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"cannot read profile {file}: {exc.strerror or exc}",
            "check the path and its permissions",
        ) from None
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
    try:
        data, marks = parse_yaml(text, file)
    except ProblemError as exc:
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
