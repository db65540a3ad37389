"""Other GPU managers (EnvyControl, optimus-manager, system76-power, nvidia-prime, Bumblebee,
all-ways-egpu, egpu-switcher, gpu-manager): which one is configured, in which mode, what that does
to an NVIDIA eGPU, and the exact command that undoes it.

The knowledge is data (egpu_setup/data/gpu_managers.yaml, each entry with the upstream source
it was read from); this module is pure over the marker files doctor and install read through the
Host. doctor reports the states as `competing-gpu-manager`; install refuses the ones that block.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# What a manager's state does to an NVIDIA eGPU, worst first (the data file's header says each).
EFFECTS = ("disables-nvidia", "egpu-manager", "display", "x-on-nvidia", "installed")
_RANK = {e: i for i, e in enumerate(EFFECTS)}


@dataclass(frozen=True)
class Rule:
    pattern: str  # a regular expression, multiline
    mode: str
    effect: str


@dataclass(frozen=True)
class MarkerFile:
    path: str
    owner: str | None  # text the file must contain to be this tool's
    unless: str | None  # does not count when this path exists (a file two tools write)
    rules: tuple[Rule, ...]
    mode: str
    effect: str
    detail: str


@dataclass(frozen=True)
class Manager:
    id: str
    name: str
    undo: str
    undo_confirmed: bool
    after_undo: str
    after_undo_confirmed: bool
    display_undo: str | None
    display_undo_confirmed: bool
    sources: tuple[str, ...]
    files: tuple[MarkerFile, ...]


@dataclass(frozen=True)
class ManagerHit:
    """One marker file found: whose, in which mode, with what effect."""

    manager: Manager
    path: str
    mode: str
    effect: str
    detail: str

    @property
    def tool(self) -> str:
        return self.manager.id


@dataclass(frozen=True)
class ManagerState:
    """A manager as its files show it: the worst hit decides its mode and effect."""

    manager: Manager
    hits: tuple[ManagerHit, ...]

    @property
    def worst(self) -> ManagerHit:
        return min(self.hits, key=lambda h: _RANK[h.effect])

    @property
    def effect(self) -> str:
        return self.worst.effect

    @property
    def mode(self) -> str:
        return self.worst.mode

    def blocks(self, mode: str) -> bool:
        """egpu-setup cannot work next to it in this mode (compute/display)."""
        effect = self.effect
        return effect in ("disables-nvidia", "egpu-manager") or (
            effect == "display" and mode == "display"
        )

    def evidence(self) -> tuple[str, ...]:
        return tuple(f"{h.path}: {h.detail} ({h.mode})" for h in self.hits)

    def undo(self, mode: str) -> str:
        """The command that ends the conflict (and what must follow), UNCONFIRMED said so."""
        m = self.manager
        display_only = self.effect == "display" and mode == "display"
        if display_only and m.display_undo:
            text, sure = m.display_undo, m.display_undo_confirmed
        else:
            text, sure = m.undo, m.undo_confirmed
        line = f"`{text}`" + ("" if sure else " (UNCONFIRMED: no upstream document says so)")
        after = m.after_undo + ("" if m.after_undo_confirmed else " (UNCONFIRMED)")
        return f"{line}, then {after}"

    def summary(self) -> str:
        """'EnvyControl is in integrated mode: <file>: <what it does>; ...'"""
        what = "; ".join(f"{h.path} {h.detail}" for h in self.hits if h.effect != "installed")
        head = f"{self.manager.name} is in {self.mode} mode"
        return f"{head}: {what}" if what else head


@functools.cache
def load_managers() -> tuple[Manager, ...]:
    """The data file, validated: a wrong effect or an empty undo is a bug in the data."""
    from egpu_setup.compat.shipped import load

    data = load("gpu_managers.yaml")
    return tuple(_manager(entry) for entry in data["managers"])


def _manager(entry: dict[str, Any]) -> Manager:
    marker_files = []
    for f in entry["files"]:
        rules = tuple(Rule(r["match"], r["mode"], _effect(r["effect"])) for r in f.get("rules", ()))
        for r in rules:
            re.compile(r.pattern)
        marker_files.append(
            MarkerFile(
                path=f["path"],
                owner=f.get("owner"),
                unless=f.get("unless"),
                rules=rules,
                mode=f.get("mode", "installed"),
                effect=_effect(f["effect"]),
                detail=f["detail"],
            )
        )
    if not entry.get("undo") or not entry.get("sources"):
        raise ValueError(f"gpu_managers.yaml: {entry.get('id')}: undo and sources are required")
    return Manager(
        id=entry["id"],
        name=entry["name"],
        undo=entry["undo"],
        undo_confirmed=entry.get("undo_confirmed", True),
        after_undo=entry["after_undo"],
        after_undo_confirmed=entry.get("after_undo_confirmed", True),
        display_undo=entry.get("display_undo"),
        display_undo_confirmed=entry.get("display_undo_confirmed", True),
        sources=tuple(entry["sources"]),
        files=tuple(marker_files),
    )


def _effect(value: str) -> str:
    if value not in _RANK:
        raise ValueError(f"gpu_managers.yaml: unknown effect {value!r}")
    return value


def marker_paths() -> tuple[str, ...]:
    """Every path a manager leaves (what collect reads through the Host), in data order."""
    seen: dict[str, None] = {}
    for m in load_managers():
        for f in m.files:
            seen.setdefault(f.path, None)
            if f.unless:
                seen.setdefault(f.unless, None)
    return tuple(seen)


def manager_hits(present: Mapping[str, str | None]) -> list[ManagerHit]:
    """The marker files found. `present` maps each path that exists to its text (None: a
    directory or unreadable)."""
    hits = []
    for m in load_managers():
        for f in m.files:
            hit = _judge(m, f, present)
            if hit is not None:
                hits.append(hit)
    return hits


def _judge(m: Manager, f: MarkerFile, present: Mapping[str, str | None]) -> ManagerHit | None:
    if f.path not in present or (f.unless and f.unless in present):
        return None
    text = present[f.path]
    if f.owner is not None and (text is None or f.owner not in text):
        return None  # the same path, written by somebody else
    for rule in f.rules:
        if text is not None and re.search(rule.pattern, text, re.MULTILINE):
            return ManagerHit(m, f.path, rule.mode, rule.effect, f.detail)
    mode = f.mode
    if f.path == "/etc/prime-discrete" and text is not None and text.strip():
        mode = text.strip()[:20]  # prime-select's profile as it wrote it ("on-demand", "on")
    return ManagerHit(m, f.path, mode, f.effect, f.detail)


def manager_states(present: Mapping[str, str | None]) -> list[ManagerState]:
    """One state per configured manager, in data order."""
    by_id: dict[str, list[ManagerHit]] = {}
    for hit in manager_hits(present):
        by_id.setdefault(hit.manager.id, []).append(hit)
    return [ManagerState(hits[0].manager, tuple(hits)) for hits in by_id.values()]
