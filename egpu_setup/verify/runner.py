"""Run `_child.py` in the target Python: streamed records, a hard timeout, as the right user.

The child starts through host/tracked_session.py (a session of its own, every descendant
ended at the deadline or after it exits). Its stdout carries its records, one JSON line each,
passed on as they arrive; root runs a Python another user can change only as that user
(host/trust.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.host.tracked_session import spawn
from egpu_setup.log import get_logger
from egpu_setup.verify.records import Malformed, read_record

log = get_logger("egpu_setup.verify")

CHILD = Path(__file__).with_name("_child.py")


@dataclass(frozen=True)
class ChildOutcome:
    """How the child ended, and every record it sent before that."""

    outcome: str  # finished / timeout / crashed / failed
    returncode: int | None
    signal_name: str | None
    records: tuple[dict[str, Any], ...]
    output_tail: str
    seconds: float
    pid: int
    stuck: bool = False  # still alive after SIGKILL
    stuck_pids: tuple[int, ...] = field(default=())

    @property
    def finished(self) -> bool:
        return self.outcome == "finished"


def child_argv(python: str, isolated: bool) -> list[str]:
    """`-I`: no PYTHONPATH, no user site, no script dir on sys.path, so nothing from our own
    environment leaks into the target venv. For a user-chosen --python, `-E` only: its user-site
    torch (`pip install --user`) is a legitimate install."""
    return [python, "-I" if isolated else "-E", str(CHILD)]


def venv_owner(python: str, isolated: bool = True) -> tuple[int, int] | None:
    """(uid, gid) to run the child as, when we are root and what that Python runs at startup is
    not all root's (host/trust.py: the executable and its links, both pyvenv.cfg places, the
    stdlib, site-packages); None: run as we are. UsageError when nobody can run it safely."""
    from egpu_setup.host.trust import run_as

    home = None if isolated else os.environ.get("HOME")  # -E keeps the user site of $HOME
    return run_as(python, user_site_home=home)


# What the child inherits from our environment: the knobs that choose and tune what torch runs on
# (CUDA_VISIBLE_DEVICES, NCCL_DEBUG, PYTORCH_CUDA_ALLOC_CONF, OMP_NUM_THREADS; CUDA environment
# variables: https://docs.nvidia.com/cuda/cuda-c-programming-guide/#cuda-environment-variables),
# the locale and HOME (a `--python` run keeps its user site under it). Nothing else: not PATH
# (the child is given nvidia-smi's absolute path in its config), not PYTHON*, LD_*, our own
# EGPU_SETUP_* or anything a caller could use to change what the child runs.
# ROCm's own: HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES pick the GPU, HSA_OVERRIDE_GFX_VERSION
# and the other HSA_ settings change how the runtime sees it
# (https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html)
_KEPT_PREFIXES = (
    "CUDA_", "NCCL_", "PYTORCH_", "TORCH_", "OMP_", "MKL_", "LC_", "HIP_", "ROCR_", "HSA_",
)  # fmt: skip
_KEPT_NAMES = ("HOME", "LANG", "LANGUAGE", "TZ")
CHILD_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # for the tools torch itself may start

# The most stdout the child may write (records, and whatever ran in its venv before it took
# fd 1). A full run writes about 40 records of under 1 KiB each; more than this is a child gone
# wrong, and it is stopped rather than kept in memory.
MAX_OUTPUT_BYTES = 4 * 2**20
MAX_RECORDS = 2000


class OutputFlood(Exception):
    """The child wrote more than MAX_OUTPUT_BYTES or MAX_RECORDS: it is stopped."""


def child_env(environ: Mapping[str, str], work_dir: Path) -> dict[str, str]:
    """The child's whole environment: a fixed PATH, TMPDIR its own scratch directory, and the
    caller's variables that say which GPU and how torch runs, nothing else."""
    env = {
        k: v
        for k, v in environ.items()
        if (k in _KEPT_NAMES or k.startswith(_KEPT_PREFIXES)) and not k.startswith("EGPU_SETUP")
    }
    env.update(PATH=CHILD_PATH, TMPDIR=str(work_dir))
    return env


