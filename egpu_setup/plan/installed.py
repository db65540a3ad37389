"""What the target already has: dpkg's installed packages, the distributions in a venv.

Read from the files (the dpkg status database, dist-info METADATA), never by running apt or
importing torch, so a recording (--from) and an image (--root) are read the same way.

The dpkg status file is read by hand rather than with python-debian's deb822: two fields of each
stanza (deb-control(5) layout) are all that is needed, and it is faster with no dependency.
Measured on an 826-package status file: 30 ms here, 102 ms for deb822 (plus 116 ms to import it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from egpu_setup.detect.dpkg_status import DpkgEntry, parse_dpkg_status
from egpu_setup.host.machine import Host


def dpkg_entries(host: Host) -> dict[str, DpkgEntry]:
    """Every package in dpkg's database: the status file, then the journal of changes not yet
    merged into it (/var/lib/dpkg/updates/, files named by number, applied in order; what a
    killed dpkg leaves), as dpkg reads them itself (modstatdb_init in dpkg's
    lib/dpkg/dbmodify.c, https://git.dpkg.org/cgit/dpkg/dpkg.git/tree/lib/dpkg/dbmodify.c)."""
    journal = sorted((n for n in host.listdir("/var/lib/dpkg/updates") if n.isdigit()), key=int)
    paths = ["/var/lib/dpkg/status", *(f"/var/lib/dpkg/updates/{n}" for n in journal)]
    return parse_dpkg_status(host.read(path) or "" for path in paths)


def _dpkg_status(host: Host) -> dict[str, tuple[str, str, str, str]]:
    """name -> (want, flag, state, version) of every package in dpkg's database."""
    return {n: (e.want, e.flag, e.state, e.version) for n, e in dpkg_entries(host).items()}


def installed_packages(host: Host) -> dict[str, str]:
    """name -> version of every package dpkg has installed *and configured* (reads
    /var/lib/dpkg/status): `Status: install ok installed`, or `hold ok installed` (apt-mark
    hold). Nothing else counts (deb-status(5), dpkg(1) "Package states"): a package left
    unpacked, half-configured, half-installed or with triggers pending by a killed or failed
    run is not usable yet, and one marked `reinstreq` must be installed again; so the plan asks
    apt for it again (after `dpkg --configure -a`, plan/build.py)."""
    return {
        name: version
        for name, (want, flag, state, version) in _dpkg_status(host).items()
        if want in ("install", "hold") and flag == "ok" and state == "installed"
    }


def configured_packages(host: Host) -> dict[str, str]:
    """name -> version of every package dpkg has configured, its triggers run or not
    (`DpkgEntry.configured`): what an apt step that deferred its triggers installed."""
    return {n: e.version for n, e in dpkg_entries(host).items() if e.configured}


def present_packages(host: Host) -> dict[str, str]:
    """name -> dpkg state of every package dpkg has anything of: its files in any state, even
    half-installed, or only its conffiles (`config-files`, what a removal leaves). A package
    an install left in any of these states is the install's to take back, and rollback
    --packages purges it (dpkg --purge takes a package in every one of them)."""
    return {name: state for name, (_w, _f, state, _v) in _dpkg_status(host).items()
            if state != "not-installed"}  # fmt: skip


def auto_installed(host: Host) -> set[str]:
    """Packages apt marks as installed only as a dependency (/var/lib/apt/extended_states,
    `Auto-Installed: 1`; what `apt-mark showauto` lists)."""
    text = host.read("/var/lib/apt/extended_states") or ""
    out = set()
    for stanza in text.split("\n\n"):
        name = re.search(r"^Package:[ \t]*(\S+)", stanza, re.M)
        if name and re.search(r"^Auto-Installed:[ \t]*1[ \t]*$", stanza, re.M):
            out.add(name.group(1))
    return out


def needs_reinstall(host: Host) -> set[str]:
    """Packages dpkg says must be installed again: flagged `reinstreq`, or `half-installed` (a
    dpkg killed while it unpacked them). `dpkg --configure -a` cannot finish them and a plain
    `apt-get install` calls them "already the newest version"; `--reinstall` unpacks them
    again (apt-get(8))."""
    return {name for name, (_w, flag, state, _v) in _dpkg_status(host).items()
            if flag == "reinstreq" or state == "half-installed"}  # fmt: skip


def native_arch(status: str) -> str:
    """What `dpkg --print-architecture` says, read from dpkg's status file text: dpkg itself is
    always of the native architecture."""
    m = re.search(r"^Package: dpkg\n(?:[^\n]+\n)*?Architecture: (\S+)", status, re.M)
    return m.group(1) if m else "-"


# dpkg's package states that `dpkg --audit` reports (dpkg(1), "Package states"; deb-status(5)):
# an operation started and did not finish. `dpkg --audit` itself exits 0 even when it lists some
# (dpkg 1.21), so the status file is read instead of its exit code.
UNFINISHED_STATES = (
    "half-installed",
    "unpacked",
    "half-configured",
    "triggers-awaited",
    "triggers-pending",
)


def unfinished_packages(host: Host) -> list[str]:
    """Packages an interrupted dpkg run left unfinished: in one of UNFINISHED_STATES, or flagged
    `reinstreq` ("in a very bad inconsistent state"). Read from dpkg's database."""
    return [name for name, (_w, flag, state, _v) in _dpkg_status(host).items()
            if flag == "reinstreq" or state in UNFINISHED_STATES]  # fmt: skip


def dpkg_interrupted(host: Host) -> str | None:
    """Why dpkg must finish an earlier run first (`dpkg --configure -a`), or None: journal files
    in /var/lib/dpkg/updates/ (apt then refuses everything: "dpkg was interrupted"), or packages
    left unpacked or half-configured by a failed maintainer script."""
    if host.listdir("/var/lib/dpkg/updates"):
        return "an earlier package installation was interrupted"
    unfinished = unfinished_packages(host)
    if unfinished:
        shown = ", ".join(unfinished[:4]) + (
            f" and {len(unfinished) - 4} more" if len(unfinished) > 4 else ""
        )
        return f"an earlier package installation did not finish ({shown})"
    return None


@dataclass(frozen=True)
class Damaged:
    """An installed distribution whose files fail the RECORD check (`_missing`)."""

    info: str  # its .dist-info directory
    version: str
    why: str
    has_record: bool  # pip can reinstall it (--force-reinstall uninstalls by RECORD first)


@dataclass(frozen=True)
class VenvContents:
    """What one pass over a venv's distributions found (each RECORD checked once: for torch
    that is 12,000 file sizes, too many to read twice per plan)."""

    # normalised name -> version of each complete distribution; None when there is no venv
    versions: dict[str, str] | None
    # dist-info (or pip stash) name -> what it lacks, for each install that did not finish
    incomplete: dict[str, str]
    # normalised name -> the damaged distribution, for each dist-info in `incomplete`
    damaged: dict[str, Damaged] = field(default_factory=dict)
    # normalised name -> the names its METADATA requires (Requires-Dist, extras left out)
    requires: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def damaged_closure(self, names: Iterable[str]) -> dict[str, Damaged]:
        """The damaged distributions among `names` and what they require, transitively (a
        short file of numpy breaks torch as surely as one of torch's own)."""
        seen: set[str] = set()
        todo: list[str] = [canonicalize_name(n) for n in names]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.requires.get(name, ()))
        return {name: self.damaged[name] for name in sorted(seen) if name in self.damaged}


