"""`extends:`: a profile merged over its ancestors, with cycle detection; marks follow each key."""

from __future__ import annotations

import difflib
from typing import Any

from egpu_setup.profile.document import Document, read_document
from egpu_setup.profile.problems import Marks, Problem
from egpu_setup.profile.search import available

MAX_EXTENDS_DEPTH = 16


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, everything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def resolve_extends(
    doc: Document, stack: tuple[str, ...]
) -> tuple[dict[str, Any], Marks, tuple[str, ...]]:
    """The document merged over its `extends:` ancestors; marks point into the file that set
    each key."""
    parent_name = doc.data.get("extends")
    if parent_name is None:
        return doc.data, doc.marks, (str(doc.path),)
    here = doc.marks.value(("extends",))
    chain_names = (*stack, doc.data["name"])
    if parent_name in chain_names:
        cycle = " -> ".join((*chain_names, parent_name))
        raise Problem(
            here,
            ("extends",),
            f"extends cycle: {cycle}",
            "one of these profiles must not extend the other",
        ).error()
    if len(chain_names) > MAX_EXTENDS_DEPTH:
        raise Problem(
            here, ("extends",), "extends chain is too deep", "flatten the profiles"
        ).error()
    entries = available()
    entry = entries.get(parent_name)
    if entry is None:
        close = difflib.get_close_matches(parent_name, list(entries), n=1, cutoff=0.5)
        raise Problem(
            here,
            ("extends",),
            f"unknown profile {parent_name!r}",
            f"did you mean `{close[0]}`?" if close else "see `egpu-setup profiles list`",
        ).error()
    if entry.path.resolve() == doc.path.resolve():
        raise Problem(
            here, ("extends",), "a profile cannot extend itself", "name another profile"
        ).error()
    parent = read_document(entry.path, entry.origin)
    base, base_marks, chain = resolve_extends(parent, chain_names)
    own = {k: v for k, v in doc.data.items() if k != "extends"}
    merged = merge(base, own)
    marks = Marks(doc.marks.file)
    for attr in ("keys", "values"):
        combined = dict(getattr(base_marks, attr))
        combined.update(getattr(doc.marks, attr))
        setattr(marks, attr, combined)
    merged["extends"] = parent_name
    return merged, marks, (*chain, str(doc.path))
