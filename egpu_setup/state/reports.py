"""Reports under <state>/reports/: one JSON file per install or verify, for `egpu-setup report`.

Their order is the order the machine saved them, never its clock: each report carries a
`sequence`, one more than the last one this state directory handed out (taken under a lock, so
two saves at once get two numbers), and the `boot_id` of the boot it was made in
(/proc/sys/kernel/random/boot_id, Linux Documentation/admin-guide/sysctl/kernel.rst). A clock
set back (a dead RTC battery, NTP correcting a wrong time, an admin testing) can make the newest
report look like the oldest; the sequence cannot. `report_order` is the one ordering every
reader uses (doctor, install's day-after check, `egpu-setup report`).
"""

from __future__ import annotations

import calendar
import json
import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from egpu_setup.host.machine import Host

REPORTS = "reports"  # what a fleet collects from each machine (fleet/report.py, the Ansible role)
BUILD_REPORTS = "build-reports"  # a lab image's build: kept apart, not any machine's own
# <state>/report-sequence: the last sequence number handed out, and the lock around taking one
SEQUENCE_FILE = "report-sequence"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_SAVED_NAME = re.compile(r"(?P<base>.+?)(?:-(?P<n>\d+))?\.json")
_STAMP = re.compile(r"(\d{8}T\d{6})Z")
# A sequence is a count of saves: far below this. A larger one is not ours (or hostile).
_MAX_SEQUENCE = 2**53

OrderKey = tuple[int, int, float, tuple[str, int], str]


def save_report(
    state_dir: Path,
    kind: str,
    data: dict[str, Any],
    when: float,
    folder: str = REPORTS,
    *,
    anchor: Path = Path("/"),
) -> Path:
    """Write <state>/<folder>/<kind>-<UTC time>.json atomically (never over an older one), with
    the next `sequence` of this state directory and this boot's `boot_id` in it, walking from
    `anchor` (the image root under `--root`) with no link followed."""
    from egpu_setup.state.atomic import atomic_write, make_dirs
    from egpu_setup.state.paths import refuse_link

    refuse_link(state_dir)
    reports = refuse_link(state_dir / folder)  # a planted link must not carry them away
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    make_dirs(reports, anchor=anchor)
    with _SequenceLock(state_dir, anchor) as lock:
        sequence = lock.next(reports)
        path = reports / f"{kind}-{stamp}.json"
        n = 1
        while os.path.lexists(path):
            n += 1
            path = reports / f"{kind}-{stamp}-{n}.json"
        stamped = {**data, "sequence": sequence, "boot_id": current_boot_id()}
        atomic_write(path, (json.dumps(stamped, indent=2) + "\n").encode(), 0o644, anchor=anchor)
        lock.commit(sequence)  # only once the report that carries it is on disk
    return path


def current_boot_id() -> str | None:
    """This boot's id, read through the Host gateway; None where the kernel has none."""
    from egpu_setup.host.machine import LiveHost

    value = LiveHost().read_attr(BOOT_ID)
    return value if value and re.fullmatch(r"[0-9a-f-]{36}", value) else None


class _SequenceLock:
    """<state>/report-sequence, opened without following a link and locked with flock(2) for
    the whole save: the number read, the report written, the number stored."""

    def __init__(self, state_dir: Path, anchor: Path):
        self._state_dir, self._anchor = state_dir, anchor
        self._fd = -1

    def __enter__(self) -> _SequenceLock:
        import fcntl

        from egpu_setup.state.atomic import open_file
        from egpu_setup.state.paths import refuse_link

        path = self._state_dir / SEQUENCE_FILE
        refuse_link(path)  # said plainly; the descriptor walk (O_NOFOLLOW) for a race
        flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK
        self._fd = open_file(path, flags, 0o644, anchor=self._anchor, create_dirs=False)
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.close(self._fd)
            raise OSError(f"{self._state_dir / SEQUENCE_FILE} is not a regular file")
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # closing drops the flock

    def next(self, reports: Path) -> int:
        """One more than the last number handed out. A counter file that is empty or damaged
        (a power cut while it was written) is rebuilt from the reports themselves."""
        raw = os.pread(self._fd, 64, 0).decode("ascii", "replace").strip()
        last = (
            int(raw) if raw.isdigit() and len(raw) < 17 else highest_sequence(reports, self._anchor)
        )
        return last + 1

    def commit(self, sequence: int) -> None:
        text = f"{sequence}\n".encode()
        os.pwrite(self._fd, text, 0)
        os.ftruncate(self._fd, len(text))
        os.fsync(self._fd)


