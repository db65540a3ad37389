"""Which machine each report is from: the folder it was collected into, and the machine id.

The hostname inside a report proves nothing: laptops cloned from one image share it, a report
without one would split its machine in two, and a report copied into another machine's folder
claims whatever it says. So a machine is
- the folder the Ansible role fetched its reports into (`<dest>/<inventory_hostname>/`, with the
  identity.json the role writes there): never merged with another folder, whatever the reports
  in either claim;
- within a folder that is not one machine's (the argument itself: a machine's own
  <state>/reports/, or a flat pile of files), the machine id the reports record (the sha256 of
  /etc/machine-id, egpu_setup/host/identity.py), else their hostname.
A report whose claims disagree with its folder (another machine id than identity.json's, or a
hostname that is neither the folder's nor the one all its other reports share) is set aside
and named: the row of its folder is then not ok, so a copied report can never stand in for
the machine whose folder it sits in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from egpu_setup.fleet.load import FileProblem, Folder, Identity, LoadedReport


@dataclass(frozen=True)
class Disowned:
    """A report found in a machine's folder that claims to be another machine's."""

    report: LoadedReport
    reason: str


@dataclass(frozen=True)
class Machine:
    """One machine: the reports that are its own, and what was set aside."""

    name: str  # the inventory hostname, the folder's name, or the claimed hostname
    folder: Path
    identity: Identity | None
    machine_id: str | None  # identity.json's, else the one its reports agree on
    reports: tuple[LoadedReport, ...]
    disowned: tuple[Disowned, ...] = ()
    problems: tuple[FileProblem, ...] = ()  # its own files that could not be read

    @property
    def hostname(self) -> str | None:
        """The hostname its newest report claims."""
        dated = sorted(
            (r for r in self.reports if r.hostname),
            key=lambda r: r.age,
        )
        return dated[-1].hostname if dated else None


def machines(folder: Folder) -> list[Machine]:
    """The machines of one folder: exactly one for a machine's folder, one per claim else."""
    problems = tuple(p for p in folder.problems if p.ours)
    if folder.per_machine:
        return [_one_machine(folder, problems)]
    return _by_claims(folder, problems)


def _one_machine(folder: Folder, problems: tuple[FileProblem, ...]) -> Machine:
    ident = folder.identity
    names = [n for n in ((ident.inventory_hostname if ident else None), folder.path.name) if n]
    hostnames = {_short(r.hostname) for r in folder.reports if r.hostname}
    ref_id = _reference_id(ident, folder.reports, names)
    own: list[LoadedReport] = []
    disowned: list[Disowned] = []
    for rep in folder.reports:
        why = _disagreement(rep, ref_id, names, len(hostnames) <= 1)
        if why is None:
            own.append(rep)
        else:
            disowned.append(Disowned(rep, why))
    return Machine(
        name=names[0] if names else str(folder.path),
        folder=folder.path,
        identity=ident,
        machine_id=ref_id,
        reports=tuple(own),
        disowned=tuple(disowned),
        problems=problems,
    )


def _reference_id(
    ident: Identity | None, reports: Sequence[LoadedReport], names: Sequence[str]
) -> str | None:
    """The folder's machine id: identity.json's; else the one its reports claim (the one claimed
    by reports naming the folder's host, when they claim several)."""
    if ident is not None and ident.machine_id:
        return ident.machine_id
    ids = Counter(r.machine_id for r in reports if r.machine_id)
    named = Counter(r.machine_id for r in reports if r.machine_id and _matches(r.hostname, names))
    pool = named or ids
    if not pool:
        return None
    # most claims first, then the smallest id: the same answer whatever order files come in
    return min(pool.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def _disagreement(
    rep: LoadedReport, ref_id: str | None, names: Sequence[str], one_hostname: bool
) -> str | None:
    """Why `rep` is not this folder's machine's report, or None when nothing says so.

    The machine id decides when both sides have one (a laptop renamed after imaging keeps its
    id); the hostname only when they do not: it agrees when it names the folder's host (short
    or fully qualified), or when every report of the folder claims that same hostname (an
    inventory alias that is not the machine's hostname)."""
    if ref_id and rep.machine_id:
        if rep.machine_id == ref_id:
            return None
        return (
            f"claims machine id {rep.machine_id[:12]}…, this folder's machine is {ref_id[:12]}…"
            + (f" (hostname {rep.hostname})" if rep.hostname else "")
        )
    if rep.hostname is None or one_hostname or _matches(rep.hostname, names):
        return None
    return f"claims hostname {rep.hostname}, not {names[0] if names else 'this folder'}'s"


def _by_claims(folder: Folder, problems: tuple[FileProblem, ...]) -> list[Machine]:
    """A folder that is not one machine's: one machine per machine id, else per hostname.

    A report with a hostname but no id (written before reports recorded one) joins the one
    machine with that hostname and an id; with several (clones), it cannot be told apart and
    stays its own row. A report that claims nothing joins the folder's only machine."""
    groups: dict[str, list[LoadedReport]] = {}
    ids_by_host: dict[str, set[str]] = {}
    for rep in folder.reports:
        if rep.machine_id and rep.hostname:
            ids_by_host.setdefault(_short(rep.hostname), set()).add(rep.machine_id)
    unclaimed: list[LoadedReport] = []
    for rep in folder.reports:
        if rep.machine_id:
            key = "id:" + rep.machine_id
        elif rep.hostname:
            ids = ids_by_host.get(_short(rep.hostname), set())
            key = "id:" + next(iter(ids)) if len(ids) == 1 else "host:" + _short(rep.hostname)
        else:
            unclaimed.append(rep)
            continue
        groups.setdefault(key, []).append(rep)
    if unclaimed:
        if len(groups) == 1:
            next(iter(groups.values())).extend(unclaimed)
        else:
            groups["folder:"] = unclaimed
    if not groups:  # nothing readable: the folder's problems still need a row
        groups["folder:"] = []
    out = []
    for key, reps in groups.items():
        claimed = Machine(folder.path.name, folder.path, None, None, tuple(reps)).hostname
        out.append(
            Machine(
                name=claimed or folder.path.name or str(folder.path),
                folder=folder.path,
                identity=None,
                machine_id=key[3:] if key.startswith("id:") else None,
                reports=tuple(reps),
                # the files that could not be read belong to no claim: shown on every machine
                # of the folder, so none of them passes for ok while one may be hiding a failure
                problems=problems,
            )
        )
    return out


def unique_names(all_machines: Iterable[Machine]) -> list[Machine]:
    """Rows need names that tell machines apart: two machines of one name (two collection
    folders both holding lab-01, two clones in one pile) get their folder, then their id."""
    from dataclasses import replace

    listed = list(all_machines)
    counts = Counter(m.name for m in listed)
    out = []
    for m in listed:
        if counts[m.name] > 1:
            m = replace(m, name=f"{m.name} ({m.folder})")
        out.append(m)
    counts = Counter(m.name for m in out)
    return [
        replace(m, name=f"{m.name} [{(m.machine_id or 'no id')[:8]}]") if counts[m.name] > 1 else m
        for m in out
    ]


def _short(hostname: str | None) -> str:
    """The comparable part of a hostname: lower case, the first DNS label."""
    return (hostname or "").strip().lower().split(".")[0]


def _matches(hostname: str | None, names: Sequence[str]) -> bool:
    return bool(hostname) and any(_short(hostname) == _short(n) for n in names)
