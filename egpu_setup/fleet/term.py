"""A machine's term beside its reports: the health sampler's days and the last kernels check.

health.json (execute/health.py) keeps one summary per day; the term is the days from `since` on
(all it kept when no date is given): the peak temperature against the profile's limit, the
time throttled, the Xid events by code. kernels.json (execute/kernels.py) says which installed
kernels lack their NVIDIA module. Both come from machines we do not control: every value is
type-checked, anything else is unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from egpu_setup.fleet.expected import number

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_XID_CODE = re.compile(r"\d{1,4}")


@dataclass(frozen=True)
class HealthTerm:
    """What the sampler saw over the term."""

    days: int
    samples: int
    peak_c: float | None
    limit_c: float | None
    throttle_s: float
    xids: tuple[tuple[int, int], ...]  # (code, count), most frequent first

    @property
    def too_hot(self) -> bool:
        return self.peak_c is not None and self.limit_c is not None and self.peak_c >= self.limit_c

    def to_json(self) -> dict[str, Any]:
        return {
            "days": self.days,
            "samples": self.samples,
            "peak_c": self.peak_c,
            "limit_c": self.limit_c,
            "throttle_s": round(self.throttle_s),
            "xids": {str(code): n for code, n in self.xids},
        }


@dataclass(frozen=True)
class KernelsState:
    """The last `kernels check`: every kernel with its module, or the ones without."""

    ok: bool
    missing: tuple[str, ...]  # releases whose state is not "ok"
    running_missing: bool

    def text(self) -> str:
        if self.ok:
            return "ok"
        return f"{len(self.missing)} missing" + (" (running)" if self.running_missing else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "missing": list(self.missing),
            "running_missing": self.running_missing,
        }


def health_term(data: Mapping[str, Any], since: date | None) -> HealthTerm | None:
    """The term's summary of one health.json; None when it holds no day of the term."""
    days = data.get("days")
    if not isinstance(days, dict):
        return None
    chosen = [
        v
        for k, v in sorted(days.items())
        if isinstance(k, str)
        and _DAY.fullmatch(k)
        and isinstance(v, dict)
        and (since is None or k >= since.isoformat())
    ]
    if not chosen:
        return None
    peaks = [p for d in chosen if (p := number(d.get("peak_c"))) is not None]
    xids: dict[int, int] = {}
    for d in chosen:
        counts = d.get("xids")
        for code, n in counts.items() if isinstance(counts, dict) else ():
            count = number(n)
            if isinstance(code, str) and _XID_CODE.fullmatch(code) and count and count > 0:
                xids[int(code)] = xids.get(int(code), 0) + int(count)
    limit = number(data.get("limit_c"))
    return HealthTerm(
        days=len(chosen),
        samples=sum(int(number(d.get("samples")) or 0) for d in chosen),
        peak_c=max(peaks) if peaks else None,
        limit_c=limit if limit is not None and 0 < limit < 200 else None,
        throttle_s=sum(max(number(d.get("throttle_s")) or 0.0, 0.0) for d in chosen),
        xids=tuple(sorted(xids.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def kernels_state(data: Mapping[str, Any]) -> KernelsState | None:
    """kernels.json as a state; None when it lists no kernel."""
    raw = data.get("kernels")
    kernels = [k for k in raw if isinstance(k, dict)] if isinstance(raw, list) else []
    if not kernels:
        return None
    bad = [k for k in kernels if k.get("state") != "ok"]
    return KernelsState(
        ok=not bad,
        missing=tuple(str(k.get("release"))[:80] for k in bad),
        running_missing=any(k.get("running") is True for k in bad),
    )
