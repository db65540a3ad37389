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

from packaging.utils import canonicalize_name

from egpu_setup.host.machine import Host


def installed_packages(host: Host) -> dict[str, str]:
    """name -> version of every package dpkg says is installed (reads /var/lib/dpkg/status)."""
    text = host.read("/var/lib/dpkg/status") or ""
    out: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields = dict(
            (m.group(1), m.group(2).strip())
            for m in re.finditer(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M)
        )
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            out[fields["Package"]] = fields.get("Version", "")
    return out


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
    `reinstreq` ("in a very bad inconsistent state"). Read from /var/lib/dpkg/status."""
    text = host.read("/var/lib/dpkg/status") or ""
    out = []
    for stanza in text.split("\n\n"):
        name = re.search(r"^Package:[ \t]*(\S+)", stanza, re.M)
        status = re.search(r"^Status:[ \t]*(\S+)[ \t]+(\S+)[ \t]+(\S+)", stanza, re.M)
        if not name or not status:
            continue
        _want, flag, state = status.groups()
        if flag == "reinstreq" or state in UNFINISHED_STATES:
            out.append(name.group(1))
    return out


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


def venv_versions(host: Host, venv: str) -> dict[str, str] | None:
    """Normalised distribution name -> version installed in `venv`, counting only the complete
    ones (`incomplete_distributions`); None when there is no venv."""
    if not host.exists(f"{venv}/bin/python"):
        return None
    out: dict[str, str] = {}
    for info in _dist_infos(host, venv):
        meta = host.read(f"{info}/METADATA", 16384) or ""
        name = re.search(r"^Name:\s*(\S+)", meta, re.M)
        version = re.search(r"^Version:\s*(\S+)", meta, re.M)
        if name and version and _missing(host, info) is None:
            out[canonicalize_name(name.group(1))] = version.group(1)
    return out


def incomplete_distributions(host: Host, venv: str) -> dict[str, str]:
    """dist-info directory name -> what it lacks, for each distribution in `venv` an install
    did not finish (a kill, a power cut before the disk had it all)."""
    out: dict[str, str] = {}
    for info in _dist_infos(host, venv):
        missing = _missing(host, info)
        if missing is not None:
            out[info.rpartition("/")[2]] = missing
    return out


def _dist_infos(host: Host, venv: str) -> list[str]:
    return [
        info
        for lib in host.glob(f"{venv}/lib", "python*")
        for info in host.glob(f"{lib}/site-packages", "*.dist-info")
    ]


# The files an installer writes into a .dist-info (the "Recording installed projects"
# specification, https://packaging.python.org/en/latest/specifications/recording-installed-packages/):
# pip and uv write METADATA with the wheel's files, then INSTALLER and RECORD last, so a
# dist-info without them is one whose install stopped part-way.
_COMPLETE = ("METADATA", "RECORD", "INSTALLER")


def _missing(host: Host, info: str) -> str | None:
    """What makes the distribution at `info` untrustworthy, or None: one of _COMPLETE missing or
    empty, or a console script its RECORD lists (bin/torchrun, bin/pip) not there. The scripts
    alone are checked of RECORD's files: they are what a user runs, and checking torch's
    thousands of files would cost every run the time of reading them."""
    for name in _COMPLETE:
        if not host.read(f"{info}/{name}", 4096):
            return f"no {name}"
    record = host.read(f"{info}/RECORD") or ""
    site = info.rpartition("/")[0]
    for line in record.splitlines():
        path = line.partition(",")[0]
        if not path.startswith("../") or "/bin/" not in path:
            continue
        where = os.path.normpath(f"{site}/{path}")
        if not host.exists(where):
            return f"no {where} (listed in RECORD)"
    return None