@dataclass
class _Reader:
    """Reads the child's stdout lines into clean records, within the output cap."""

    on_record: Callable[[dict[str, Any]], None] | None
    records: list[dict[str, Any]] = field(default_factory=list)
    bytes_seen: int = 0
    malformed: int = 0
    flooded: bool = False

    def line(self, text: str) -> None:
        self.bytes_seen += len(text) + 1
        if self.bytes_seen > MAX_OUTPUT_BYTES or len(self.records) >= MAX_RECORDS:
            self.flooded = True
            raise OutputFlood
        rec = read_record(text)
        if rec is None:
            return
        if isinstance(rec, Malformed):
            self.malformed += 1
            if self.malformed > 1:
                return  # one check says it; the count comes at the end
            rec = protocol_check(rec.reason, rec.excerpt)
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)


def protocol_check(reason: str, excerpt: str) -> dict[str, Any]:
    """The failed check a malformed record becomes."""
    return {
        "kind": "check",
        "id": "child-protocol",
        "status": "fail",
        "detail": f"a malformed record from the verify child: {reason}",
        "value": {"excerpt": excerpt},
        "expected": None,
        "seconds": None,
        "hint": "something in the target venv writes to the child's output or replaces its "
        "code (a sitecustomize.py or .pth file, a patched torch): reinstall the venv",
    }


def run_child(
    python: str,
    isolated: bool,
    config: dict[str, Any],
    work_dir: Path,
    timeout: float,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> ChildOutcome:
    """Start the child with `config`, pass each record (checked: verify/records.py) to
    `on_record` as it arrives, wait at most `timeout` seconds, return its outcome."""
    config_path = work_dir / "config.json"
    try:
        config_path.write_text(json.dumps(config, indent=2))
    except OSError as exc:  # a full or read-only temp filesystem
        raise EgpuSetupError(
            f"no usable temp directory: cannot write {config_path}: {exc.strerror or exc}",
            f"free space in {work_dir.parent} or point TMPDIR at a writable directory with room "
            "(a few MiB), e.g. TMPDIR=/var/tmp",
        ) from exc
    owner = venv_owner(python, isolated)
    if owner is not None:
        # Root never runs a Python another user can change: the child runs as that user, and
        # gets its scratch directory only. Root's progress log stays root's: the child reads it.
        for path in (work_dir, config_path):
            os.chown(path, *owner)
    argv = [*child_argv(python, isolated), str(config_path)]
    log.debug("verify child: %s", argv)
    reader = _Reader(on_record)
    try:
        res = spawn(
            argv, child_env(os.environ, work_dir), timeout, reader.line, cwd=work_dir, owner=owner
        )
    except OSError as exc:
        raise UsageError(
            f"cannot run the target Python {python}: {exc.strerror or exc}",
            "pass a working interpreter with --python PATH or a venv with --venv PATH",
        ) from exc
    except OutputFlood:  # spawn has ended the child's session before it let this through
        return ChildOutcome(
            outcome="failed",
            returncode=None,
            signal_name=None,
            records=(*reader.records, flood_check(reader.bytes_seen)),
            output_tail="",
            seconds=0.0,
            pid=0,
        )
    records = reader.records
    if reader.malformed > 1:
        records.append(
            protocol_check(f"{reader.malformed} malformed records in all", "(see the first)")
        )
    rc = res.rc
    if res.timed_out:
        outcome = "timeout"
    elif rc == 0:
        outcome = "finished"
    else:
        outcome = "crashed" if rc is not None and rc < 0 else "failed"
    if outcome == "finished" and not any(r.get("kind") == "end" for r in records):
        outcome = "failed"  # exited 0 without finishing: something called sys.exit early
    sig = None
    if rc is not None and rc < 0:
        with contextlib.suppress(ValueError):
            sig = signal.Signals(-rc).name
    return ChildOutcome(
        outcome=outcome,
        returncode=rc,
        signal_name=sig,
        records=tuple(records),
        output_tail=res.err,
        seconds=res.seconds,
        pid=res.pid,
        stuck=bool(res.stuck),
        stuck_pids=res.stuck,
    )


def flood_check(nbytes: int) -> dict[str, Any]:
    return {
        "kind": "check",
        "id": "child-protocol",
        "status": "fail",
        "detail": f"the verify child wrote more than {MAX_OUTPUT_BYTES // 2**20} MiB or "
        f"{MAX_RECORDS} records to its output ({nbytes} bytes read): stopped",
        "value": {"bytes": nbytes},
        "expected": {"max_bytes": MAX_OUTPUT_BYTES, "max_records": MAX_RECORDS},
        "seconds": None,
        "hint": "something in the target venv floods the child's output (a sitecustomize.py "
        "or .pth file, a patched torch): reinstall the venv",
    }
