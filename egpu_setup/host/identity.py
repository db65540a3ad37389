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
