"""The glibc floor of the torch wheels: drop the candidates a distribution's C library cannot load.

Each torch release's manylinux tag names the oldest glibc its Linux wheels need (torch.yaml
`manylinux`); each distribution release's glibc is in distros.yaml `glibc` (egpu_setup/compat/
glibc.py reads both). Ubuntu 18.04 (glibc 2.27) cannot load torch 2.7+ (manylinux_2_28):
https://github.com/pytorch/pytorch/issues/156215.
"""

from __future__ import annotations

from typing import Any

from egpu_setup.compat.glibc import Floor, distro_glibc, glibc_key, torch_floor
from egpu_setup.errors import MatrixError, UsageError
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolution import Notes
from egpu_setup.resolve.wheels import Candidate, candidate_order


def within_glibc(
    cands: list[Candidate],
    c: Constraints,
    distro_id: str | None,
    distro_ver: str | None,
    distro_label: str | None,
    base: Any,
    n: Notes,
    machine: str,
) -> list[Candidate]:
    """The candidates whose Linux `machine` wheels load on the host's glibc (torch.yaml
    `manylinux`, the distro's glibc from distros.yaml or `c.glibc`); MatrixError when none does."""
    if c.glibc is not None:
        if glibc_key(c.glibc) is None:
            raise UsageError(f"glibc {c.glibc!r} is not a version", "use e.g. 2.27")
        glibc, where = c.glibc, "this host"
    else:
        found = distro_glibc(distro_id, distro_ver)
        if found is None and base is not None:
            found = distro_glibc(*base.base.rsplit("-", 1))
        if found is None:
            return cands  # an unknown glibc floors nothing (a Python's own check still applies)
        glibc, where = found[0], distro_label or "this distribution"
    have = glibc_key(glibc)
    keep: list[Candidate] = []
    dropped: list[tuple[Candidate, Floor]] = []
    for cand in cands:
        floor = torch_floor(cand.release.version, cand.variant.name, machine)
        needs = glibc_key(floor.glibc) if floor else None
        if floor is not None and needs is not None and have is not None and needs > have:
            dropped.append((cand, floor))
        else:
            keep.append(cand)
    if not dropped:
        return cands
    newest_refused, floor = max(dropped, key=lambda x: candidate_order(x[0]))
    if not keep:
        lowest = min(k for _, f in dropped if (k := glibc_key(f.glibc)) is not None)
        need = f"{lowest[0]}.{lowest[1]}"
        hint = (
            f"use a distribution with glibc >= {need} (Ubuntu 20.04, Debian 10, RHEL 8 or newer "
            f"have 2.28+), or run torch in a container that has one"
        )
        if c.torch_spec:
            hint += "; or drop --torch so that the newest torch that loads here is chosen"
        raise MatrixError(
            f"no torch wheel matching the request loads on glibc {glibc} ({where}): "
            f"torch {newest_refused.label} needs glibc {floor.glibc} ({floor.tag})",
            hint,
        )
    best = keep[0]
    newer = [(cand, f) for cand, f in dropped if candidate_order(cand) > candidate_order(best)]
    if newer:
        first, first_floor = min(newer, key=lambda x: candidate_order(x[0]))
        n.reasons.append(
            f"glibc {glibc} ({where}): the wheels from torch {first.label} on need glibc "
            f"{first_floor.glibc} ({first_floor.tag}), so the newest that loads is {best.label}"
        )
    return keep
