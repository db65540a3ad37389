"""The lab table from real reports of this machine plus the recorded ones.

A real `install` of a pinned CPU torch into a temp venv (from a PEP 503 index on 127.0.0.1) and a
real CPU `verify` of that venv leave their reports; they are laid out as the Ansible role
fetches them (<dest>/<inventory_hostname>/, with identity.json holding this machine's
`sha256sum /etc/machine-id`) beside the recorded lab, and `egpu-setup report` must show every
machine once, this one as what it is: verified on the CPU only, torch as installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import pypi_index
from helpers.fleet_reports import Page

DATA = Path(__file__).parents[1] / "data" / "reports"
RECORDED = ["lab-01", "lab-02", "lab-03", "lab-04", "lab-05", "lab-06"]


def cli(
    *args: str, env: dict[str, str], timeout: float = 900, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}, check=False,
        cwd=cwd,
    )  # fmt: skip


def role_identity(name: str) -> dict[str, object]:
    """identity.json as ansible/roles/egpu_setup/tasks/fetch.yml writes it for this host: the
    checksum of a 33-byte /etc/machine-id, else null."""
    path = Path("/etc/machine-id")
    digest = None
    if path.is_file() and path.stat().st_size == 33:
        digest = subprocess.run(
            ["sha256sum", str(path)], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    return {"schema": "egpu-setup/identity/1", "inventory_hostname": name,
            "machine_id_sha256": digest, "root": None}  # fmt: skip


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("lab")
    state = tmp / "state"
    env = {"EGPU_SETUP_STATE_DIR": str(state), "EGPU_SETUP_INSTALLER": "pip"}
    profile = tmp / "lab-cpu.yaml"
    profile.write_text(
        "name: lab-cpu\nextends: rtx4090\ndescription: the lab pinned CPU torch\n"
        'torch:\n  pin: "2.13.0+cpu"\n  extras: []\n'
    )
    venv = tmp / "venv"
    wheels = pypi_index.download_torch(pypi_index.cache_dir())
    with pypi_index.LocalIndex(wheels) as idx:
        res = cli("install", "--profile", str(profile), "--only", "torch", "--venv", str(venv),
                  "--index-url", idx.url, "--yes", "--no-verify", env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    res = cli("verify", "--device", "cpu", "--quick", "--venv", str(venv), env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]

    dest = tmp / "reports"
    shutil.copytree(DATA / "lab", dest)
    shutil.copytree(DATA / "real" / "image-trixie", dest / "image-trixie")
    here = dest / "this-laptop"
    here.mkdir()
    for report in sorted((state / "reports").glob("*.json")):
        shutil.copy2(report, here / report.name)
    (here / "identity.json").write_text(json.dumps(role_identity("this-laptop")) + "\n")
    return dest


@pytest.mark.slow
def test_every_machine_once_with_truthful_columns(lab: Path) -> None:
    res = cli("report", str(lab), "--json", env={})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    rows = {h["machine"]: h for h in data["hosts"]}
    assert sorted(rows) == sorted([*RECORDED, "image-trixie", "this-laptop"])

    me = rows["this-laptop"]
    identity = json.loads((lab / "this-laptop" / "identity.json").read_text())
    assert me["machine_id_sha256"] == identity["machine_id_sha256"]
    assert me["problems"] == []  # its reports agree with its folder
    assert (me["status"], me["ok"], me["device"], me["verify"]) == ("cpu only", False, "cpu", "ok")
    assert (me["gpu"], me["h2d_gbps"]) == (None, None)  # no GPU here, and none invented
    assert me["torch"] == "2.13.0+cpu" and me["install"] == "changed"
    assert me["tflops"] is not None and me["tflops_precision"] in ("bf16", "fp32")
    assert me["age_s"] is not None and me["age_s"] < 3600

    (install,) = (lab / "this-laptop").glob("install-*.json")
    saved = json.loads(install.read_text())
    assert saved["machine_id_sha256"] == identity["machine_id_sha256"]
    # which matrix decided (none: the pin), said in the report
    assert saved["resolution"]["matrix"]["source"] == "shipped"
    assert saved["resolution"]["pinned"]["torch"] == "2.13.0+cpu"

    strict = cli("report", str(lab), "--strict", env={})
    assert strict.returncode == 1 and "this-laptop" in strict.stderr


@pytest.mark.slow
def test_the_lab_page_draws_every_machine(lab: Path, tmp_path: Path) -> None:
    page = tmp_path / "lab.html"
    # run where the role's dest is, as an admin would: the page names folders as given
    res = cli("report", lab.name, "--html", str(page), "--title", "Lab 3.12", env={},
              cwd=lab.parent)  # fmt: skip
    assert res.returncode == 0, res.stderr
    p = Page()
    p.feed(page.read_text())
    machines = sorted([*RECORDED, "image-trixie", "this-laptop"])
    for chart, marks in p.marks.items():
        assert marks == machines, chart
    assert len(p.marks) == 2
    assert page.stat().st_size < 100_000
    assert '<tr class="cpu"' in page.read_text()  # this machine: CPU only, never an ok eGPU
