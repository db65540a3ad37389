"""The Ansible role, run for real by ansible-core against this machine (`connection: local`).

Ladder (as ansible's own docs on check mode and molecule's idempotence step go): syntax check and
ansible-lint; check mode writes
nothing; a real run installs egpu-setup from a wheel into its own venv, installs the detection
fact and skips this GPU-less machine; the second run changes nothing; and (slow) a real install
into a debootstrap root through `--root`, run twice, with the reports fetched to the "controller".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.source_tree import copy_source

REPO = Path(__file__).resolve().parent.parent
ANSIBLE = REPO / "ansible"
PLAYBOOK = ANSIBLE / "site.yml"

pytestmark = pytest.mark.skipif(
    shutil.which("ansible-playbook") is None,
    reason="ansible-core is not installed (pip install ansible-core)",
)


# ansible-core has no JSON callback (that one lives in ansible.posix), so the tests bring a small
# notification callback that records every task result and the recap as JSON.
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

    def _add(self, result, **flags):
        self.tasks.append({"task": result._task.get_name(), "host": result._host.get_name(),
                           "result": {**result._result, **flags}})

    def v2_runner_on_ok(self, result):
        self._add(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._add(result, failed=True)

    def v2_runner_on_skipped(self, result):
        self._add(result, skipped=True)

    def v2_playbook_on_stats(self, stats):
        recap = {h: stats.summarize(h) for h in sorted(stats.processed)}
        with open(os.environ["EGPU_TEST_ANSIBLE_JSON"], "w") as f:
            json.dump({"tasks": self.tasks, "stats": recap}, f, default=str)
"""


def _env(tmp: Path) -> dict[str, str]:
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


def _playbook(tmp: Path, **role_vars: object) -> Path:
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


