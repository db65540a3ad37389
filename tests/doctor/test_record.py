"""`record` writes a bundle that `detect --from` reads back to the same facts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES
from egpu_setup.detect.facts import HostFacts
from egpu_setup.detect.probe import detect_host
from egpu_setup.doctor.record import record
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import LiveHost, RecordedHost
from egpu_setup.state.output import OutputTree
from helpers.cli_runner import invoke

HOSTS = (
    sorted(p.name for p in FIXTURES.iterdir() if (p / "root").is_dir()) if FIXTURES.is_dir() else []
)


def same_facts(a: HostFacts, b: HostFacts) -> None:
    assert replace(a, source="x").to_json() == replace(b, source="x").to_json()


def test_recording_this_machine_reproduces_live_detection(tmp_path: Path) -> None:
    live = LiveHost()
    out = record(live, tmp_path / "bundle")
    same_facts(detect_host(live), detect_host(RecordedHost(out)))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tool"] == "egpu-setup" and meta["uname"]["release"]


@pytest.mark.parametrize("name", HOSTS)
def test_rerecording_a_bundle_keeps_every_fact(name: str, tmp_path: Path) -> None:
    source = RecordedHost(FIXTURES / name)
    copy = record(source, tmp_path / "copy", redact=False)
    same_facts(detect_host(source), detect_host(RecordedHost(copy)))


def test_redaction_replaces_ids_consistently(tmp_path: Path) -> None:
    source = RecordedHost(FIXTURES / "tb4-rtx4090-ubuntu2404")
    facts = detect_host(source)
    red = detect_host(RecordedHost(record(source, tmp_path / "red")))
    real_ids = {d.unique_id for d in facts.thunderbolt.devices}
    red_ids = {d.unique_id for d in red.thunderbolt.devices}
    assert real_ids and red_ids and not (real_ids & red_ids)
    # The stand-in is the same in sysfs and in boltctl text, so the stored policy still matches.
    assert [d.policy for d in red.thunderbolt.devices] == [
        d.policy for d in facts.thunderbolt.devices
    ]
    stripped = [replace(d, unique_id=None) for d in red.thunderbolt.devices]
    assert stripped == [replace(d, unique_id=None) for d in facts.thunderbolt.devices]
    text = "".join(
        p.read_text(errors="replace") for p in (tmp_path / "red").rglob("*") if p.is_file()
    )
    assert all(uid is not None and uid not in text for uid in real_ids)


def test_record_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("mine")
    with pytest.raises(UsageError):
        record(LiveHost(), tmp_path / "x")
    assert (tmp_path / "x" / "keep").read_text() == "mine"


def test_record_cli(tmp_path: Path) -> None:
    res = invoke("record", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    again = invoke("detect", "--json", "--from", str(tmp_path / "b"))
    assert again.returncode == 0 and json.loads(again.stdout)["schema"] == "egpu-setup/host/1"


def test_record_venv_stores_torch_facts_that_doctor_from_reads(tmp_path: Path) -> None:
    """`record DIR --venv PATH` writes commands/torch.json; `doctor --from DIR` checks it."""
    pytest.importorskip("torch")
    from egpu_setup.doctor.torchcheck import parse_torch_info, probe_venv_torch
    from helpers.venvs import make_venv

    venv = make_venv(tmp_path / "v", with_torch=True)
    res = invoke("record", str(tmp_path / "b"), "--venv", str(venv))
    assert res.returncode == 0, res.stderr
    stored = json.loads((tmp_path / "b" / "commands" / "torch.json").read_text())
    assert parse_torch_info(stored, "torch.json") == probe_venv_torch(LiveHost(), venv)
    doctor = invoke("doctor", "--json", "--from", str(tmp_path / "b"))
    assert doctor.returncode == 1, doctor.stderr
    assert "torch-cpu-only-build" in {f["id"] for f in json.loads(doctor.stdout)["findings"]}


def test_record_venv_without_torch_writes_nothing(tmp_path: Path) -> None:
    import subprocess
    import sys

    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    res = invoke("record", str(tmp_path / "b"), "--venv", str(venv))
    assert res.returncode == 2 and res.stderr.startswith("error: cannot import torch in ")
    assert "hint: " in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "b").exists()


DATA = Path(__file__).resolve().parents[1] / "data" / "doctor"
HOLD_IDS = {"driver-held", "driver-library-mismatch", "driver-hold-removed"}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("dpkg-status-held.txt", {"driver-held"}),
        ("dpkg-status-split.txt", {"driver-library-mismatch"}),
    ],
)
def test_a_recording_carries_dpkg_status_and_the_hold_so_doctor_from_says_what_root_says(
    tmp_path: Path, status: str, expected: set[str]
) -> None:
    from egpu_setup.detect.dpkg_status import HOLD_PIN, HOLD_UNATTENDED
    from egpu_setup.host.machine import RootHost

    root = tmp_path / "machine"
    files = {
        "/var/lib/dpkg/status": (DATA / status).read_text(),
        HOLD_PIN: (DATA / "hold-pin.txt").read_text(),
        HOLD_UNATTENDED: 'Unattended-Upgrade::Package-Blacklist { "^libcuda1$"; };\n',
        "/etc/os-release": 'ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n',
    }
    for path, text in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    out = record(RootHost(root), tmp_path / "rec")
    for path, text in files.items():
        assert (out / "root" / path.lstrip("/")).read_text() == text
    assert json.loads((out / "meta.json").read_text())["truncated"] == []

    def findings(*where: str) -> list[dict[str, Any]]:
        res = invoke("doctor", "--json", *where)
        found = json.loads(res.stdout)["findings"]
        return sorted((f for f in found if f["id"] in HOLD_IDS), key=lambda f: f["id"])

    live = findings("--root", str(root))
    assert {f["id"] for f in live} == expected
    assert findings("--from", str(out)) == live


def test_a_long_dpkg_status_is_cut_after_its_last_whole_stanza(tmp_path: Path) -> None:
    from egpu_setup.doctor import record as rec
    from egpu_setup.host.machine import RootHost

    stanza = "Package: p{}\nStatus: install ok installed\nVersion: 1.0\n\n"
    whole = "".join(stanza.format(i) for i in range(2000))
    (tmp_path / "m/var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "m/var/lib/dpkg/status").write_text(whole)
    limit = len(whole) // 2 + 7  # inside a stanza
    tree = OutputTree.open(tmp_path / "out", what="record")
    writer = rec._Writer(RootHost(tmp_path / "m"), tree, tree.path, rec.Redactor(False))
    assert writer.copy_stanzas("/var/lib/dpkg/status", limit) is True
    kept = (tmp_path / "out/var/lib/dpkg/status").read_text()
    # whole stanzas only: what is kept, and the blank line after it, begin the file
    assert whole.startswith(kept + "\n") and kept.endswith("Version: 1.0\n") and len(kept) <= limit
    assert 900 < kept.count("Package:") < 1100
    assert writer.copy_stanzas("/var/lib/dpkg/status", len(whole)) is False


def test_a_recording_keeps_amds_tools_for_detect(tmp_path: Path) -> None:
    """rocminfo, amd-smi and rocm-smi are recorded by the names and argv detect/rocm.py's
    probes use: the recorded OCuLink RX 7900 XTX host with real amd-smi and rocm-smi pastes
    added is recorded again, and the copy reads the same."""
    import shutil

    from egpu_setup.detect.rocm import probe_amd_smi, probe_rocminfo

    real = FIXTURES.parent.parent / "data" / "real"
    host = tmp_path / "host"
    shutil.copytree(FIXTURES / "oculink-rx7900xtx-debian12", host, symlinks=True)
    for tool, paste in (
        ("amd-smi", "rocm-systems-2987-static-mi350x.txt"),
        ("rocm-smi", "roc-smi-86-one-gpu.txt"),
    ):
        text = (real / tool / paste).read_text()
        (host / "commands" / f"{tool}.txt").write_text(text.split("\n", 1)[1])  # URL line off
    copy = record(RecordedHost(host), tmp_path / "copy", redact=False)
    for tool in ("rocminfo", "amd-smi", "rocm-smi"):
        assert (copy / "commands" / f"{tool}.txt").read_bytes() == (
            host / "commands" / f"{tool}.txt"
        ).read_bytes(), tool
    assert probe_rocminfo(RecordedHost(copy)) == probe_rocminfo(RecordedHost(host))
    readings = probe_amd_smi(RecordedHost(copy))
    assert readings and readings == probe_amd_smi(RecordedHost(host))
