"""The OS from release files, for systems with no usable os-release (old or stripped images).

Pure parsers over text the Host read (so a recorded or `--root` tree is read inside itself,
never through the OS's own link resolution): /etc/lsb-release (DISTRIB_ID, DISTRIB_RELEASE,
DISTRIB_CODENAME, DISTRIB_DESCRIPTION: the LSB's `lsb_release` reads these) and the
distribution's own /etc/NAME-release file, one line "NAME release VERSION (CODENAME)", e.g.
"CentOS Linux release 7.9.2009 (Core)" or "Red Hat Enterprise Linux Server release 6.8
(Santiago)" (the layout the `distro` package documents for these files,
https://distro.readthedocs.io/en/latest/#data-sources).
"""

from __future__ import annotations

import re

from egpu_setup.detect.osrelease import parse_os_release

# Release files that say nothing about which distribution this is (the `distro` package skips
# the same names), and the generic ones every Red Hat derivative carries: read last.
IGNORED = frozenset({"os-release", "lsb-release", "system-release", "oem-release"})
GENERIC = ("redhat-release", "system-release-cpe")

# The distribution a release line names -> its os-release ID (each distribution's own
# /etc/os-release: ID=centos, ID=rhel, ID=fedora, ID=rocky, ID=almalinux, ID=ol, ID=scientific)
_NAMES = (
    ("centos", "centos"),
    ("red hat enterprise linux", "rhel"),
    ("fedora", "fedora"),
    ("rocky linux", "rocky"),
    ("almalinux", "almalinux"),
    ("oracle linux", "ol"),
    ("scientific linux", "scientific"),
)
_LINE = re.compile(
    r"^(?P<name>.*?)\s+(?:release|version)\s+(?P<version>\d[\w.]*)\s*(?:\((?P<codename>[^)]*)\))?"
)
_NAME_FILE = re.compile(r"^(?P<stem>[\w.]+)[-_](?:release|version)\Z")


def parse_lsb_release(text: str) -> dict[str, str]:
    """os-release keys from /etc/lsb-release text (DISTRIB_* assignments)."""
    keys = parse_os_release(text)
    out = {
        "ID": keys.get("DISTRIB_ID", "").lower().replace(" ", ""),
        "VERSION_ID": keys.get("DISTRIB_RELEASE", ""),
        "VERSION_CODENAME": keys.get("DISTRIB_CODENAME", ""),
        "PRETTY_NAME": keys.get("DISTRIB_DESCRIPTION", ""),
    }
    return {k: v for k, v in out.items() if v}


def parse_release_line(file_name: str, text: str) -> dict[str, str]:
    """os-release keys from the first line of /etc/<file_name>; {} when it says nothing."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    m = _LINE.match(line)
    if not m:
        return {}
    lowered = m["name"].lower()
    os_id = next((i for name, i in _NAMES if name in lowered), None)
    if os_id is None:
        stem = _NAME_FILE.match(file_name)
        os_id = {"redhat": "rhel"}.get(stem["stem"], stem["stem"]) if stem else None
    out = {
        "ID": os_id or "",
        "VERSION_ID": m["version"],
        "VERSION_CODENAME": (m["codename"] or "").strip(),
        "PRETTY_NAME": line,
    }
    return {k: v for k, v in out.items() if v}


def release_file_names(names: list[str]) -> list[str]:
    """The /etc entries worth reading, in order: the distribution's own file before the generic
    redhat-release that its derivatives also carry."""
    found = [n for n in names if _NAME_FILE.match(n) and n not in IGNORED]
    return sorted(found, key=lambda n: (n in GENERIC, n))
