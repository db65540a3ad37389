"""`egpu-setup health sample`: one reading of the eGPU folded into <state>/health.json.

The file is small and bounded whatever the uptime: one summary per day (peak temperature, peak
power, seconds throttled, Xid counts by code, the narrowest PCIe link seen) for MAX_DAYS days,
the newest MAX_RECENT readings and MAX_XID_LINES Xid lines; older entries rotate out. At most
MAX_HEALTH_BYTES: a file that would be larger sheds its oldest readings first. It is rewritten
whole through state/atomic.py (temp file, fsync, rename), so a reader or a power cut sees the
old file or the new one. `egpu-setup report` reads the daily summaries for the term.

Throttle time is the time between two samples whose later one saw a throttling reason active,
capped at two timer intervals: a gap (suspend, the eGPU unplugged) is not counted as throttled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from egpu_setup.detect.health import GpuReading, HealthProbe, XidEvent

SCHEMA_HEALTH = "egpu-setup/health/1"
HEALTH_FILE = "health.json"
MAX_DAYS = 400  # a year of terms, one summary a day
MAX_RECENT = 360  # six hours of readings at the timer's 60 s
MAX_XID_LINES = 100
MAX_HEALTH_BYTES = 256 * 1024


def fold_sample(
    previous: Mapping[str, Any] | None,
    probe: HealthProbe,
    *,
    now: float,
    boot_id: str | None,
    limit_c: float | None,
    interval_s: float,
    machine_id: str | None,
) -> dict[str, Any] | None:
    """The new content of health.json after one sample, or None when there is nothing to keep
    (the eGPU is absent and the kernel logged no new Xid)."""
    old = dict(previous) if previous else {}
    same_boot = boot_id is not None and old.get("boot_id") == boot_id
    cursor = _number(old.get("xid_cursor")) if same_boot else None
    seen = _int(old.get("xid_seen")) if same_boot else 0
    new_xids = _new_xids(probe.xids, cursor, seen)
    if probe.absent and not new_xids:
        return None
    day_key = time.strftime("%Y-%m-%d", time.gmtime(now))
    days = {k: dict(v) for k, v in _dict(old.get("days")).items() if isinstance(v, dict)}
    day = days.setdefault(day_key, {})
    last = _number(old.get("last_sample"))
    elapsed = interval_s if last is None else min(max(now - last, 0.0), 2 * interval_s)
    if probe.readings:
        _add_readings(day, probe.readings, elapsed)
    if probe.error:
        day["errors"] = _int(day.get("errors")) + 1
    xid_counts = {str(k): _int(v) for k, v in _dict(day.get("xids")).items()}
    for event in new_xids:
        xid_counts[str(event.code)] = xid_counts.get(str(event.code), 0) + 1
    if xid_counts:
        day["xids"] = xid_counts
    recent = [r for r in _list(old.get("recent")) if isinstance(r, dict)]
    recent += [_reading_json(now, r) for r in probe.readings]
    lines = [x for x in _list(old.get("xid_lines")) if isinstance(x, dict)]
    lines += [{"t": round(now), "code": e.code, "line": e.line[:300]} for e in new_xids]
    stamps = [e.uptime_s for e in probe.xids if e.uptime_s is not None]
    recent = recent[-MAX_RECENT:]
    doc: dict[str, Any] = {
        "schema": SCHEMA_HEALTH,
        "machine_id_sha256": machine_id,
        "limit_c": limit_c,
        "interval_s": interval_s,
        "boot_id": boot_id,
        "xid_cursor": max(stamps) if stamps else cursor,
        "xid_seen": len(probe.xids),
        "last_sample": round(now, 3) if probe.readings else last,
        "days": dict(sorted(days.items())[-MAX_DAYS:]),
        "recent": recent,
        "xid_lines": lines[-MAX_XID_LINES:],
    }
    while len(encode(doc)) > MAX_HEALTH_BYTES and recent:
        recent = recent[len(recent) // 4 + 1 :]  # the oldest quarter goes first
        doc["recent"] = recent
    return doc


def encode(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _new_xids(events: tuple[XidEvent, ...], cursor: float | None, seen: int) -> list[XidEvent]:
    """The Xid lines after the last sample's: by dmesg's time when it prints one, else by
    count (the log of one boot only grows, until its ring buffer wraps: then none is new)."""
    if events and all(e.uptime_s is not None for e in events):
        return [e for e in events if cursor is None or (e.uptime_s or 0.0) > cursor]
    return list(events[seen:])


def _add_readings(day: dict[str, Any], readings: tuple[GpuReading, ...], elapsed: float) -> None:
    day["samples"] = _int(day.get("samples")) + 1
    temps = [r.temperature_c for r in readings if r.temperature_c is not None]
    if temps:
        day["peak_c"] = max([*temps, _number(day.get("peak_c")) or temps[0]])
    power = [r.power_w for r in readings if r.power_w is not None]
    if power:
        day["peak_w"] = max([*power, _number(day.get("peak_w")) or power[0]])
    if any(r.throttle for r in readings):
        day["throttle_s"] = round((_number(day.get("throttle_s")) or 0.0) + elapsed, 1)
        reasons = {str(k): _int(v) for k, v in _dict(day.get("reasons")).items()}
        for reason in {x for r in readings for x in r.throttle}:
            reasons[reason] = reasons.get(reason, 0) + 1
        day["reasons"] = reasons
    links = [(r.link_gen, r.link_width) for r in readings if r.link_gen and r.link_width]
    if links:
        narrow = min(links, key=lambda lk: (lk[0] or 0) * (lk[1] or 0))
        known = day.get("link_min")
        if not isinstance(known, list) or len(known) != 2 or _product(known) > _product(narrow):
            day["link_min"] = list(narrow)


def _reading_json(now: float, r: GpuReading) -> dict[str, Any]:
    return {
        "t": round(now),
        "gpu": r.pci_bus_id,
        "temp_c": r.temperature_c,
        "power_w": r.power_w,
        "throttle": list(r.throttle),
        "gen": r.link_gen,
        "width": r.link_width,
    }


def _product(pair: Any) -> float:
    try:
        return float(pair[0] or 0) * float(pair[1] or 0)
    except (TypeError, ValueError, IndexError):
        return 0.0


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _dict(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def load_health(state_dir: Path) -> dict[str, Any] | None:
    """The current health.json (None when missing or not ours: the next sample starts it
    afresh rather than failing every minute)."""
    from egpu_setup.state.paths import read_state

    data = read_state(state_dir / HEALTH_FILE, limit=4 * MAX_HEALTH_BYTES)
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA_HEALTH else None


def save_health(state_dir: Path, anchor: Path, doc: Mapping[str, Any]) -> None:
    """Write health.json (0644: `egpu-setup report` and the lab's fetch read it) atomically."""
    from egpu_setup.state.atomic import atomic_write, make_dirs

    make_dirs(state_dir, anchor=anchor)
    atomic_write(state_dir / HEALTH_FILE, encode(doc), 0o644, anchor=anchor)
