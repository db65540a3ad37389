"""Root never runs a Python another user can change: verify's child runs as the venv's owner."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import RunCli

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
NOBODY = 65534


@needs_root
def test_a_users_venv_is_verified_as_that_user(cli: RunCli) -> None:
    # pytest's own tmp dirs are 0700 root: nobody could not even reach the venv there
    tmp_path = Path(tempfile.mkdtemp(prefix="egpu-setup-owner-"))
    tmp_path.chmod(0o755)
    try:
        _run_as_nobody(cli, tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_as_nobody(cli: RunCli, tmp_path: Path) -> None:
    venv = tmp_path / "alice-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    record = tmp_path / "record"  # nobody must be able to write the record
    record.mkdir()
    os.chown(record, NOBODY, NOBODY)
    seen = record / "uid"
    python = venv / "bin" / "python"
    # Records who runs it, then is Debian's own Python (the child then finds no torch: fine).
    python.write_text(f'#!/bin/sh\nid -u > {seen}\nexec /usr/bin/python3 "$@"\n')
    python.chmod(0o755)
    for p in (venv, venv / "bin", venv / "pyvenv.cfg", python):
        os.chown(p, NOBODY, NOBODY)
    res = cli(
        "verify", "--device", "cpu", "--quick", "--json", "--venv", str(venv), "--timeout", "60"
    )
    assert seen.read_text().strip() == str(NOBODY), res.stderr
    assert res.returncode == 1  # no torch in that venv: a failed check, not a crash


@needs_root
def test_roots_own_venv_runs_as_root(tmp_path: Path) -> None:
    from egpu_setup.verify.runner import venv_owner

    (tmp_path / "bin").mkdir()
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "bin" / "python").symlink_to("/usr/bin/python3")
    assert venv_owner(str(tmp_path / "bin" / "python")) is None
    os.chown(tmp_path / "pyvenv.cfg", NOBODY, NOBODY)
    assert venv_owner(str(tmp_path / "bin" / "python")) == (NOBODY, NOBODY)
