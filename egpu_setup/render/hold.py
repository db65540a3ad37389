"""The driver hold's two drop-ins (profile `driver.hold`, `install --hold-driver`): an apt
preferences pin of each driver package's exact version, and the same names for
unattended-upgrades' Package-Blacklist. Rendered at install time from dpkg's status after the
driver's apt step (execute/hold.py), each name and version checked before a template sees it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from egpu_setup.detect.dpkg_status import HOLD_PIN, HOLD_UNATTENDED
from egpu_setup.errors import EgpuSetupError
from egpu_setup.render.files import render_template
from egpu_setup.render.headers import add_header

# Debian Policy 5.6.1 (package names: lowercase letters, digits, + - .), with dpkg's ":arch"
# qualifier; 5.6.12 (versions: [epoch:]upstream[-revision] of letters, digits and . + ~ - :).
_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?$")
_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:-]*$")


def hold_files(
    packages: Mapping[str, str], profile: str, mode: str, *, release: bool = False
) -> list[tuple[str, str, str]]:
    """(path, content, purpose) of the pin file and the unattended-upgrades drop-in holding each
    of `packages` (name -> version) at its version; EgpuSetupError for a name or version that is
    not dpkg's, or for none at all unless `release` (both files holding nothing)."""
    if not packages and not release:
        raise EgpuSetupError(
            "no NVIDIA driver package is installed to hold (dpkg's status lists none)",
            "install the driver first (`egpu-setup install --only driver`), or run without "
            "--hold-driver",
        )
    for name, version in packages.items():
        if not _NAME.match(name) or not _VERSION.match(version):
            raise EgpuSetupError(
                f"dpkg's status names a driver package {name!r} at version {version!r}, which "
                "is not a Debian package name and version: nothing is held",
                "check /var/lib/dpkg/status (`dpkg -s " + name.split(":")[0] + "`)",
            )
    pairs = sorted(packages.items())
    names = sorted({name.split(":")[0] for name, _ in pairs})
    pin = render_template("apt/99egpu-setup-driver.j2", packages=pairs)
    patterns = ["^" + re.sub(r"([+.])", r"\\\1", n) + "$" for n in names]
    unattended = render_template("apt/99egpu-setup-driver-hold.j2", patterns=patterns)
    return [
        (
            HOLD_PIN,
            add_header(pin, profile, mode),
            "apt pin: the NVIDIA driver packages stay at the versions installed",
        ),
        (
            HOLD_UNATTENDED,
            add_header(unattended, profile, mode),
            "unattended-upgrades: never upgrade the held NVIDIA driver packages",
        ),
    ]
