"""Pure readers of dpkg's status database and apt's preferences: which NVIDIA driver packages
are installed at which version, and which versions a pin holds them at.

The status file is read by hand rather than with python-debian's deb822 (plan/installed.py says
why: a few fields of each stanza, one pass over thousands of stanzas).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The driver hold's two files (profile `driver.hold`): written by render/hold.py through the
# install, read back by doctor (doctor/hold.py).
HOLD_PIN = "/etc/apt/preferences.d/99egpu-setup-driver"
HOLD_UNATTENDED = "/etc/apt/apt.conf.d/99egpu-setup-driver-hold"

_FIELD = re.compile(r"^([A-Za-z-]+):[ \t]*(.*)$", re.M)

# The Debian and Ubuntu source packages the NVIDIA driver's binaries are built from: Debian's
# nvidia-graphics-drivers (https://tracker.debian.org/pkg/nvidia-graphics-drivers) and Ubuntu's
# nvidia-graphics-drivers-<branch> (https://launchpad.net/ubuntu/+source/nvidia-graphics-drivers-550).
# Every binary of one source has that source's version: libraries and kernel module move together.
DRIVER_SOURCE = re.compile(r"^nvidia-graphics-drivers(?:-[0-9]+(?:-server)?)?$")


@dataclass(frozen=True)
class DpkgEntry:
    """One package as dpkg's database records it (deb-status(5), deb-control(5))."""

    name: str
    want: str
    flag: str
    state: str
    version: str
    source: str  # the source package (Source:, without its version; the package's own name if none)

    @property
    def installed(self) -> bool:
        """Installed and configured: `install ok installed`, or `hold ok installed`."""
        return self.want in ("install", "hold") and self.flag == "ok" and self.state == "installed"

    @property
    def configured(self) -> bool:
        """Installed and configured, its triggers perhaps not run yet (`triggers-awaited`,
        `triggers-pending`: what an apt step with dpkg's --no-triggers leaves, dpkg(1))."""
        states = ("installed", "triggers-awaited", "triggers-pending")
        return self.want in ("install", "hold") and self.flag == "ok" and self.state in states


def parse_dpkg_status(texts: Iterable[str]) -> dict[str, DpkgEntry]:
    """name -> entry for every stanza with a package name and a three-word Status, the later
    texts winning (the status file, then the journal files of /var/lib/dpkg/updates/ in order)."""
    out: dict[str, DpkgEntry] = {}
    for text in texts:
        for stanza in text.split("\n\n"):
            fields = {m.group(1): m.group(2).strip() for m in _FIELD.finditer(stanza)}
            status = fields.get("Status", "").split()
            name = fields.get("Package")
            if name and len(status) == 3:
                # "Source: nvidia-graphics-drivers (550.163.01-2)" when the versions differ
                source = fields.get("Source", "").split(" ")[0] or name
                want, flag, state = status
                out[name] = DpkgEntry(name, want, flag, state, fields.get("Version", ""), source)
    return out


def driver_packages(entries: Mapping[str, DpkgEntry], named: Iterable[str] = ()) -> dict[str, str]:
    """name -> version of every installed binary of the driver's source packages: the sources of
    the `named` packages that are installed (the resolution's), or, with none named, every
    source DRIVER_SOURCE matches. Sorted by name."""
    sources = {entries[n].source for n in named if n in entries and entries[n].configured}
    if not sources:
        sources = {e.source for e in entries.values() if DRIVER_SOURCE.match(e.source)}
    return {
        e.name: e.version
        for e in sorted(entries.values(), key=lambda e: e.name)
        if e.configured and e.source in sources
    }


def parse_pins(text: str) -> dict[str, str]:
    """name -> version of each apt_preferences(5) stanza that pins one package to one exact
    version (`Package: NAME`, `Pin: version V`); other stanzas are not a hold and are left out."""
    out: dict[str, str] = {}
    for stanza in re.split(r"\n[ \t]*\n", text):
        fields = {m.group(1): m.group(2).strip() for m in _FIELD.finditer(stanza)}
        names = fields.get("Package", "").split()
        pin = re.fullmatch(r"version[ \t]+(\S+)", fields.get("Pin", ""))
        if len(names) == 1 and pin and "*" not in pin.group(1):
            out[names[0]] = pin.group(1)
    return out
