"""The lab's play, ansible/site.yml, as a rollout: a canary batch, then batches that stop when too
many laptops fail; and the role README's lab recipe (one bundle, installed everywhere from it,
the reports collected, the HTML page built on the controller).

Every host is this machine (`connection: local`, no become) with its own folders; hosts that must
look like laptops with an eGPU get the tool stand-in (tests/helpers/tool_standin.py), or, in the
recipe, the real egpu-setup installed from the bundle detecting a recorded laptop (`--from`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.ansible_play import (
    ANSIBLE,
    EGPU_HOST,
    PLAYBOOK,
    needs_ansible,
    run_play,
    standin_calls,
    standin_host,
    task_results,
    write_inventory,
)

pytestmark = [needs_ansible, pytest.mark.ansible]

NO_BECOME = {"ansible_become": False}  # site.yml becomes root; these hosts are already this user


@pytest.mark.parametrize(
    ("failing", "max_fail", "batches"),
    [
        ("h1", None, [["h1"]]),
        ("h3", None, [["h1"], ["h2", "h3"]]),
        ("h3", "50", [["h1"], ["h2", "h3"], ["h4", "h5"]]),
    ],
    ids=["canary-fails-nothing-else-runs", "one-of-two-fails-stops", "fifty-percent-allowed"],
)
def test_canary_then_batches_stop_on_failures(
    tmp_path: Path, failing: str, max_fail: str | None, batches: list[list[str]]
) -> None:
    """serial: [egpu_setup_canary, egpu_setup_batch] and max_fail_percentage from the play's
    variables (here -e egpu_setup_batch=2; the default 20 % stops a batch of 2 at one failure)."""
    names = ["h1", "h2", "h3", "h4", "h5"]
    hosts = {
        n: {
            **standin_host(tmp_path, n, reboots_needed=0, fail="apt-get failed (stand-in)"
                           if n == failing else None),
            "egpu_setup_verify": False,
            **NO_BECOME,
        }
        for n in names
    }  # fmt: skip
    extra = ["-e", "egpu_setup_batch=2"]
    if max_fail is not None:
        extra += ["-e", f"egpu_setup_max_fail_percentage={max_fail}"]
    out, proc = run_play(
        tmp_path, PLAYBOOK, *extra, inventory=str(write_inventory(tmp_path, hosts))
    )
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert out["batches"] == batches
    ran = [n for batch in batches for n in batch]
    for n in names:
        installs = [c for c in standin_calls(tmp_path, n) if "install" in c["argv"]]
        assert [c["rc"] for c in installs] == ([] if n not in ran else [1] if n == failing else [0])
    assert sorted(out["stats"]) == ran
    # the failed laptop's outcome is still collected, with the tool's error
    outcome = json.loads(
        (tmp_path / "controller/reports" / failing / "install-ansible.json").read_text()
    )
    assert outcome["ok"] is False and outcome["error"][0] == "error: apt-get failed (stand-in)"
    (failed,) = task_results(out, "Install", host=failing)
    assert failed["failed"] and failed["rc"] == 1
    (refail,) = task_results(out, "Fail the host, its reports collected", host=failing)
    assert refail["msg"] == (
        "Install: non-zero return code (error: apt-get failed (stand-in) hint: see the install report)"
    )


def test_lab_recipe_one_bundle_installed_everywhere_then_the_page(tmp_path: Path) -> None:
    """The README's recipe, with what this machine cannot do left out: the bundle holds the tool
    only (`--only tool`; torch and the driver .debs are test_bundle.py's), and each "laptop"
    is a folder (`--root`) provisioned as the recorded laptop it detects (`--from`)."""
    bundle = tmp_path / "bundle"
    subprocess.run(
        [sys.executable, "-m", "egpu_setup", "bundle", "--profile", "rtx4090", "--out",
         str(bundle), "--only", "tool"],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    hosts = {}
    for n in ("lab-01", "lab-02"):
        d = tmp_path / n
        (d / "root").mkdir(parents=True)
        hosts[n] = {
            **NO_BECOME,
            "egpu_setup_bundle_dir": str(d / "bundle"),
            "egpu_setup_python": sys.executable,
            "egpu_setup_tool_venv": str(d / "tool"),
            "egpu_setup_manage_python_venv": False,
            "egpu_setup_fact_dir": str(d / "facts.d"),
            "egpu_setup_detect_args": ["--from", str(EGPU_HOST)],
            "egpu_setup_root": str(d / "root"),
            "egpu_setup_install_args": ["--from", str(EGPU_HOST), "--only", "config"],
            "egpu_setup_environment": {"EGPU_SETUP_STATE_DIR": str(d / "root/var/lib/egpu-setup")},
        }
    reports = tmp_path / "reports"
    out, proc = run_play(
        tmp_path, PLAYBOOK,
        "-e", f"@{ANSIBLE / 'lab-bundle.yml'}",
        "-e", f"egpu_setup_bundle_src={bundle}", "-e", f"egpu_setup_reports_dest={reports}",
        inventory=str(write_inventory(tmp_path, hosts)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    for n in hosts:
        (install,) = task_results(out, "Install", host=n)
        argv = install["cmd"]
        assert argv[0] == str(tmp_path / n / "tool/bin/egpu-setup")  # installed from the bundle
        assert argv[1:4] == ["install", "--bundle", str(tmp_path / n / "bundle")]
        assert "--profile" not in argv  # the bundle's own profile
        assert install["rc"] == 0 and install["changed"]
        assert (tmp_path / n / "root/etc/udev/rules.d/71-egpu-setup.rules").is_file()
        fetched = sorted(p.name for p in (reports / n).iterdir())
        assert "install-ansible.json" in fetched and "identity.json" in fetched
        assert any(f.startswith("install-2") for f in fetched)
    page = tmp_path / "lab.html"
    subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", f"{reports}/", "--html", str(page)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    html = page.read_text()
    assert "lab-01" in html and "lab-02" in html
