"""A third-party apt key, trusted only when it is exactly the pinned fingerprint.

Downloaded to memory, its fingerprint compared with the pin (`gpg --show-keys`, in a throw-away
GNUPGHOME) before anything is written; it is then written for Signed-By, never to apt-key or
/etc/apt/trusted.gpg.d, where a key is trusted for every repository.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from egpu_setup.errors import EgpuSetupError
from egpu_setup.host.machine import LiveHost

KEY_MAX_BYTES = 1024 * 1024


def fetch_verified_key(url: str, fingerprint: str) -> bytes:
    """Download a repository key and return it as a binary keyring, iff it is exactly the pin."""
    data = _download(url)
    want = fingerprint.replace(" ", "").upper()
    with tempfile.TemporaryDirectory(prefix="egpu-setup-gpg-") as home:
        os.chmod(home, 0o700)
        src = Path(home) / "key"
        src.write_bytes(data)
        got = _gpg(home, ["--show-keys", "--with-colons", str(src)])
        fprs = [
            line.split(":")[9]
            for i, line in enumerate(got.splitlines())
            if line.startswith("fpr:") and i > 0 and got.splitlines()[i - 1].startswith("pub:")
        ]
        if fprs != [want]:
            raise EgpuSetupError(
                f"the apt key at {url} has fingerprint {', '.join(fprs) or 'none'}, "
                f"not the pinned {want}: nothing was added",
                "NVIDIA rotates keys (it did in 2022): update egpu-setup's matrix data, "
                "or report it if the pin is current",
            )
        out = Path(home) / "keyring.gpg"
        if data.lstrip().startswith(b"-----BEGIN"):  # armored: apt wants .gpg binary here
            _gpg(home, ["--dearmor", "-o", str(out), str(src)])
        else:
            out.write_bytes(data)
        return out.read_bytes()


def _gpg(home: str, args: list[str]) -> str:
    """gpg on this machine (the key is checked here, whatever the target), in `home` only."""
    res = LiveHost().run(["gpg", "--homedir", home, "--batch", "--no-tty", *args], timeout=120)
    if res.rc != 0:
        raise EgpuSetupError(
            f"gpg {' '.join(args[:1])} failed: {res.err.strip()[-300:]}",
            "is this a PGP public key?",
        )
    return res.out


def _download(url: str) -> bytes:
    """At most KEY_MAX_BYTES of `url`, through the one HTTP client egpu-setup has: compat/fetch.py's
    requests session (its retries and User-Agent), its time-outs and its overall deadline."""
    import time

    import requests

    from egpu_setup.compat import fetch

    hint = "check the network, then run again"
    chunks: list[bytes] = []
    size = 0
    try:
        with fetch._session(fetch.RETRIES, fetch.BACKOFF) as session:
            resp = session.get(url, timeout=fetch.TIMEOUT, stream=True)
            if resp.status_code != 200:
                raise EgpuSetupError(
                    f"cannot download the apt key {url}: HTTP {resp.status_code}", hint
                )
            for chunk in fetch._chunks(resp, time.monotonic() + fetch.DEADLINE_S):
                size += len(chunk)
                if size > KEY_MAX_BYTES:
                    raise EgpuSetupError(
                        f"apt key {url} is larger than 1 MiB", "this is not a key file"
                    )
                chunks.append(chunk)
    except requests.exceptions.RequestException as exc:
        raise EgpuSetupError(
            f"cannot download the apt key {url}: {type(exc).__name__}", hint
        ) from exc
    except fetch._Deadline:
        raise EgpuSetupError(
            f"cannot download the apt key {url}: no complete answer within {fetch.DEADLINE_S:g} s",
            hint,
        ) from None
    return b"".join(chunks)
