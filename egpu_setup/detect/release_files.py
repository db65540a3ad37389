"""What os-release does not say, from the other release files, by the `distro` package.

os-release(5) leaves out what many systems know only elsewhere: Debian testing has no VERSION_ID
(/etc/debian_version says "bookworm/sid"), Gentoo's is in /etc/gentoo-release ("Gentoo Base System
release 2.2"), CentOS 5 and RHEL 6 have no os-release at all ("CentOS release 5.11 (Final)" in
/etc/centos-release). python-distro knows these files and their layouts
(https://distro.readthedocs.io/en/latest/#data-sources); this module hands it copies.

distro is pointed at a private temporary directory, never at the machine's or an image's own
tree: with `root_dir=IMAGE` it opens IMAGE/etc/os-release with the kernel's link resolution, so a
link in an image (etc/os-release -> /usr/lib/os-release) reports the build machine's distribution,
and a planted link (etc/centos-release -> /etc/shadow) reads a file of this machine. The copies
are read through the Host, whose links resolve inside its root, as regular files only and capped
in size; distro sees plain files it cannot be misled by. The subprocess sources (lsb_release,
uname, oslevel) stay off: they would describe the machine egpu-setup runs on, not the tree.

/etc/lsb-release has a parser here too: distro reads LSB data only by running `lsb_release`.
"""

from __future__ import annotations

import os
import re

from egpu_setup.detect.osrelease import parse_os_release
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

log = get_logger("egpu_setup")

# The /etc names distro considers a distribution's release file (distro.py,
# _DISTRO_RELEASE_BASENAME_PATTERN) plus debian_version, which it reads for Debian-like systems.
_RELEASE_NAME = re.compile(r"\w+[-_](?:release|version)\Z")
# distro reads a release file's first line only; a real one is under 200 bytes.
_RELEASE_LIMIT = 64 * 1024
# /etc of a real system holds a handful of these (mageia5's has 7); a planted /etc may hold
# thousands, and each would be copied.
_MAX_RELEASE_FILES = 64
# The OsFacts keys, in os-release(5) spelling, distro can supply.
KEYS = ("ID", "VERSION_ID", "VERSION_CODENAME", "PRETTY_NAME", "ID_LIKE")


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


def _shell_quote(value: str) -> str:
    """A double-quoted os-release value that distro's shlex reads back as `value` (POSIX shlex
    escapes only backslash and the double quote inside double quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _os_release_text(keys: dict[str, str]) -> str:
    """`keys` (already parsed by detect/osrelease.py) as a canonical os-release file: distro's
    shlex raises on an unterminated quote that our parser reads past, and both must agree."""
    return "".join(
        f"{k}={_shell_quote(v)}\n" for k, v in keys.items() if re.fullmatch(r"[A-Z_][A-Z0-9_]*", k)
    )


def copy_release_files(host: Host, os_release: dict[str, str], dest: str) -> list[str]:
    """Write into `dest`/etc what distro reads: `os_release` as a clean os-release file, the
    first line of each release file of the host's /etc (read through the Host), and
    debian_version. Returns the names copied."""
    etc = os.path.join(dest, "etc")
    os.mkdir(etc, 0o700)
    copied: list[str] = []
    if os_release:
        _write(etc, "os-release", _os_release_text(os_release))
        copied.append("os-release")
    names = [n for n in host.listdir("/etc") if _RELEASE_NAME.match(n) and n != "os-release"]
    if len(names) > _MAX_RELEASE_FILES:
        log.debug(
            "/etc holds %d release files: reading the first %d", len(names), _MAX_RELEASE_FILES
        )
    for name in names[:_MAX_RELEASE_FILES]:
        text = host.read(f"/etc/{name}", _RELEASE_LIMIT)
        if text is None:
            continue  # a link out of the root, a directory, a FIFO, binary content
        first = text.splitlines()[0] if text.strip() else ""
        if name == "debian_version":
            # distro opens it as ASCII and would raise on any other byte
            first = first.encode("ascii", "replace").decode("ascii")
        _write(etc, name, first + "\n" if first else "")
        copied.append(name)
    return copied


def _write(etc: str, name: str, text: str) -> None:
    fd = os.open(
        os.path.join(etc, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
    )
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def distro_release(host: Host, os_release: dict[str, str]) -> dict[str, str]:
    """os-release keys as distro answers them for the host's release files; `os_release` is
    what detect parsed from the host's os-release ({} when it has none). Keys distro leaves
    empty are absent."""
    import tempfile

    import distro

    with tempfile.TemporaryDirectory(prefix="egpu-setup-release-") as tmp:
        copy_release_files(host, os_release, tmp)
        info = distro.LinuxDistribution(
            root_dir=tmp, include_lsb=False, include_uname=False, include_oslevel=False
        )
        try:
            out = {
                "ID": info.id(),
                "VERSION_ID": info.version(),
                "VERSION_CODENAME": info.codename(),
                "PRETTY_NAME": info.name(pretty=True),
                "ID_LIKE": info.like(),
            }
        except (OSError, ValueError) as exc:
            # the copies are plain UTF-8 text, so this is distro failing on a content it does
            # not expect: the facts stay unknown, detection goes on
            log.debug("distro could not read the release files: %s", exc)
            return {}
    return {k: v for k, v in out.items() if v}
