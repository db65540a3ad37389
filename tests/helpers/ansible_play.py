"""Running the Ansible role for real in tests: plays, inventories, a result recorder, stand-ins.

ansible-core has no JSON callback (that one lives in ansible.posix), so the tests bring a small
notification callback that records every task result, every batch of a `serial` play and the
recap as JSON. Hosts are this machine (`connection: local`); a host that must look like a laptop
with an eGPU gets the tool stand-in of tests/helpers/tool_standin.py (see there).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import tiers

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
ROLE = ANSIBLE / "roles" / "egpu_setup"
PLAYBOOK = ANSIBLE / "site.yml"
STANDIN = Path(__file__).with_name("tool_standin.py")
# A recorded real machine with one Thunderbolt RTX 4090 (tests/fixtures/hosts/README.md).
EGPU_HOST = REPO / "tests" / "fixtures" / "hosts" / "tb4-rtx4090-ubuntu2404"

# `pytestmark = needs_ansible` in every Ansible test module
needs_ansible = pytest.mark.skipif(
    shutil.which("ansible-playbook") is None,
    reason="ansible-core is not installed (pip install ansible-core)",
)

_RECORDER = """
import json, os
from ansible.plugins.callback import CallbackBase

class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "egpu_record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.tasks = []
        self.batches = []

    def _add(self, result, **flags):
        self.tasks.append({"task": result._task.get_name(), "host": result._host.get_name(),
                           "result": {**result._result, **flags}})

    def v2_playbook_on_play_start(self, play):
        # once per batch of a `serial` play; the inventory is restricted to that batch
        hosts = play.get_variable_manager()._inventory.get_hosts(play.hosts)
        self.batches.append(sorted(h.name for h in hosts))

    def v2_runner_on_ok(self, result):
        self._add(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._add(result, failed=True)

    def v2_runner_on_skipped(self, result):
        self._add(result, skipped=True)

    def v2_playbook_on_stats(self, stats):
        recap = {h: stats.summarize(h) for h in sorted(stats.processed)}
        with open(os.environ["EGPU_TEST_ANSIBLE_JSON"], "w") as f:
            json.dump({"tasks": self.tasks, "batches": self.batches, "stats": recap}, f,
                      default=str)
"""

# The test's reboot method (egpu_setup_reboot_method: tasks): the stand-in's `standin-boot` gives
# the host a new boot id, which is what a reboot changes for the installer.
REBOOT_TASKS = """\
- name: Stand-in reboot (a new boot id, as booting gives)
  ansible.builtin.command:
    argv: ["{{ egpu_setup_bin }}", "standin-boot"]
  changed_when: true
"""


def ansible_env(tmp: Path) -> dict[str, str]:
    tiers.require("ansible")  # every ansible-playbook of the tests runs in this environment
    plugins = tmp / "callback_plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "egpu_record.py").write_text(_RECORDER)
    return {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
        "ANSIBLE_CALLBACK_PLUGINS": str(plugins),
        "ANSIBLE_CALLBACKS_ENABLED": "egpu_record",
        "EGPU_TEST_ANSIBLE_JSON": str(tmp / "ansible-result.json"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_CONFIG": str(tmp / "no-ansible.cfg"),  # not the example's inventory
    }


def write_playbook(tmp: Path, **role_vars: object) -> Path:
    """A one-host play for localhost that applies the role with these variables."""
    play = [
        {
            "name": "egpu-setup role under test",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": True,
            "vars": {"ansible_python_interpreter": sys.executable},
            "roles": [{"role": "egpu_setup", **role_vars}],
        }
    ]
    path = tmp / "play.yml"
    path.write_text(json.dumps(play))  # JSON is YAML
    return path


def write_inventory(tmp: Path, hosts: dict[str, dict[str, object]]) -> Path:
    """Group `lab` of hosts that are all this machine, each with its own variables."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv = {"lab": {"hosts": {name: {**local, **v} for name, v in hosts.items()}}}
    path = tmp / "inventory.yml"
    path.write_text(json.dumps(inv))
    return path


def run_play(
    tmp: Path, play: Path, *extra: str, inventory: str = "localhost,"
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    proc = subprocess.run(
        ["ansible-playbook", "-i", inventory, str(play), *extra],
        capture_output=True,
        text=True,
        env=ansible_env(tmp),
        timeout=600,
        check=False,
    )
    result = tmp / "ansible-result.json"
    if not result.is_file():
        pytest.fail(
            f"ansible-playbook recorded nothing (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    out = json.loads(result.read_text())
    result.unlink()
    return out, proc


def task_results(out: dict[str, Any], name: str, host: str | None = None) -> list[dict[str, Any]]:
    """Results of the task called `name` (role tasks are named "egpu_setup : <name>"), not skipped."""
    return [
        t["result"]
        for t in out["tasks"]
        if t["task"] in (name, f"egpu_setup : {name}")
        and not t["result"].get("skipped")
        and host in (None, t["host"])
    ]


def changed_tasks(out: dict[str, Any]) -> list[str]:
    return [t["task"] for t in out["tasks"] if t["result"].get("changed")]


def standin_host(
    base: Path, name: str, *, reboots_needed: int = 1, fail: str | None = None
) -> dict[str, object]:
    """A laptop with an eGPU for the role: its own folders and tool stand-in; the role's vars.

    The real tool behind the stand-in is this checkout's (the venv's console script)."""
    d = base / name
    root = d / "root"
    state = root / "var/lib/egpu-setup"
    root.mkdir(parents=True)
    (d / "boot").write_text("boot-0\n")
    config = {
        "tool": [str(Path(sys.executable).with_name("egpu-setup"))],
        "from": str(EGPU_HOST),
        "root": str(root),
        "state": str(d / "standin-state.json"),
        "boot": str(d / "boot"),
        "log": str(d / "calls.jsonl"),
        "reboots_needed": reboots_needed,
        "fail": fail,
    }
    (d / "standin.json").write_text(json.dumps(config))
    tool = d / "bin" / "egpu-setup"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "{d / "standin.json"}" "$@"\n')
    tool.chmod(0o755)
    reboot_tasks = base / "reboot-tasks.yml"
    reboot_tasks.write_text(REBOOT_TASKS)
    return {
        "egpu_setup_source": "preinstalled",
        "egpu_setup_bin": str(tool),
        "egpu_setup_manage_python_venv": False,
        "egpu_setup_fact_dir": str(d / "facts.d"),
        "egpu_setup_profile": "rtx4090",
        # the configuration part only: no apt, no pip, into the per-host folder
        "egpu_setup_install_args": ["--only", "config"],
        "egpu_setup_state_dir": str(state),
        "egpu_setup_environment": {"EGPU_SETUP_STATE_DIR": str(state)},
        "egpu_setup_reboot_method": "tasks",
        "egpu_setup_reboot_tasks": str(reboot_tasks),
        # the real verify, on the CPU, with this test run's torch
        "egpu_setup_verify_args": ["--device", "cpu", "--quick", "--python", sys.executable],
        "egpu_setup_reports_dest": str(base / "controller" / "reports"),
    }


def standin_calls(base: Path, name: str) -> list[dict[str, Any]]:
    """The stand-in's log for host `name`: {"argv", "rc", "boot"} per call, in order."""
    log = base / name / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def machine_id_sha256(path: Path) -> str | None:
    """What `sha256sum PATH` prints for a valid machine-id(5) file (32 hex digits and a newline);
    None for a missing, empty or "uninitialized" one, as the role records it."""
    data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    return hashlib.sha256(data).hexdigest() if len(data) == 33 else None
