"""Reproducible labs: a profile pins torch and the driver exactly; the shipped
snapshot decides unless a run asks for `--matrix updated`; `matrix update` shows the drift and
never changes a pinned choice; the plan, `resolve --json` and the install report say which
matrix decided.

The refreshed matrix is the recorded PyTorch index page of tests/helpers/torch_index.py (it adds torch
2.15.1 and drops 2.9.1+cu129), read through the same parser `matrix update` uses, and served by
its 127.0.0.1 server where the command itself runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.compat.fetch import parse_index
from egpu_setup.compat.matrix import Matrix, apply_overlay, load_snapshot, select_matrix
from egpu_setup.errors import MatrixError, UsageError
from egpu_setup.profile.load import load_file
from egpu_setup.resolve.constraints import Constraints, constraints_from_profile
from egpu_setup.resolve.drift import drift
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.resolve.resolver import resolve
from helpers.torch_index import PAGES, IndexServer

GPU: dict[str, Any] = {
    "gpu": "2684",
    "distro": "ubuntu-24.04",
    "python": "3.12",
}  # an RTX 4090 on noble


@pytest.fixture(scope="module")
def updated() -> Matrix:  # the snapshot plus the recorded index page, as `matrix update` caches it
    releases = parse_index((PAGES / "good.html").read_text())
    overlay = {"fetched_at": "2026-12-01T09:00:00+00:00", "index_url": "http://127.0.0.1/whl/",
               "releases": releases}  # fmt: skip
    return apply_overlay(load_snapshot(), overlay)


def lab_profile(tmp_path: Path, body: str, name: str = "lab") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nextends: rtx4090\n{body}")
    return path


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True, text=True, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip


# -- which matrix decides --------------------------------------------------------------------------


def test_the_shipped_snapshot_decides_unless_the_updated_one_is_asked_for(
    updated: Matrix,
) -> None:
    c = Constraints(**GPU)
    shipped = resolve(None, None, c)  # no matrix given: the snapshot, whatever is cached
    assert shipped.matrix is not None
    assert (
        shipped.matrix.source == "shipped" and shipped.matrix.snapshot == load_snapshot().snapshot
    )
    assert shipped.to_json()["matrix"] == {
        "source": "shipped", "snapshot": load_snapshot().snapshot, "fetched_at": None,
        "index_url": None,
    }  # fmt: skip
    fresh = resolve(None, None, c, updated)
    assert fresh.matrix is not None
    assert (fresh.torch.version, fresh.matrix.source) == ("2.15.1", "updated")
    assert fresh.matrix.fetched_at == "2026-12-01T09:00:00+00:00"
    assert shipped.torch.version != fresh.torch.version  # the drift a lab must choose to take


def test_matrix_updated_without_an_update_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no usable updated matrix"):
        select_matrix("updated", str(tmp_path))
    res = cli("resolve", "--matrix", "updated", env={"EGPU_SETUP_STATE_DIR": str(tmp_path)})
    assert res.returncode == 2 and "error: --matrix updated: no usable updated matrix" in res.stderr
    res = cli("bundle", "--profile", "rtx4090", "--out", str(tmp_path / "b"), "--matrix",
              "updated", env={"EGPU_SETUP_STATE_DIR": str(tmp_path)})  # fmt: skip
    assert res.returncode == 2 and "no usable updated matrix" in res.stderr
    assert not (tmp_path / "b").exists()


# -- pins ------------------------------------------------------------------------------------------


def test_a_torch_pin_holds_in_both_matrices(tmp_path: Path, updated: Matrix) -> None:
    profile = load_file(lab_profile(tmp_path, 'torch:\n  pin: "2.9.1+cu128"\n'))
    assert profile.torch.pin == "2.9.1+cu128" and profile.to_json()["torch"]["pin"] == "2.9.1+cu128"
    c = constraints_from_profile(profile, **GPU)
    for m in (load_snapshot(), updated):
        r = resolve(None, profile, c, m)
        assert (r.torch.version, r.torch.variant, r.torch_pin) == ("2.9.1", "cu128", "2.9.1+cu128")
        assert r.to_json()["pinned"] == {"torch": "2.9.1+cu128", "driver": None}
        assert any("pinned by the profile (torch.pin)" in why for why in r.reasons)
    d = drift("lab", None, profile, c, load_snapshot(), updated)
    assert not d.changed and d.pins == ("torch.pin 2.9.1+cu128",)
    assert d.text() == (
        "lab (torch.pin 2.9.1+cu128): unchanged, torch 2.9.1+cu128, driver install branch 580"
    )


def test_a_pin_the_refreshed_index_no_longer_carries_is_said(
    tmp_path: Path, updated: Matrix
) -> None:
    """The recorded index lacks 2.9.1+cu129: the pin stays what it is, the drift says the
    refreshed matrix refuses it, and nothing else is chosen instead."""
    profile = load_file(lab_profile(tmp_path, 'torch:\n  pin: "2.9.1+cu129"\n'))
    c = constraints_from_profile(profile, **GPU)
    assert resolve(None, profile, c).torch.variant == "cu129"
    with pytest.raises(MatrixError, match=r"the profile pins torch.pin 2.9.1\+cu129"):
        resolve(None, profile, c, updated)
    d = drift("lab", None, profile, c, load_snapshot(), updated)
    assert d.changed and d.updated.torch is None and d.updated.error is not None
    assert "torch.pin 2.9.1+cu129" in d.updated.error


def test_a_pin_that_does_not_fit_is_refused_not_replaced(tmp_path: Path) -> None:
    profile = load_file(lab_profile(tmp_path, 'torch:\n  pin: "2.9.1+cu128"\n'))
    c = constraints_from_profile(profile, **{**GPU, "python": "3.15"})
    with pytest.raises(MatrixError) as exc:
        resolve(None, profile, c)
    assert exc.value.message.startswith(
        "the profile pins torch.pin 2.9.1+cu128, which does not fit"
    )
    assert exc.value.hint is not None
    assert exc.value.hint.endswith("or change the pin in the profile")


def test_a_flag_may_restate_a_pin_never_change_it(tmp_path: Path) -> None:
    path = lab_profile(tmp_path, 'torch:\n  pin: "2.9.1+cu128"\ndriver:\n  pin: "580.159.03"\n')
    profile = load_file(path)
    constraints_from_profile(profile, torch_spec="2.9.1", cuda="cu128", driver_branch=580)
    res = cli("resolve", "--profile", str(path), "--cuda", "cu130", *_what_if())
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == [
        "error: --cuda cu130: the profile pins 2.9.1+cu128 (torch.pin); a flag cannot change a pin",
        "hint: leave --cuda out, or change torch.pin in the profile (then every laptop gets it)",
    ]
    res = cli("resolve", "--profile", str(path), "--driver-branch", "595", *_what_if())
    assert res.returncode == 2 and "the profile pins 580.159.03 (driver.pin)" in res.stderr


def _what_if() -> tuple[str, ...]:
    return ("--gpu", GPU["gpu"], "--distro", GPU["distro"], "--python", GPU["python"])


def test_a_driver_pin_is_exact(tmp_path: Path) -> None:
    """noble's archive gives 580.159.03 for branch 580 (distros.yaml): that pin is installed
    from it; an installed pinned driver is kept even where a newer branch would run a newer
    torch; a pin no source gives exactly is refused, naming what the archive has."""
    exact = load_file(lab_profile(tmp_path, 'driver:\n  pin: "580.159.03"\n', "exact"))
    r = resolve(None, exact, constraints_from_profile(exact, **GPU))
    assert (r.driver.action, r.driver.branch, r.driver.source) == ("install", 580, "distro")
    assert r.driver_pin == "580.159.03" and "(pinned: driver.pin 580.159.03)" in _text(r)

    # 550 is installed: unpinned it stays, the pin replaces it with exactly the pinned one
    assert resolve(None, None, Constraints(**GPU, driver="550.163.01")).driver.action == "keep"
    moved = resolve(None, exact, constraints_from_profile(exact, **GPU, driver="550.163.01"))
    assert (moved.driver.action, moved.driver.branch) == ("upgrade", 580)
    old = load_file(lab_profile(tmp_path, 'driver:\n  pin: "550.163.01"\n', "old"))
    kept = resolve(None, old, constraints_from_profile(old, **GPU, driver="550.163.01"))
    assert (kept.driver.action, kept.driver.installed) == ("keep", "550.163.01")

    other = load_file(lab_profile(tmp_path, 'driver:\n  pin: "580.95.05"\n', "other"))
    with pytest.raises(MatrixError) as exc:
        resolve(None, other, constraints_from_profile(other, **GPU, driver="550.163.01"))
    assert exc.value.message.startswith(
        "the profile pins driver 580.95.05 (driver.pin), and no source installs exactly it here: "
        "ubuntu-24.04's archive has 580.159.03 for branch 580"
    )


def _text(r: Resolution) -> str:
    from egpu_setup.resolve.resolution import format_resolution

    return format_resolution(r)


@pytest.mark.parametrize(
    ("body", "where", "why"),
    [
        ('torch:\n  pin: "2.9.1+cu128"\n  spec: "==2.9.1"\n', "torch.spec",
         "torch.pin 2.9.1+cu128 already fixes the release and variant"),
        ('torch:\n  pin: "2.9.1"\n', "torch.pin", 'invalid value "2.9.1"'),
        ('driver:\n  pin: "520.61.05"\n', "driver.pin",
         "driver 520.61.05 is outside min_branch 525"),
        ('driver:\n  pin: 580.95\n', "driver.pin", "string"),
    ],
)  # fmt: skip
def test_bad_pins_are_refused_with_their_place(
    tmp_path: Path, body: str, where: str, why: str
) -> None:
    path = lab_profile(tmp_path, body)
    res = cli("profiles", "check", str(path))
    assert res.returncode == 2, res.stdout
    assert f"{path}:" in res.stderr and where in res.stderr and why in res.stderr, res.stderr


# -- what install and `matrix update` say ----------------------------------------------------------


def test_the_plan_says_which_matrix_decided(tmp_path: Path) -> None:
    env = {"EGPU_SETUP_STATE_DIR": str(tmp_path / "state")}
    args = ("install", "--profile", "rtx4090", "--dry-run", "--only", "torch", "--cuda", "cpu")
    text = cli(*args, env=env)
    assert text.returncode == 0, text.stderr
    assert f"Matrix   shipped snapshot of {load_snapshot().snapshot}" in text.stdout.splitlines()
    plan = json.loads(cli(*args, "--json", env=env).stdout)
    assert plan["matrix"]["source"] == "shipped" and plan["pinned"] == {
        "torch": None,
        "driver": None,
    }


def test_matrix_update_shows_drift_and_never_moves_a_pin(tmp_path: Path) -> None:
    """The command itself, against the recorded index on 127.0.0.1: the overlay is written, the
    drift is printed for this machine, a pinned profile is unchanged, and the next install
    still decides with the shipped snapshot until it asks for the update."""
    pinned = lab_profile(tmp_path, 'torch:\n  pin: "2.9.1+cpu"\n')
    env = {"EGPU_SETUP_STATE_DIR": str(tmp_path / "state")}
    server = IndexServer()
    try:
        res = cli("matrix", "update", "--index-url", server.url, "--profile", str(pinned),
                  "--json", env=env)  # fmt: skip
        plain = cli("matrix", "update", "--index-url", server.url, env=env)
    finally:
        server.close()
    assert res.returncode == 0, res.stderr
    (lab,) = json.loads(res.stdout)["drift"]
    assert (lab["name"], lab["changed"], lab["pins"]) == ("lab", False, ["torch.pin 2.9.1+cpu"])
    assert lab["shipped"]["torch"] == lab["updated"]["torch"] == "2.9.1+cpu"
    assert plain.returncode == 0, plain.stderr
    assert "installs still decide with the shipped snapshot" in plain.stdout
    # this machine has no GPU: the CPU wheel it would get moves to the release the index adds
    assert "no profile: torch 2.15.0+cpu" in plain.stdout and "-> torch 2.15.1+cpu" in plain.stdout

    args = ("install", "--profile", "rtx4090", "--dry-run", "--json", "--only", "torch",
            "--cuda", "cpu")  # fmt: skip
    before = json.loads(cli(*args, env=env).stdout)
    after = json.loads(cli(*args, "--matrix", "updated", env=env).stdout)
    assert (before["torch"]["version"], before["matrix"]["source"]) == ("2.15.0", "shipped")
    assert (after["torch"]["version"], after["matrix"]["source"]) == ("2.15.1", "updated")
    assert after["matrix"]["index_url"] == server.url
