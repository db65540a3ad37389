"""Hostile: nothing in a bundle is trusted until its manifest matches the pin the admin carried.

Was: swap a wheel, re-hash it into manifest.json, and `install --bundle` said "verified" (and the
bundle's apt repository went in as `Trusted: yes` on the same basis). Now `bundle` prints the
sha256 of manifest.json, and `install --bundle` refuses to read anything else of a bundle whose
manifest does not hash to the `--bundle-sha256` it was given, or when it was given none.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO
from helpers.sentinel import TB4, clean_error

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bundle(base: Path, wheel: bytes) -> tuple[Path, str]:
    """A bundle holding one wheel and the profile, and the pin `bundle` would have printed."""
    b = base / "bundle"
    (b / "wheels/py3.11").mkdir(parents=True)
    rel = "wheels/py3.11/filelock-3.0-py3-none-any.whl"
    (b / rel).write_bytes(wheel)
    profile = (REPO / "profiles" / "rtx4090.yaml").read_bytes()
    (b / "profile.yaml").write_bytes(profile)
    files = [
        {"path": rel, "size": len(wheel), "sha256": _sha(wheel)},
        {"path": "profile.yaml", "size": len(profile), "sha256": _sha(profile)},
    ]
    _write_manifest(b, files)
    pin = _sha((b / "manifest.json").read_bytes())
    (b / "manifest.sha256").write_text(f"{pin}  manifest.json\n")
    return b, pin


def _write_manifest(b: Path, files: list[dict[str, object]]) -> None:
    doc = {"schema": "egpu-setup/bundle/1", "targets": [], "files": files}
    (b / "manifest.json").write_text(json.dumps(doc, indent=1))


def _install(cli: Cli, b: Path, *pin: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "install", "--bundle", str(b), *pin, "--only", "torch", "--dry-run", "--from", str(TB4),
    )  # fmt: skip


def test_a_swapped_wheel_with_a_rehashed_manifest_is_refused(cli: Cli, tmp_path: Path) -> None:
    b, pin = _bundle(tmp_path, b"the real wheel")
    evil = b"a wheel whose setup runs as root"
    rel = "wheels/py3.11/filelock-3.0-py3-none-any.whl"
    (b / rel).write_bytes(evil)
    files = json.loads((b / "manifest.json").read_text())["files"]
    files[0].update(size=len(evil), sha256=_sha(evil))  # the attacker re-hashes the manifest
    _write_manifest(b, files)
    forged = _sha((b / "manifest.json").read_bytes())
    (b / "manifest.sha256").write_text(f"{forged}  manifest.json\n")  # and its pin file
    res = _install(cli, b, "--bundle-sha256", pin)
    assert res.returncode == 1, res.stderr
    clean_error(res)
    assert f"has sha256 {forged}, not the pinned {pin}" in res.stderr
    assert "verified" not in res.stdout + res.stderr


def test_a_bundle_without_a_pin_is_refused_even_with_its_own_pin_file(
    cli: Cli, tmp_path: Path
) -> None:
    b, _pin = _bundle(tmp_path, b"the real wheel")
    res = _install(cli, b)
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert "nothing vouches for this bundle" in res.stderr
    assert "never from the bundle itself" in res.stderr


@pytest.mark.parametrize("pin", ["abc", "g" * 64, "0" * 63])
def test_a_malformed_pin_is_bad_input(cli: Cli, tmp_path: Path, pin: str) -> None:
    b, _ = _bundle(tmp_path, b"the real wheel")
    res = _install(cli, b, "--bundle-sha256", pin)
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert "expected the 64 hex digits" in res.stderr


def test_the_right_pin_lets_the_bundle_through(cli: Cli, tmp_path: Path) -> None:
    """The control: the same bundle, untouched, passes the pin (its empty targets then stop it)."""
    b, pin = _bundle(tmp_path, b"the real wheel")
    res = _install(cli, b, "--bundle-sha256", pin.upper())
    assert "not the pinned" not in res.stderr and "nothing vouches" not in res.stderr
    assert "has no target" in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("manifest", "says"),
    [
        ("[1, 2]", "schema None, expected egpu-setup/bundle/1"),
        ('{"schema": "egpu-setup/bundle/1", "targets": [], "files": "x"}', "files: expected a list"),
        ('{"schema": "egpu-setup/bundle/1", "targets": [], "files": ["x"]}', "files[0]: expected an object"),
        ('{"schema": "egpu-setup/bundle/1", "targets": [], "files": [{"path": "../../etc/shadow", '
         '"size": 1, "sha256": "00"}]}', "'../../etc/shadow' leaves the bundle"),
        ('{"schema": "egpu-setup/bundle/1", "targets": "x", "files": []}', "targets: expected a list"),
        ("not json", "not a bundle manifest"),
        ("[" * 100_000 + "]" * 100_000, "not a bundle manifest"),
    ],
    ids=["a-list", "files-a-string", "entry-a-string", "path-out", "targets-a-string",
         "not-json", "nested-deep"],
)  # fmt: skip
def test_a_pinned_manifest_of_the_wrong_shape_is_bad_input(
    cli: Cli, tmp_path: Path, manifest: str, says: str
) -> None:
    """The pin proves who built the manifest, not that its builder was sane: its shape is
    still checked, each wrong one an error naming where, never an internal error."""
    b, _ = _bundle(tmp_path, b"the real wheel")
    (b / "manifest.json").write_text(manifest)
    res = _install(cli, b, "--bundle-sha256", _sha(manifest.encode()))
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert says in res.stderr
