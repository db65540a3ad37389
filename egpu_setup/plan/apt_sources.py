"""apt's package sources as apt reads them: one-line and deb822 files, read through the Host."""

from __future__ import annotations

import re
from dataclasses import dataclass

from egpu_setup.host.machine import Host

SOURCES_DIR = "/etc/apt/sources.list.d"


KEYRINGS_DIR = "/etc/apt/keyrings"  # admin-managed keys, APT >= 2.4 (sources.list(5))


@dataclass(frozen=True)
class AptSource:
    """One source entry as apt sees it (both formats)."""

    path: str
    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None  # the whole value: a path, fingerprints, or an inline key block

    @property
    def signed_by_path(self) -> str | None:
        """The keyring file Signed-By names, or None (no Signed-By, fingerprints, inline key)."""
        value = (self.signed_by or "").strip()
        if value.startswith("/") and "\n" not in value and " " not in value:
            return value
        return None

    @property
    def inline_key(self) -> bool:
        """Signed-By holds the key itself (deb822 multi-line value; PPAs written by apt 2.4+)."""
        return "BEGIN PGP" in (self.signed_by or "") or "\n" in (self.signed_by or "").strip()


def parse_deb822_sources(text: str, path: str) -> list[AptSource]:
    out: list[AptSource] = []
    for stanza in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
                continue
            if ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if not fields.get("uris") or fields.get("enabled", "yes").lower() == "no":
            continue
        out.append(
            AptSource(
                path,
                tuple(fields.get("types", "deb").split()),
                tuple(fields["uris"].split()),
                tuple(fields.get("suites", "").split()),
                tuple(fields.get("components", "").split()),
                fields.get("signed-by", "").strip() or None,
            )
        )
    return out


def parse_one_line_sources(text: str, path: str) -> list[AptSource]:
    out: list[AptSource] = []
    for line in text.splitlines():
        m = re.match(r"^\s*(deb|deb-src)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = dict(o.split("=", 1) for o in (m.group(2) or "").split() if "=" in o)
        out.append(
            AptSource(
                path,
                (m.group(1),),
                (m.group(3),),
                (m.group(4),),
                tuple(m.group(5).split()),
                opts.get("signed-by"),
            )
        )
    return out


def apt_sources(host: Host) -> list[AptSource]:
    sources: list[AptSource] = []
    main = host.read("/etc/apt/sources.list")
    if main:
        sources += parse_one_line_sources(main, "/etc/apt/sources.list")
    for path in host.glob(SOURCES_DIR, "*.list"):
        sources += parse_one_line_sources(host.read(path) or "", path)
    for path in host.glob(SOURCES_DIR, "*.sources"):
        sources += parse_deb822_sources(host.read(path) or "", path)
    return sources