def venv_contents(host: Host, venv: str) -> VenvContents:
    has_python = host.exists(f"{venv}/bin/python")
    versions: dict[str, str] = {}
    incomplete: dict[str, str] = {}
    damaged: dict[str, Damaged] = {}
    requires: dict[str, tuple[str, ...]] = {}
    for info in _dist_infos(host, venv):
        meta = host.read(f"{info}/METADATA", 16384) or ""
        dirname = info.rpartition("/")[2]
        # the directory's own name-version (the specification above: `{name}-{version}`,
        # the name's dashes made underscores), which a METADATA cut short still has
        name, _, version = dirname.removesuffix(".dist-info").partition("-")
        key = canonicalize_name(_field(meta, "Name") or name)
        requires[key] = parse_requires(meta)
        missing = _missing(host, info, meta)
        if missing is not None:
            incomplete[dirname] = missing
            damaged[key] = Damaged(
                info, _field(meta, "Version") or version, missing, missing != "no RECORD"
            )
            continue
        if _field(meta, "Name") and _field(meta, "Version"):
            versions[key] = str(_field(meta, "Version"))
    for stash in _stashes(host, venv):
        incomplete[stash.rpartition("/")[2]] = "what a pip killed while uninstalling moved aside"
    return VenvContents(versions if has_python else None, incomplete, damaged, requires)


def _field(meta: str, name: str) -> str | None:
    m = re.search(rf"^{name}:\s*(\S+)", meta, re.M)
    return m.group(1) if m else None


