"""What the target already has: dpkg's installed packages, the distributions in a venv.

Read from the files (the dpkg status database, dist-info METADATA), never by running apt or
importing torch, so a recording (--from) and an image (--root) are read the same way.
"""

from __future__ import annotations

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


def venv_versions(host: Host, venv: str) -> dict[str, str] | None:
    """Normalised distribution name -> version installed in `venv`; None when there is no venv."""
    if not host.exists(f"{venv}/bin/python"):
        return None
    out: dict[str, str] = {}
    for lib in host.glob(f"{venv}/lib", "python*"):
        for info in host.glob(f"{lib}/site-packages", "*.dist-info"):
            meta = host.read(f"{info}/METADATA", 16384) or ""
            name = re.search(r"^Name:\s*(\S+)", meta, re.M)
            version = re.search(r"^Version:\s*(\S+)", meta, re.M)
            if name and version:
                out[canonicalize_name(name.group(1))] = version.group(1)
    return out
