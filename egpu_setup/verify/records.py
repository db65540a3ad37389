"""The child's records, read as untrusted input: every line is checked before anything uses it.

The child runs in a venv its owner can change (a `sitecustomize.py`, a `.pth` file, a patched
torch), so what it writes on stdout is input, not our own data. `read_record` turns one line into
a clean record or says why it is not one: ids are short slugs, texts are capped, numbers are
finite (NaN and infinities become None: JSON has no such values, docs/design.md "verify
--json"), nesting and list lengths are bounded, and fields the protocol does not name are
dropped. A line that is not JSON at all (a library printing before the child took fd 1) is no
record and is ignored; a line that looks like a record but is not a valid one is `Malformed`,
which the caller turns into a failed `child-protocol` check.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from egpu_setup.verify.checks import STATUSES

ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")
MAX_TEXT = 4096  # characters of one detail, hint or string value
MAX_ITEMS = 256  # entries of one list or object inside a value
MAX_DEPTH = 6  # nesting of a value
MAX_LINE = 256 * 1024  # bytes of one record line; a longer one is not parsed

# The fields each kind of record may carry (egpu_setup/verify/_child.py writes them).
CHECK_FIELDS = ("id", "status", "detail", "value", "expected", "seconds", "hint")
DEVICE_FIELDS = (
    "type", "torch", "torch_cuda", "python", "executable", "index", "name", "pci_bus_id",
    "compute_capability", "memory_gib", "total_memory", "mem_get_info", "multiprocessors",
    "cudnn", "device_count", "driver_cuda", "arch_list", "threads", "cpu_capability",
    "native_bf16",
)  # fmt: skip


@dataclass(frozen=True)
class Malformed:
    """A line that claims to be a record and is not a valid one."""

    reason: str
    excerpt: str


def capped(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_value(value: Any, depth: int = 0) -> Any:
    """A JSON value with finite numbers, capped strings, bounded lists and objects."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return capped(value)
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, list):
        return [clean_value(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        items = list(value.items())[:MAX_ITEMS]
        return {capped(str(k), 64): clean_value(v, depth + 1) for k, v in items}
    return None


def read_record(line: str) -> dict[str, Any] | Malformed | None:
    """One stdout line of the child: a clean record, Malformed, or None (no record at all)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    excerpt = capped(text, 200)
    if len(text) > MAX_LINE:
        return Malformed(f"a record of {len(text)} characters (at most {MAX_LINE})", excerpt)
    try:
        # Python's json reads NaN and Infinity, which are not JSON; here they are a value
        # that is not known, as the child writes None for it
        rec = json.loads(text, parse_constant=lambda name: None)
    except (ValueError, RecursionError) as exc:
        return Malformed(f"not JSON ({exc})", excerpt)
    if not isinstance(rec, dict):
        return Malformed("not a JSON object", excerpt)
    kind = rec.get("kind")
    if kind == "check":
        return _check(rec, excerpt)
    if kind == "step":
        step, pid, seq = rec.get("step"), rec.get("pid"), rec.get("seq")
        if not isinstance(step, str) or not ID.match(step):
            return Malformed("a step record without a valid step name", excerpt)
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (pid, seq))
        return {"kind": "step", "step": step, "pid": pid, "seq": seq} if ints else {
            "kind": "step", "step": step, "pid": None, "seq": None,
        }  # fmt: skip
    if kind == "device":
        out = {k: clean_value(rec[k]) for k in DEVICE_FIELDS if k in rec}
        if out.get("type") not in ("cpu", "cuda"):
            return Malformed("a device record whose type is not cpu or cuda", excerpt)
        return {"kind": "device", **out}
    if kind == "end":
        return {"kind": "end"}
    return Malformed(f"unknown record kind {capped(str(kind), 64)!r}", excerpt)


def _check(rec: dict[str, Any], excerpt: str) -> dict[str, Any] | Malformed:
    cid, status = rec.get("id"), rec.get("status")
    if not isinstance(cid, str) or not ID.match(cid):
        return Malformed(
            "a check without a valid id (a-z, 0-9, '.', '_', '-'; 64 at most)", excerpt
        )
    if status not in STATUSES:
        return Malformed(f"check {cid}: status is not one of {', '.join(STATUSES)}", excerpt)
    detail, hint, seconds = rec.get("detail"), rec.get("hint"), rec.get("seconds")
    if detail is not None and not isinstance(detail, str):
        return Malformed(f"check {cid}: its detail is not text", excerpt)
    if hint is not None and not isinstance(hint, str):
        return Malformed(f"check {cid}: its hint is not text", excerpt)
    secs = clean_value(seconds) if isinstance(seconds, (int, float)) else None
    secs = float(secs) if isinstance(secs, (int, float)) and not isinstance(secs, bool) else None
    return {
        "kind": "check",
        "id": cid,
        "status": status,
        "detail": capped(detail or ""),
        "value": clean_value(rec.get("value")),
        "expected": clean_value(rec.get("expected")),
        "seconds": secs,
        "hint": capped(hint) if hint else None,
    }