def _run_play(tmp: Path, play: Path, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    proc = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", str(play), *extra],
        capture_output=True,
        text=True,
        env=_env(tmp),
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


def _task_results(out: dict, name: str) -> list[dict]:
    """Results of the task called `name` (role tasks are named "egpu_setup : <name>"), not skipped."""
    return [
        t["result"]
        for t in out["tasks"]
        if t["task"] in (name, f"egpu_setup : {name}") and not t["result"].get("skipped")
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repo as a wheel, built from a copy so the shared tree gets no build/ folder."""
    src = copy_source(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (whl,) = out.glob("egpu_setup-*.whl")
    return whl


# -- static checks ---------------------------------------------------------------------------------


def test_example_playbook_syntax(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ansible-playbook", "--syntax-check", "-i", str(ANSIBLE / "inventory" / "lab.yml"),
         str(PLAYBOOK)],
        capture_output=True, text=True, env={**_env(tmp_path), "ANSIBLE_STDOUT_CALLBACK": "default"},
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "playbook: " in proc.stdout


def test_example_inventory_parses(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ansible-inventory", "-i", str(ANSIBLE / "inventory" / "lab.yml"), "--list"],
        capture_output=True, text=True, env=_env(tmp_path), check=True,
    )  # fmt: skip
    inv = json.loads(proc.stdout)
    assert sorted(inv["lab"]["hosts"]) == [f"lab-0{i}.example.internal" for i in (1, 2, 3)]
    hostvars = inv["_meta"]["hostvars"]["lab-01.example.internal"]
    assert hostvars["egpu_setup_verify_args"] == ["--quick"]  # a list, not a string


@pytest.mark.skipif(shutil.which("ansible-lint") is None, reason="pip install ansible-lint")
def test_ansible_lint_clean(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ansible-lint", "--offline", "--profile", "production", "site.yml", "roles/egpu_setup"],
        cwd=ANSIBLE, capture_output=True, text=True,
        env={**os.environ, "ANSIBLE_HOME": str(tmp_path), "NO_COLOR": "1"}, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bad_source_is_refused(tmp_path: Path) -> None:
    play = _playbook(tmp_path, egpu_setup_source="ftp", egpu_setup_tool_venv=str(tmp_path / "v"),
                     egpu_setup_manage_python_venv=False)  # fmt: skip
    out, proc = _run_play(tmp_path, play)
    assert proc.returncode == 2
    (res,) = _task_results(out, "Check the egpu-setup source")
    assert (
        res["failed"]
        and "egpu_setup_source must be index, wheel, bundle or preinstalled" in res["msg"]
    )
    assert not (tmp_path / "v").exists()


# -- localhost: check mode, real run, idempotence ----------------------------------------------


def _local_vars(tmp: Path, wheel: Path, **more: object) -> dict[str, object]:
    return {
        "egpu_setup_source": "wheel",
        "egpu_setup_wheel": str(wheel),
        "egpu_setup_tool_venv": str(tmp / "opt" / "tool"),
        "egpu_setup_fact_dir": str(tmp / "facts.d"),
        "egpu_setup_state_dir": str(tmp / "state"),
        "egpu_setup_environment": {"EGPU_SETUP_STATE_DIR": str(tmp / "state")},
        "egpu_setup_reports_dest": str(tmp / "controller" / "reports"),
        **more,
    }


def test_check_mode_changes_nothing(tmp_path: Path, wheel: Path) -> None:
    play = _playbook(tmp_path, **_local_vars(tmp_path, wheel))
    out, proc = _run_play(tmp_path, play, "--check")
    assert proc.returncode == 0, proc.stdout[-3000:]
    for sub in ("opt", "facts.d", "state", "controller"):
        assert not (tmp_path / sub).exists(), sub
    (skip,) = _task_results(out, "Say why this host is skipped")
    assert "no detection (check mode before egpu-setup is installed?)" in skip["msg"]


def test_real_run_skips_host_without_egpu_and_is_idempotent(tmp_path: Path, wheel: Path) -> None:
    play = _playbook(tmp_path, **_local_vars(tmp_path, wheel))
    out, proc = _run_play(tmp_path, play)
    assert proc.returncode == 0, proc.stdout[-3000:]
    tool = tmp_path / "opt" / "tool" / "bin" / "egpu-setup"
    assert tool.is_file()
    # the local fact is the detect contract, as the installed tool prints it
    fact = subprocess.run([str(tmp_path / "facts.d" / "egpu.fact")], capture_output=True,
                          text=True, check=True)  # fmt: skip
    detect = subprocess.run([str(tool), "-q", "detect", "--json"], capture_output=True, text=True,
                            check=True)  # fmt: skip
    assert json.loads(fact.stdout) == json.loads(detect.stdout)
    assert json.loads(fact.stdout)["schema"] == "egpu-setup/host/1"
    # this machine has no GPU: the role stops before installing anything
    (skip,) = _task_results(out, "Say why this host is skipped")
    assert "0 external NVIDIA GPUs found, need exactly one" in skip["msg"]
    assert _task_results(out, "Install") == []
    assert out["stats"]["localhost"]["changed"] >= 3  # venv+wheel, facts dir, fact file

    again, proc2 = _run_play(tmp_path, play)
    assert proc2.returncode == 0, proc2.stdout[-3000:]
    assert again["stats"]["localhost"]["changed"] == 0, [
        t["task"] for t in again["tasks"] if t["result"].get("changed")
    ]


# -- a real install into a Debian root ---------------------------------------------------------


@pytest.mark.slow
def test_install_into_debootstrap_root_twice(tmp_path: Path) -> None:
    """The role drives the real installer into a Debian 13 root (`install --root`): the first
    run writes the hot-plug configuration and is "changed", the second changes nothing; the
    outcome lands on the controller and `egpu-setup report` reads it."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers.debroot import DebrootUnavailable, copy_root

    try:
        root = copy_root("trixie", tmp_path / "root")
    except DebrootUnavailable as exc:
        pytest.skip(str(exc))
    # The development install of this checkout (the wheel path is covered above).
    tool = Path(sys.executable).with_name("egpu-setup")
    play = _playbook(
        tmp_path,
        **_local_vars(
            tmp_path,
            Path("unused.whl"),
            egpu_setup_source="preinstalled",
            egpu_setup_bin=str(tool),
            egpu_setup_root=str(root),
            egpu_setup_require_egpu=False,  # an image has no GPU; config needs none
            egpu_setup_profile="rtx4090",
            egpu_setup_install_args=["--only", "config"],
            egpu_setup_environment={},
            egpu_setup_state_dir="/var/lib/egpu-setup",
        ),
    )
    out, proc = _run_play(tmp_path, play)
    assert proc.returncode == 0, proc.stdout[-4000:]
    (first,) = _task_results(out, "Install")
    assert first["rc"] == 0 and first["changed"], first
    done = [s for s in json.loads(first["stdout"])["result"]["steps"] if s["status"] == "done"]
    assert {s["kind"] for s in done} >= {"write-file", "enable-unit"}
    assert (root / "etc/udev/rules.d/71-egpu-setup.rules").is_file()
    assert _task_results(out, "Verify that the eGPU trains") == []  # an image is not verified
    host_dir = tmp_path / "controller" / "reports" / "localhost"
    recorded = json.loads((host_dir / "install-ansible.json").read_text())
    assert recorded["schema"] == "egpu-setup/install/1"
    assert (
        recorded["ok"] is True and recorded["exit_code"] == 0 and recorded["changed"] == len(done)
    )

    again, proc2 = _run_play(tmp_path, play)
    assert proc2.returncode == 0, proc2.stdout[-4000:]
    (second,) = _task_results(again, "Install")
    assert second["rc"] == 0 and not second["changed"], second["stdout"]
    assert again["stats"]["localhost"]["changed"] == 0, [
        t["task"] for t in again["tasks"] if t["result"].get("changed")
    ]
    rep = subprocess.run(
        [sys.executable, "-m", "egpu_setup", "report", str(host_dir.parent), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (row,) = json.loads(rep.stdout)["hosts"]
    assert row["install"] == "ok" and row["verify"] is None and row["failures"] == []
