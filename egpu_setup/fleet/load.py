"""Reading what a lab collected: report files and the identity.json beside them, per folder.

Every `egpu-setup install` and `verify` saves a JSON report under <state>/reports/ (docs/design.md,
"Files on a provisioned machine"). The Ansible role fetches them to the controller as
`<dest>/<inventory_hostname>/`, with an identity.json it writes itself (ansible/roles/egpu_setup/
tasks/fetch.yml). This module finds those files, says which folder each belongs to, and parses
them. It reads user-given files only (the host-access rule allows it).

Reports come from machines we do not control, so nothing in them is trusted: a file that is not
JSON, is nested too deeply for the parser, is too large or is a link is a problem of its folder,
never a crash; values are type-checked where they are used (fleet/rows.py).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError
from egpu_setup.host.machine import open_beneath
from egpu_setup.state.reports import OrderKey, report_order, sequence_of

SCHEMA_VERIFY = "egpu-setup/verify/1"
SCHEMA_INSTALL = "egpu-setup/install/1"
# The dry run and `resolve --json` print a resolution; a lab may save those too. They carry no
# outcome, so they are recognised (not "unknown file") but only say what was planned.
SCHEMA_RESOLUTION = "egpu-setup/resolution/1"
SCHEMA_IDENTITY = "egpu-setup/identity/1"
IDENTITY_FILE = "identity.json"
# A machine's state beside its reports, fetched with them (ansible/roles/egpu_setup/tasks/
# fetch.yml): `kernels check` (<state>/kernels.json) and the health sampler (<state>/health.json).
SCHEMA_KERNELS = "egpu-setup/kernels/1"
SCHEMA_HEALTH = "egpu-setup/health/1"
# A lab image's first boot (<state>/firstboot.json, install/firstboot.py): whether the laptop
# waits for a person (a MOK enrolment at the console, an enclosure nobody enrolled).
SCHEMA_FIRSTBOOT = "egpu-setup/firstboot/1"

# A report is a few kilobytes; anything far larger is not one of ours (or is hostile).
MAX_REPORT_BYTES = 8 * 1024 * 1024

# Names our tools give their files: a file named so that cannot be read is a problem of its
# machine (a truncated verify report may hide a failure); any other unreadable JSON is skipped.
_OUR_NAME = re.compile(
    r"^(?:verify|install)-.*\.json$|^(?:identity|kernels|health|firstboot)\.json$"
)

# verify-20261129T164900Z.json / install-2026-11-29T16:49:00.json: the timestamp in the name is
# the fallback when a report carries no "time" key.
_NAME_TIME = re.compile(r"(\d{4}-?\d{2}-?\d{2})[T_-]?(\d{2}:?\d{2}:?\d{2})?")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class LoadedReport:
    """One JSON report file, parsed and classified, with what it claims about its machine."""

    path: Path
    kind: str  # "verify" / "install" / "resolution" / "kernels" / "health" / "firstboot"
    time: datetime | None
    data: Mapping[str, Any]
    hostname: str | None  # the hostname the report claims
    machine_id: str | None  # the sha256 of /etc/machine-id it claims (egpu_setup/host/identity)

    @property
    def age(self) -> OrderKey:
        """Its place among its machine's reports, oldest first (state/reports.py report_order):
        the sequence the machine saved it under, never its clock; a report from before
        sequences by its own time (none: before all), then the order of its file name."""
        when = self.time.timestamp() if self.time else float("-inf")
        return report_order(self.data, self.path.name, when)

    @property
    def sequence(self) -> int | None:
        return sequence_of(self.data)


@dataclass(frozen=True)
class Identity:
    """identity.json as the Ansible role writes it; None fields were null or unusable."""

    path: Path
    inventory_hostname: str | None
    machine_id: str | None
    root: str | None  # the image root the role provisioned (egpu_setup_root), None: the host


@dataclass(frozen=True)
class FileProblem:
    """A file that could not be used, and why."""

    path: Path
    reason: str
    ours: bool  # named like our files: an error of its machine; otherwise merely skipped


@dataclass(frozen=True)
class Folder:
    """The files of one collection folder: the machine's, in the role's fetch layout."""

    path: Path
    base: Path  # the argument it was found under
    identity: Identity | None
    reports: tuple[LoadedReport, ...]
    problems: tuple[FileProblem, ...]

    @property
    def per_machine(self) -> bool:
        """True when the folder is one machine's: it has an identity.json, or it is a folder
        below the argument (<dest>/<host>/). The argument itself (a machine's own reports
        directory, a flat pile of files) is grouped by what its reports claim."""
        return self.identity is not None or self.path != self.base


# -- finding ---------------------------------------------------------------------------------------


def find_folders(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, Path, list[Path]]]:
    """(folder, base, json files) for every folder holding JSON files under the arguments.

    A file belongs to the nearest folder above it (up to the argument) that holds an
    identity.json; else to the folder right below the argument (<dest>/<host>/, whatever lies
    below it), or, when that folder holds no file itself and its files lie in several folders
    (the argument is the parent of the role's dest: <parent>/<dest>/<host>/), the first folder
    down the path that does; else to the argument itself. A file argument belongs to its own
    folder. The same file named twice is read once."""
    groups: dict[Path, tuple[Path, list[Path]]] = {}
    seen: set[Path] = set()
    for raw in paths:
        arg = Path(raw)
        if arg.is_file():
            files, base = [arg], arg.parent
        elif arg.is_dir():
            files, base = _walk(arg), arg
        else:
            raise UsageError(
                f"report path not found: {arg}",
                "pass directories holding verify-*.json / install-*.json reports",
            )
        spread = _spread_folders(files, base)
        for f in files:
            key = _abs(f)
            if key in seen:
                continue
            seen.add(key)
            folder = _folder_of(f, base, spread)
            groups.setdefault(folder, (base, []))[1].append(f)
    return [(folder, base, files) for folder, (base, files) in groups.items()]


def _walk(top: Path) -> list[Path]:
    # os.walk without followlinks: a link loop in a fetched tree cannot hang us
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        found.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".json"))
    return found


def _abs(path: Path) -> Path:
    return Path(os.path.abspath(path))


def _spread_folders(files: Sequence[Path], base: Path) -> set[Path]:
    """The folders below `base` that hold no file themselves and whose files lie in more than
    one of their subfolders: several machines' folders, never one machine's."""
    direct: set[Path] = set()
    children: dict[Path, set[str]] = {}
    for f in files:
        try:
            rel = f.parent.relative_to(base)
        except ValueError:
            continue
        direct.add(f.parent)
        for i in range(1, len(rel.parts)):
            children.setdefault(base.joinpath(*rel.parts[:i]), set()).add(rel.parts[i])
    return {d for d, kids in children.items() if d not in direct and len(kids) > 1}


def _folder_of(path: Path, base: Path, spread: set[Path]) -> Path:
    parent = path.parent
    try:
        rel = parent.relative_to(base)
    except ValueError:  # a file argument: its own folder
        return parent
    chain = [base.joinpath(*rel.parts[:i]) for i in range(len(rel.parts), -1, -1)]
    for folder in chain:
        if (folder / IDENTITY_FILE).is_file():
            return folder
    for i in range(1, len(rel.parts) + 1):
        folder = base.joinpath(*rel.parts[:i])
        if folder not in spread:
            return folder
    return base


# -- loading ---------------------------------------------------------------------------------------


def load_folder(folder: Path, base: Path, files: Sequence[Path]) -> Folder:
    """Parse a folder's files: its identity.json, its reports, and what could not be used."""
    identity: Identity | None = None
    reports: list[LoadedReport] = []
    problems: list[FileProblem] = []
    ident_path = folder / IDENTITY_FILE
    if ident_path.is_file() or ident_path.is_symlink():
        try:
            identity = load_identity(ident_path, base)
        except ValueError as exc:
            problems.append(FileProblem(ident_path, str(exc), ours=True))
    for path in sorted(files):
        if path.name == IDENTITY_FILE:
            if path.parent != folder:  # an identity.json the walk found in a deeper folder
                problems.append(FileProblem(path, "identity.json below its machine's", True))
            continue
        try:
            reports.append(load_report(path, base))
        except ValueError as exc:
            problems.append(FileProblem(path, str(exc), ours=bool(_OUR_NAME.match(path.name))))
    return Folder(folder, base, identity, tuple(reports), tuple(problems))


def read_json(path: Path, base: Path | None = None) -> Any:
    """A JSON file we did not write: bounded, never a crash, and never followed through a link,
    neither its own name nor a folder between `base` (the argument it was found under; else
    its own folder) and it: opened by `open_beneath`, so a folder a user swaps for a link
    (-> /etc) after the walk found the file is refused too. Raises ValueError with a reason."""
    if path.is_symlink():
        raise ValueError("a symbolic link, not followed")
    base = path.parent if base is None else base
    try:
        fd = open_beneath(base, path.relative_to(base))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError("reached through a symbolic link, not followed") from exc
        raise ValueError(f"cannot read: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_REPORT_BYTES:
            raise ValueError(f"too large for a report ({st.st_size} bytes)")
        raw = f.read(MAX_REPORT_BYTES + 1)
    if len(raw) > MAX_REPORT_BYTES:  # grew since its size was taken
        raise ValueError(f"too large for a report (over {MAX_REPORT_BYTES} bytes)")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError as exc:  # json's decoder recurses once per nesting level
        raise ValueError("not a report: JSON nested too deeply") from exc
    except (OSError, ValueError) as exc:  # ValueError: bad UTF-8, bad JSON, a 5000-digit int
        raise ValueError(f"not JSON: {exc}") from exc


def load_report(path: Path, base: Path | None = None) -> LoadedReport:
    """Parse one report file (read_json, below `base`); raises ValueError (with a reason) for
    anything that is not ours."""
    data = read_json(path, base)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    schema = data.get("schema")
    kinds = {
        SCHEMA_VERIFY: "verify",
        SCHEMA_INSTALL: "install",
        SCHEMA_RESOLUTION: "resolution",
        SCHEMA_KERNELS: "kernels",
        SCHEMA_HEALTH: "health",
        SCHEMA_FIRSTBOOT: "firstboot",
    }
    if not isinstance(schema, str) or schema not in kinds:
        shown = schema if isinstance(schema, (str, int, float, type(None))) else type(schema)
        raise ValueError(f"not an egpu-setup install/verify report (schema {shown!r})")
    kind = kinds[schema]
    # `install --yes --json` prints the resolution plus the run's "result": an install outcome.
    if kind == "resolution" and isinstance(data.get("result"), dict):
        kind = "install"
    return LoadedReport(
        path=path,
        kind=kind,
        time=_report_time(data, path),
        data=data,
        hostname=_claimed_hostname(data),
        machine_id=_sha256(data.get("machine_id_sha256"))
        or _sha256(dig(data, "host", "machine_id_sha256")),
    )


def load_identity(path: Path, base: Path | None = None) -> Identity:
    """identity.json (schema egpu-setup/identity/1), read below `base`; ValueError when it is
    not one."""
    data = read_json(path, base)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_IDENTITY:
        raise ValueError(f"not an identity file (schema {SCHEMA_IDENTITY} expected)")
    raw_id = data.get("machine_id_sha256")
    machine_id = _sha256(raw_id)
    if raw_id is not None and machine_id is None:
        raise ValueError("machine_id_sha256 is not a sha256 hex digest")
    return Identity(
        path=path,
        inventory_hostname=_text(data.get("inventory_hostname")),
        machine_id=machine_id,
        root=_text(data.get("root")),
    )


def _claimed_hostname(data: Mapping[str, Any]) -> str | None:
    for candidate in (dig(data, "host", "hostname"), data.get("hostname")):
        text = _text(candidate)
        if text:
            return text
    return None


def _sha256(value: Any) -> str | None:
    if isinstance(value, str) and _SHA256.fullmatch(value.strip().lower()):
        return value.strip().lower()
    return None


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def dig(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]... through nested JSON objects; None where a level is missing or not one."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _report_time(data: Mapping[str, Any], path: Path) -> datetime | None:
    for key in ("time", "finished", "finished_at", "started", "started_at"):
        value = data.get(key)
        if isinstance(value, str):
            parsed = parse_time(value)
            if parsed is not None:
                return parsed
    m = _NAME_TIME.search(path.name)
    if m:
        day = m.group(1).replace("-", "")
        clock = (m.group(2) or "000000").replace(":", "")
        try:
            return datetime.strptime(day + clock, "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc)
        except ValueError:
            return None
    return None


def parse_time(value: str) -> datetime | None:
    """An ISO 8601 time ("2026-11-27T10:15:02Z", "20261127T101502Z"); naive ones are UTC."""
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        m = re.fullmatch(r"(\d{8})T(\d{6})(?:Z|\+00:?00)?", value.strip())
        if not m:
            return None
        try:
            parsed = datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H%M%S")
        except ValueError:
            return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