def highest_sequence(reports: Path, anchor: Path = Path("/")) -> int:
    """The largest `sequence` among the reports in a folder (0 when none carries one), the
    folder walked from `anchor` and each report opened relative to its descriptor."""
    from egpu_setup.errors import EgpuSetupError
    from egpu_setup.state.atomic import open_dir

    try:
        dfd = open_dir(reports, anchor=anchor)
    except (OSError, EgpuSetupError):
        return 0
    try:
        return max([_sequence_at(dfd, name) for name in os.listdir(dfd)], default=0)
    finally:
        os.close(dfd)


def _sequence_at(dfd: int, name: str) -> int:
    """The `sequence` of the report `name` in the directory open at `dfd`; 0 without one."""
    if not name.endswith(".json"):
        return 0
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        with os.fdopen(os.dup(fd), "rb") as f:
            data = json.loads(f.read(8 * 1024 * 1024))
    except (OSError, ValueError, RecursionError):
        return 0
    finally:
        os.close(fd)
    return sequence_of(data) or 0


def sequence_of(data: Any) -> int | None:
    """A report's `sequence` when it carries a usable one."""
    seq = data.get("sequence") if isinstance(data, Mapping) else None
    if isinstance(seq, int) and not isinstance(seq, bool) and 0 < seq < _MAX_SEQUENCE:
        return seq
    return None


def report_order(data: Any, name: str, when: float | None = None) -> OrderKey:
    """The sort key of one machine's report, oldest first: by its `sequence`, then its file
    name as save_report wrote it. A report from before sequences existed sorts before every
    one that has one, among its kind by its own time (`when`, else its "time" key, else the
    stamp in its name)."""
    seq = sequence_of(data)
    if seq is not None:
        return 1, seq, 0.0, saved_order(name), name
    if when is None:
        when = report_time(data, name)
    return 0, 0, when, saved_order(name), name


def report_time(data: Any, name: str) -> float:
    """A report's own time (its `time` key, else the stamp in its name), in epoch seconds."""
    value = data.get("time") if isinstance(data, Mapping) else None
    for text, fmt in ((value, "%Y-%m-%dT%H:%M:%SZ"), (_name_stamp(name), "%Y%m%dT%H%M%S")):
        if isinstance(text, str):
            try:
                return float(calendar.timegm(time.strptime(text, fmt)))
            except ValueError:
                continue
    return float("-inf")


def _name_stamp(name: str) -> str | None:
    m = _STAMP.search(name)
    return m.group(1) if m else None


def saved_order(name: str) -> tuple[str, int]:
    """Sort key of a report's file name in the order save_report wrote them: within one second,
    `<kind>-<stamp>.json`, then `-2.json`, `-3.json` (as strings "-2" sorts before ".json")."""
    m = _SAVED_NAME.fullmatch(name)
    if m is None:
        return name, 0
    return m["base"], int(m["n"] or 1)


def saved_reports(
    host: Host, dirs: list[str], kind: str = "verify"
) -> list[tuple[dict[str, Any], str]]:
    """Every `egpu-setup <kind>` report in `dirs` (<state>/reports/<kind>-*.json), read through
    the host, oldest first by report_order; files that are not such reports are skipped."""
    schema = f"egpu-setup/{kind}/1"
    found: list[tuple[OrderKey, dict[str, Any], str]] = []
    for path in sorted({p for d in dirs for p in host.glob(d, f"{kind}-*.json")}):
        try:
            data = json.loads(host.read(path, limit=4 * 1024 * 1024) or "")
        except (ValueError, RecursionError):
            continue
        if isinstance(data, dict) and data.get("schema") == schema:
            found.append((report_order(data, path.rsplit("/", 1)[1]), data, path))
    found.sort(key=lambda item: item[0])
    return [(data, path) for _, data, path in found]
