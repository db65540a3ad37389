"""The apt key download goes through compat/fetch.py's requests session (its User-Agent, its
retries), bounded in size; every failure is an EgpuSetupError with a hint, nothing written.
The fingerprint check itself is tested in test_execute.py."""

from __future__ import annotations

import http.server
import shutil
import socket
from pathlib import Path

import pytest

from egpu_setup.errors import EgpuSetupError
from egpu_setup.execute import apt_key
from helpers.loopback import LoopbackServer


def _key(tmp_path: Path) -> tuple[bytes, str]:
    import subprocess

    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--no-tty"]
    subprocess.run(
        [*gpg, "--passphrase", "", "--quick-gen-key", "t <t@example.invalid>", "ed25519", "sign"],
        check=True,
        capture_output=True,
    )
    out = subprocess.run([*gpg, "--with-colons", "--list-keys"], capture_output=True, text=True)
    fpr = next(line.split(":")[9] for line in out.stdout.splitlines() if line.startswith("fpr:"))
    armored = subprocess.run(
        [*gpg, "--armor", "--export", fpr], check=True, capture_output=True
    ).stdout
    return armored, fpr


@pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg not installed")
def test_the_key_comes_through_the_requests_session(tmp_path: Path) -> None:
    armored, fpr = _key(tmp_path)
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "repo.asc").write_bytes(armored)
    with LoopbackServer(root=tmp_path / "srv") as srv:
        keyring = apt_key.fetch_verified_key(f"{srv.url}repo.asc", fpr)
        [request] = srv.requests
    assert keyring and not keyring.startswith(b"-----BEGIN")  # dearmored for Signed-By
    assert request["user-agent"].startswith("egpu-setup/")  # the session's, not urllib's


def test_a_key_larger_than_a_mib_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.asc").write_bytes(b"x" * (apt_key.KEY_MAX_BYTES + 1))
    with (
        LoopbackServer(root=tmp_path) as srv,
        pytest.raises(EgpuSetupError, match="larger than 1 MiB") as err,
    ):
        apt_key.fetch_verified_key(f"{srv.url}big.asc", "0" * 40)
    assert err.value.hint


def test_an_http_error_is_named(tmp_path: Path) -> None:
    with (
        LoopbackServer(root=tmp_path) as srv,
        pytest.raises(EgpuSetupError, match="HTTP 404") as err,
    ):
        apt_key.fetch_verified_key(f"{srv.url}missing.asc", "0" * 40)
    assert "network" in (err.value.hint or "")


def test_a_server_that_is_not_there_is_an_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("egpu_setup.compat.fetch.RETRIES", 0)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EgpuSetupError, match="cannot download the apt key") as err:
        apt_key.fetch_verified_key(f"http://127.0.0.1:{port}/k.asc", "0" * 40)
    assert "ConnectionError" in err.value.message


def test_a_server_that_answers_garbage_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("egpu_setup.compat.fetch.RETRIES", 0)

    def garbage(handler: http.server.BaseHTTPRequestHandler) -> bool:
        handler.wfile.write(b"NOT HTTP AT ALL\r\n\r\n")
        handler.close_connection = True
        return True

    with (
        LoopbackServer(respond=garbage) as srv,
        pytest.raises(EgpuSetupError, match="cannot download the apt key"),
    ):
        apt_key.fetch_verified_key(f"{srv.url}k.asc", "0" * 40)