def parse_requires(meta: str) -> tuple[str, ...]:
    """The normalised names a METADATA text's Requires-Dist lines name, those only an extra
    asks for left out (`; extra == "..."`): what installing the distribution pulls in."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for line in re.findall(r"^Requires-Dist:[ \t]*(.+)$", meta, re.M):
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or "extra" not in str(req.marker):
            out.append(canonicalize_name(req.name))
    return tuple(out)


def venv_versions(host: Host, venv: str) -> dict[str, str] | None:
    """Normalised distribution name -> version installed in `venv`, counting only the complete
    ones (`incomplete_distributions`); None when there is no venv."""
    if not host.exists(f"{venv}/bin/python"):
        return None
    return venv_contents(host, venv).versions


def incomplete_distributions(host: Host, venv: str) -> dict[str, str]:
    """dist-info directory name -> what it lacks, for each distribution in `venv` an install
    did not finish (a kill, a power cut before the disk had it all)."""
    return venv_contents(host, venv).incomplete


def _site_packages(host: Host, venv: str) -> list[str]:
    return [f"{lib}/site-packages" for lib in host.glob(f"{venv}/lib", "python*")]


def _dist_infos(host: Host, venv: str) -> list[str]:
    """The distributions' .dist-info directories, as pip lists them: a name beginning with "~"
    is not one (pip: "Ignoring invalid distribution ~NAME"), see `_stashes`."""
    return [
        info
        for site in _site_packages(host, venv)
        for info in host.glob(site, "*.dist-info")
        if not info.rpartition("/")[2].startswith("~")
    ]


def _stashes(host: Host, venv: str) -> list[str]:
    """What pip moves aside while it replaces a version: the old files under their name with
    the first letter made "~" (pip's AdjacentTempDirectory, for its StashedUninstallPathSet),
    removed once the install commits. One left means a pip run ended midway; the old METADATA
    in it must not count as installed."""
    return [entry for site in _site_packages(host, venv) for entry in host.glob(site, "~*")]


# The files an installer writes into a .dist-info (the "Recording installed projects"
# specification, https://packaging.python.org/en/latest/specifications/recording-installed-packages/):
# pip and uv write METADATA with the wheel's files, then INSTALLER and RECORD last, so a
# dist-info without them is one whose install stopped part-way.
_COMPLETE = ("METADATA", "RECORD", "INSTALLER")


def _missing(host: Host, info: str, meta: str) -> str | None:
    """What makes the distribution at `info` (`meta`: its METADATA as read) untrustworthy, or
    None: one of _COMPLETE missing or empty, a console script its RECORD lists (bin/torchrun,
    bin/pip) not there, or a file of site-packages RECORD lists missing or of another size
    than RECORD says (a file a kill, or a power cut before the disk had it, left short: pip
    writes each file in place). Sizes, not RECORD's hashes: one fstatat(2) per file, by
    directory descriptor (Host.file_sizes), is what every plan can afford for torch's 12,000
    files (docs/testing.md has the figures); hashing its 665 MiB is not."""
    record = host.read(f"{info}/RECORD") or ""
    installer = host.read(f"{info}/INSTALLER", 4096)
    for name, text in zip(_COMPLETE, (meta, record, installer), strict=True):
        if not text:
            return f"no {name}"
    site = info.rpartition("/")[0]
    sized: dict[str, int] = {}
    for row in parse_record(record):
        path, size = row
        if path.startswith("../"):
            if "/bin/" in path and not host.exists(where := os.path.normpath(f"{site}/{path}")):
                return f"no {where} (listed in RECORD)"
        elif size is not None:
            sized[path] = size
    found = host.file_sizes(site, sized)
    if found == sized:  # the common case, compared in one pass of C
        return None
    for path, size in sized.items():
        if found.get(path) != size:
            have = found.get(path)
            what = "missing" if have is None else f"{have} bytes"
            return f"{site}/{path} is {what}, RECORD says {size} bytes"
    return None


def parse_record(text: str) -> list[tuple[str, int | None]]:
    """(path, size) of each row of a RECORD file (CSV: path, hash, size; the specification
    above); size None where the row gives none (RECORD itself, .pyc files pip compiled)."""
    import csv

    rows = []
    for line in text.splitlines():
        # the path is quoted only when it holds a comma or a quote: csv for those lines alone
        fields = next(csv.reader([line]), []) if '"' in line else line.rsplit(",", 2)
        if len(fields) == 3 and fields[0]:
            rows.append((fields[0], int(fields[2]) if fields[2].isdigit() else None))
    return rows
