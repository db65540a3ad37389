"""The lab by enclosure: which machines each Thunderbolt box (and its cable) met, at what link.

A lab moves enclosures between laptops. Install and verify reports carry the enclosure the eGPU
sat in (`host.enclosure`, HostFacts.enclosure_of: its unique_id, vendor and model), so the rows
can be grouped by box as well as by machine. A link trained below its ceiling on one laptop may
be that laptop's port; below it on every laptop a box met (two or more), it is the box or its
cable: that enclosure is flagged. A machine whose link is not known says nothing either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from egpu_setup.fleet.expected import Link, number

# a Thunderbolt unique_id as sysfs and boltctl print it: a UUID (or a shorter hex id)
_UUID = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{7,63}")
_TEXT_MAX = 80


@dataclass(frozen=True)
class Enclosure:
    """The box a machine's eGPU sat in, as its newest report names it."""

    unique_id: str
    vendor: str | None
    name: str | None
    generation: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Enclosure | None:
        if not isinstance(raw, dict):
            return None
        uid = raw.get("unique_id")
        if not isinstance(uid, str) or not _UUID.fullmatch(uid.strip()):
            return None
        gen = number(raw.get("generation"))
        return cls(
            unique_id=uid.strip().lower(),
            vendor=_text(raw.get("vendor")),
            name=_text(raw.get("name")),
            generation=int(gen) if gen is not None and gen == int(gen) else None,
        )

    @property
    def model(self) -> str:
        return " ".join(x for x in (self.vendor, self.name) if x) or "unknown model"

    def to_json(self) -> dict[str, Any]:
        return {
            "unique_id": self.unique_id,
            "vendor": self.vendor,
            "name": self.name,
            "generation": self.generation,
        }


@dataclass(frozen=True)
class Meeting:
    """One machine an enclosure met, and the link it trained there."""

    machine: str
    link: Link | None
    ceiling: Link | None

    @property
    def degraded(self) -> bool | None:
        """Below its ceiling (None: the link or its ceiling is not known)."""
        if self.link is None or self.ceiling is None:
            return None
        return _lanes(self.link) < _lanes(self.ceiling)


@dataclass(frozen=True)
class EnclosureRow:
    """One enclosure of the lab and the machines it met."""

    enclosure: Enclosure
    meetings: tuple[Meeting, ...]

    @property
    def judged(self) -> tuple[Meeting, ...]:
        return tuple(m for m in self.meetings if m.degraded is not None)

    @property
    def degraded_everywhere(self) -> bool:
        """Degraded on every machine it met whose link is known, and it met two or more."""
        judged = self.judged
        return len(judged) >= 2 and all(m.degraded for m in judged)

    def verdict(self) -> str:
        judged = self.judged
        bad = [m for m in judged if m.degraded]
        if self.degraded_everywhere:
            return f"degraded on all {len(judged)} machines it met: the enclosure or its cable"
        if bad:
            return f"degraded on {len(bad)} of {len(judged)}: look at those machines' ports"
        return "ok" if judged else "link not known"

    def to_json(self) -> dict[str, Any]:
        return {
            **self.enclosure.to_json(),
            "machines": [
                {
                    "machine": m.machine,
                    "link": m.link.text() if m.link else None,
                    "link_ceiling": m.ceiling.text() if m.ceiling else None,
                    "degraded": m.degraded,
                }
                for m in self.meetings
            ],
            "degraded_everywhere": self.degraded_everywhere,
            "verdict": self.verdict(),
        }


def group_by_enclosure(
    rows: Sequence[tuple[str, Enclosure | None, Link | None, Link | None]],
) -> tuple[EnclosureRow, ...]:
    """(machine, enclosure, link, ceiling) of every row -> one row per enclosure, flagged first,
    then by model and id."""
    met: dict[str, list[Meeting]] = {}
    boxes: dict[str, Enclosure] = {}
    for machine, box, link, ceiling in rows:
        if box is None:
            continue
        boxes.setdefault(box.unique_id, box)
        met.setdefault(box.unique_id, []).append(Meeting(machine, link, ceiling))
    out = [EnclosureRow(boxes[uid], tuple(ms)) for uid, ms in met.items()]
    out.sort(key=lambda r: (not r.degraded_everywhere, r.enclosure.model, r.enclosure.unique_id))
    return tuple(out)


def _lanes(link: Link) -> float:
    return (link.speed_gts or 0.0) * (link.width or 0)


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    line = " ".join(value.split())
    return line[:_TEXT_MAX] or None


def enclosure_of(hosts: Sequence[Mapping[str, Any] | None]) -> Enclosure | None:
    """The enclosure the newest report (first) that names one names."""
    for host in hosts:
        if isinstance(host, dict) and (box := Enclosure.from_json(host.get("enclosure"))):
            return box
    return None
