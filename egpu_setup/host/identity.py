"""Which machine this is, as every install and verify report records it: a hash of /etc/machine-id.

The id itself stays on the machine: machine-id(5) asks to treat it as confidential and to hash
it before it leaves. The hash is what `sha256sum /etc/machine-id` prints (the sha256 of the
file's bytes, newline included), which is also what the Ansible role's `stat` with
`checksum_algorithm: sha256` computes for identity.json, so the two can be compared.
"""

from __future__ import annotations

import hashlib
import re

from egpu_setup.host.machine import Host

MACHINE_ID = "/etc/machine-id"

# machine-id(5): "a single newline-terminated, hexadecimal, 32-character, lowercase ID". An image
# before its first boot holds "uninitialized\n" or nothing; neither names a machine. The role
# hashes only a 33-byte file, which every valid id is.
_VALID_ID = re.compile(rb"[0-9a-f]{32}\n")


def machine_id_sha256(host: Host) -> str | None:
    """sha256 hex of the host's /etc/machine-id (inside the root of a RootHost); None when the
    file is missing, empty, "uninitialized" or not an id."""
    data = host.read_bytes(MACHINE_ID, 64)
    if data is None or not _VALID_ID.fullmatch(data):
        return None
    return hashlib.sha256(data).hexdigest()


def sudo_caller(host: Host) -> tuple[str, int] | None:
    """(SUDO_USER, SUDO_UID) when both are set and name one account: its passwd entry (NSS
    here, the image's /etc/passwd under --root) gives that name that uid. sudo sets both
    (sudo(8), "Environment"), but a root shell reached some other way may carry them stale or
    forged: a name of one account with the uid of another would have pip run, as the name's
    account, in a venv the uid owns. None then, and for uid 0 or a missing one. A recording is
    taken at its word: it is only planned, never executed."""
    name, uid = host.getenv("SUDO_USER"), host.getenv("SUDO_UID")
    if not name or not uid or not uid.isdigit() or int(uid) == 0:
        return None
    if host.kind == "recorded":
        return name, int(uid)
    if host.kind == "live":
        import pwd

        try:
            known = pwd.getpwnam(name).pw_uid
        except KeyError:
            return None
    else:
        entries = (line.split(":") for line in (host.read("/etc/passwd") or "").splitlines())
        known = next(
            (int(f[2]) for f in entries if len(f) >= 3 and f[0] == name and f[2].isdigit()), -1
        )
    return (name, int(uid)) if known == int(uid) else None
