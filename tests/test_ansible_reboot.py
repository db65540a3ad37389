"""The role's reboot path and the machine's identity, run for real against this machine.

`ansible.builtin.reboot` cannot run here: it refuses a local connection (it would reboot the
machine running the tests), and nothing here can boot into a new driver. The tests stand in for
both, in ways the role supports as it is:

- the host's egpu-setup is tests/helpers/tool_standin.py, placed at `egpu_setup_bin` with
  `egpu_setup_source: preinstalled`. It runs the real egpu-setup (detection of a recorded laptop
  with a Thunderbolt RTX 4090, the real install of the configuration into a per-host folder, the
  real verify on the CPU) and answers exit 3, "done, reboot required", until the host's boot id
  has changed since it asked, which is how the real installer decides from its journal;
- the reboot is `egpu_setup_reboot_method: tasks` with the test's task file as
  `egpu_setup_reboot_tasks`: one task that gives the host a new boot id (the stand-in's
  `standin-boot`), what a real boot does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.state.reports import saved_order
from helpers.ansible_play import (
    changed_tasks,
    machine_id_sha256,
    needs_ansible,
    run_play,
    standin_calls,
    standin_host,
    task_results,
    write_inventory,
    write_playbook,
)

pytestmark = [needs_ansible, pytest.mark.ansible]

MACHINE_ID = Path("/etc/machine-id")


def _installs(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in calls if "install" in c["argv"]]


def test_reboot_then_the_same_install_again_converges(tmp_path: Path) -> None:
    role_vars = standin_host(tmp_path, "laptop")
    play = write_playbook(tmp_path, **role_vars)
    out, proc = run_play(tmp_path, play)
    assert proc.returncode == 0, proc.stdout[-4000:]

    # exit 3 -> the reboot tasks -> the same command again -> exit 0, then verify
    calls = [c for c in standin_calls(tmp_path, "laptop") if "detect" not in c["argv"]]
    assert [(c["argv"][0], c["rc"], c["boot"]) for c in calls] == [
        ("install", 3, "boot-0"),
        ("standin-boot", 0, "boot-1"),
        ("install", 0, "boot-1"),
        ("verify", 0, "boot-1"),
    ]
    first, again = _installs(calls)
    assert first["argv"] == again["argv"]
    assert first["argv"][:3] == ["install", "--profile", "rtx4090"]
    (install,) = task_results(out, "Install")
    assert install["rc"] == 3 and install["changed"]
    assert task_results(out, "Reboot to load the new driver") == []  # the module: not chosen
    (boot,) = task_results(out, "Stand-in reboot (a new boot id, as booting gives)")
    assert boot["changed"]
    (after,) = task_results(out, "Install again after the reboot")
    assert after["rc"] == 0 and not after["changed"]  # the first run had done every step
    (verify,) = task_results(out, "Verify that the eGPU trains")
    assert verify["rc"] == 0 and json.loads(verify["stdout"])["ok"] is True
    assert task_results(out, "Fail while this host still needs a reboot") == []
    root = tmp_path / "laptop" / "root"
    assert (root / "etc/udev/rules.d/71-egpu-setup.rules").is_file()  # the real install's work

    # the controller has the host's reports, the outcome and the identity in the host's folder
    host_dir = tmp_path / "controller" / "reports" / "localhost"
    outcome = json.loads((host_dir / "install-ansible.json").read_text())
    assert [outcome[k] for k in ("exit_code", "reboot_required", "rebooted")] == [0, False, True]
    # the install after the reboot had nothing to do, and saved a report that says so
    reports = (root / "var/lib/egpu-setup/reports").glob("*.json")
    own = sorted((p.name for p in reports), key=lambda n: (n.split("-")[0], saved_order(n)))
    assert [n.split("-")[0] for n in own] == ["install", "install", "verify"]
    assert sorted(p.name for p in host_dir.iterdir()) == sorted(
        [*own, "install-ansible.json", "identity.json"]
    )
    saved = json.loads((host_dir / own[0]).read_text())
    assert saved["exit_code"] == 3  # the run that asked for the reboot, and did every step
    assert saved["changed"] == sum(s["status"] == "done" for s in saved["steps"]) > 0
    converged = json.loads((host_dir / own[1]).read_text())
    assert (converged["exit_code"], converged["changed"]) == (0, 0)
    assert json.loads((host_dir / own[2]).read_text())["ok"] is True

    # the next play changes nothing: no reboot, one install that has nothing to do
    again_out, proc2 = run_play(tmp_path, play)
    assert proc2.returncode == 0, proc2.stdout[-4000:]
    assert again_out["stats"]["localhost"]["changed"] == 0, changed_tasks(again_out)
    later = [c for c in standin_calls(tmp_path, "laptop") if "detect" not in c["argv"]][4:]
    assert [(c["argv"][0], c["rc"]) for c in later] == [("install", 0), ("verify", 0)]
    assert later[0]["argv"] == first["argv"]


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"egpu_setup_reboot": False}, "not rebooted, egpu_setup_reboot is false"),
        (
            {"egpu_setup_reboot_method": "module"},
            "not rebooted, ansible.builtin.reboot over a local connection would reboot the "
            "controller (set egpu_setup_reboot_method: tasks, or reboot it yourself)",
        ),
        (
            {"reboots_needed": 2},
            "egpu-setup install exited 3 again after the reboot (the new NVIDIA kernel module "
            "loads at the next boot); run `egpu-setup doctor` on it",
        ),
    ],
    ids=["reboot-disabled", "module-over-local-connection", "asks-again-after-the-reboot"],
)
def test_a_host_still_needing_a_reboot_fails_the_play(
    tmp_path: Path, setting: dict[str, Any], reason: str
) -> None:
    reboots_needed = setting.pop("reboots_needed", 1)
    role_vars = standin_host(tmp_path, "laptop", reboots_needed=reboots_needed)
    out, proc = run_play(tmp_path, write_playbook(tmp_path, **{**role_vars, **setting}))
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert out["stats"]["localhost"]["failures"] == 1
    (fail,) = task_results(out, "Fail while this host still needs a reboot")
    assert fail["failed"]
    assert fail["msg"] == (
        f"localhost still needs a reboot: {reason}. egpu-setup installed changes that take "
        "effect at the next boot; reboot localhost, then run the play again (the same install "
        "finishes it)."
    )
    calls = [c for c in standin_calls(tmp_path, "laptop") if "detect" not in c["argv"]]
    rebooted = reboots_needed > 1
    assert [c["argv"][0] for c in calls] == (
        ["install", "standin-boot", "install"] if rebooted else ["install"]
    )
    assert all(c["rc"] == 3 for c in _installs(calls))
    assert task_results(out, "Verify that the eGPU trains") == []  # the driver is not loaded
    assert task_results(out, "Reboot to load the new driver") == []  # never reboots the tests
    # the reports are still collected, and say what is owed
    host_dir = tmp_path / "controller" / "reports" / "localhost"
    outcome = json.loads((host_dir / "install-ansible.json").read_text())
    assert [outcome[k] for k in ("exit_code", "reboot_required", "rebooted")] == [3, True, rebooted]
    assert (host_dir / "identity.json").is_file()


def test_two_laptops_with_one_hostname_are_two_folders(tmp_path: Path) -> None:
    """Laptops cloned from one image share the hostname (here, being this machine, also the
    machine id): each is its inventory host's folder, with its own reports and identity."""
    hosts = {name: standin_host(tmp_path, name, reboots_needed=0) for name in ("lab-a", "lab-b")}
    for v in hosts.values():
        v["egpu_setup_verify"] = False
    inventory = write_inventory(tmp_path, hosts)
    play = tmp_path / "lab.yml"
    play.write_text(json.dumps([{"name": "lab", "hosts": "lab", "roles": ["egpu_setup"]}]))
    _, proc = run_play(tmp_path, play, inventory=str(inventory))
    assert proc.returncode == 0, proc.stdout[-4000:]
    dest = tmp_path / "controller" / "reports"
    assert sorted(p.name for p in dest.iterdir()) == ["lab-a", "lab-b"]
    hostnames = set()
    for name in hosts:
        folder = dest / name
        identity = json.loads((folder / "identity.json").read_text())
        assert identity == {
            "schema": "egpu-setup/identity/1",
            "inventory_hostname": name,
            "machine_id_sha256": machine_id_sha256(MACHINE_ID),
            "root": None,
        }
        # every report of this host, byte for byte, and nothing of the other one
        own = sorted((tmp_path / name / "root/var/lib/egpu-setup/reports").glob("*.json"))
        assert len(own) == 1
        assert (folder / own[0].name).read_bytes() == own[0].read_bytes()
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            [own[0].name, "install-ansible.json", "identity.json"]
        )
        hostnames.add(json.loads((folder / "install-ansible.json").read_text())["host"]["hostname"])
    assert len(hostnames) == 1  # one hostname, two machines
    assert machine_id_sha256(MACHINE_ID) is not None, "this machine has no /etc/machine-id to hash"
    sha256sum = subprocess.run(["sha256sum", str(MACHINE_ID)], capture_output=True, text=True,
                               check=True)  # fmt: skip
    assert machine_id_sha256(MACHINE_ID) == sha256sum.stdout.split()[0]
    # `egpu-setup report` reads the layout (identity.json is not a report: it is listed as such)
    rep = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", str(dest), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    skipped = {Path(s["path"]).name for s in json.loads(rep.stdout)["skipped"]}
    assert skipped <= {"identity.json"}
