"""The Ansible role, run for real by ansible-core against this machine (`connection: local`).

Ladder (as ansible's own docs on check mode and molecule's idempotence step go): syntax check and ansible-lint; the argument spec
(every variable typed and documented, checked by ansible before anything runs, and the README's
table generated from it); check mode writes nothing; a real run installs egpu-setup from a wheel
into its own venv, installs the detection fact and skips this GPU-less machine; the second run
changes nothing; and (slow) a real install into a debootstrap root through `--root`, run twice,
with the reports fetched to the "controller". The reboot path, identity and the rollout's
batches are in test_ansible_reboot.py and test_ansible_rollout.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from helpers.ansible_play import (
    ANSIBLE,
    PLAYBOOK,
    REPO,
    ROLE,
    ansible_env,
    machine_id_sha256,
    needs_ansible,
    run_play,
    task_results,
    write_inventory,
    write_playbook,
)
from helpers.source import copy_buildable_source

pytestmark = [needs_ansible, pytest.mark.ansible]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repo as a wheel, built from a copy so the shared tree gets no build/ folder."""
    src = copy_buildable_source(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = out.glob("egpu_setup-*.whl")
    return whl


# -- static checks ---------------------------------------------------------------------------------


def test_example_playbook_syntax(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ansible-playbook", "--syntax-check", "-i", str(ANSIBLE / "inventory" / "lab.yml"),
         str(PLAYBOOK)],
        capture_output=True, text=True, env={**ansible_env(tmp_path), "ANSIBLE_STDOUT_CALLBACK": "default"},
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "playbook: " in proc.stdout


def test_example_inventory_parses(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ansible-inventory", "-i", str(ANSIBLE / "inventory" / "lab.yml"), "--list"],
        capture_output=True, text=True, env=ansible_env(tmp_path), check=True,
    )  # fmt: skip
    inv = json.loads(proc.stdout)
    assert sorted(inv["lab"]["hosts"]) == [f"lab-0{i}.example.internal" for i in (1, 2, 3)]
    hostvars = inv["_meta"]["hostvars"]["lab-01.example.internal"]
    assert hostvars["egpu_setup_verify_args"] == ["--quick"]  # a list, not a string


@pytest.mark.skipif(shutil.which("ansible-lint") is None, reason="pip install ansible-lint")
def test_ansible_lint_clean(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ansible-lint", "--offline", "--profile", "production", "site.yml", "lab-bundle.yml",
         "roles/egpu_setup"],
        cwd=ANSIBLE, capture_output=True, text=True,
        env={**os.environ, "ANSIBLE_HOME": str(tmp_path), "NO_COLOR": "1"}, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the argument spec: complete, validated by ansible, the README generated from it ---------------


def _readme_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "render_role_readme", ANSIBLE / "render_role_readme.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_argument_spec_types_and_documents_every_default() -> None:
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert list(spec) == ["main"]
    options = spec["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert sorted(options) == sorted(defaults)  # no variable missing, none stale
    for name, option in options.items():
        assert option.get("type") in {"str", "bool", "int", "path", "list", "dict"}, name
        assert option.get("default") == defaults[name], name
        assert len(str(option.get("description", ""))) > 20, name
        if option["type"] == "list":
            assert option.get("elements") == "str", name
        if "choices" in option:
            assert defaults[name] in option["choices"], name
    # the choices the tasks branch on are the spec's choices
    assert options["egpu_setup_source"]["choices"] == ["index", "wheel", "bundle", "preinstalled"]
    assert options["egpu_setup_reboot_method"]["choices"] == ["module", "tasks"]


def test_readme_variables_table_is_the_spec() -> None:
    """The table in README.md is generated from the spec: each variable once, with its type,
    its default from defaults/main.yml and the spec's description."""
    render = _readme_renderer()
    readme = (ROLE / "README.md").read_text()
    assert readme == render.current_readme(), "run: python ansible/render_role_readme.py"
    table = readme.split(render.BEGIN)[1].split(render.END)[0]
    rows = [line.split(" | ") for line in table.strip().splitlines()[2:]]
    names = [cells[0].strip("| `") for cells in rows]
    options = render.load_spec()
    assert names == list(options)
    by_name = {cells[0].strip("| `"): cells for cells in rows}
    assert by_name["egpu_setup_reboot_timeout"][1:3] == ["int", "`900`"]
    assert by_name["egpu_setup_verify_args"][1:3] == ["list of str", "`[]`"]
    assert "One of: `module`, `tasks`." in by_name["egpu_setup_reboot_method"][3]
    # the play's own variables are documented too
    play_vars = yaml.safe_load(PLAYBOOK.read_text())[0]["vars"]
    for name in play_vars:
        assert f"| `{name}` |" in readme, name


def test_ansible_doc_reads_the_spec(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ansible-doc", "-t", "role", "-r", str(ANSIBLE / "roles"), "--json", "egpu_setup"],
        capture_output=True, text=True, env=ansible_env(tmp_path), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["egpu_setup"]["entry_points"]["main"]
    assert doc["options"]["egpu_setup_reboot_method"]["choices"] == ["module", "tasks"]


def _only_validation_ran(out: dict[str, Any]) -> dict[str, Any]:
    """The spec's failure, and proof that no role task ran before or after it."""
    tasks = [t for t in out["tasks"] if t["task"] != "Gathering Facts"]
    assert len(tasks) == 1, [t["task"] for t in tasks]
    assert tasks[0]["task"].startswith("egpu_setup : Validating arguments against arg spec 'main'")
    assert tasks[0]["result"]["failed"]
    loaded: dict[str, Any] = tasks[0]["result"]
    return loaded


def test_bad_source_is_refused(tmp_path: Path) -> None:
    play = write_playbook(tmp_path, egpu_setup_source="ftp", egpu_setup_tool_venv=str(tmp_path / "v"),
                     egpu_setup_manage_python_venv=False)  # fmt: skip
    out, proc = run_play(tmp_path, play)
    assert proc.returncode == 2
    res = _only_validation_ran(out)
    assert (
        res["failed"]
        and "value of egpu_setup_source must be one of: index, wheel, bundle, preinstalled, got: ftp"
        in res["msg"]
    )
    assert not (tmp_path / "v").exists()


def test_wrong_type_in_the_inventory_fails_before_anything_runs(tmp_path: Path) -> None:
    """The spec checks the lab's inventory too (host variables, not only role parameters)."""
    inventory = write_inventory(tmp_path, {"lab-01": {
        "egpu_setup_reboot_timeout": "a while",
        "egpu_setup_reboot_method": "kexec",
        "egpu_setup_fact_dir": str(tmp_path / "facts.d"),
        "egpu_setup_manage_python_venv": False,
    }})  # fmt: skip
    play = tmp_path / "lab.yml"
    play.write_text(json.dumps([{"hosts": "lab", "roles": ["egpu_setup"]}]))
    out, proc = run_play(tmp_path, play, inventory=str(inventory))
    assert proc.returncode == 2
    res = _only_validation_ran(out)
    assert sorted(res["argument_errors"]) == [
        "argument 'egpu_setup_reboot_timeout' is of type str and we were unable to convert to int: "
        "\"'a while'\" cannot be converted to an int",
        "value of egpu_setup_reboot_method must be one of: module, tasks, got: kexec",
    ]
    assert not (tmp_path / "facts.d").exists()


@pytest.mark.parametrize(
    ("role_vars", "needs"),
    [
        ({"egpu_setup_source": "wheel"}, "a wheel source needs egpu_setup_wheel"),
        (
            {"egpu_setup_reboot_method": "tasks"},
            "the tasks reboot method needs egpu_setup_reboot_tasks",
        ),
        ({"egpu_setup_verify_args": "--quick"}, 'are lists (["--quick"]), not strings'),
    ],
    ids=["wheel-without-wheel", "tasks-without-file", "args-as-string"],
)
def test_what_the_spec_cannot_check_is_refused(
    tmp_path: Path, role_vars: dict[str, Any], needs: str
) -> None:
    play = write_playbook(tmp_path, egpu_setup_tool_venv=str(tmp_path / "v"),
                          egpu_setup_manage_python_venv=False, **role_vars)  # fmt: skip
    out, proc = run_play(tmp_path, play)
    assert proc.returncode == 2
    (res,) = task_results(out, "Check what the argument spec cannot")
    assert res["failed"] and needs in res["msg"]
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
    play = write_playbook(tmp_path, **_local_vars(tmp_path, wheel))
    out, proc = run_play(tmp_path, play, "--check")
    assert proc.returncode == 0, proc.stdout[-3000:]
    for sub in ("opt", "facts.d", "state", "controller"):
        assert not (tmp_path / sub).exists(), sub
    (skip,) = task_results(out, "Say why this host is skipped")
    assert "no detection (check mode before egpu-setup is installed?)" in skip["msg"]


@pytest.mark.parametrize(
    ("role_url", "pip_conf", "said"),
    [
        ("https://lab:s3cret@mirror.invalid/simple", None,
         "egpu-setup index: https://mirror.invalid/simple (from egpu_setup_index_url)"),
        ("", "https://__token__:s3cret@pip.lab.invalid/simple",
         "egpu-setup index: https://pip.lab.invalid/simple (from pip configuration on localhost)"),
    ],
    ids=["role-variable", "pip-configuration"],
)  # fmt: skip
def test_the_play_says_which_index_egpu_setup_comes_from_without_its_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role_url: str, pip_conf: str | None, said: str
) -> None:
    if pip_conf is not None:  # the host's own pip configuration (pip's PIP_CONFIG_FILE)
        conf = tmp_path / "pip.conf"
        conf.write_text(f"[global]\nindex-url = {pip_conf}\n")
        monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    play = write_playbook(tmp_path, egpu_setup_source="index", egpu_setup_index_url=role_url,
                          egpu_setup_tool_venv=str(tmp_path / "v"),
                          egpu_setup_manage_python_venv=False)  # fmt: skip
    out, proc = run_play(tmp_path, play, "--check")
    (res,) = task_results(out, "Say which index egpu-setup comes from")
    assert res["msg"] == said
    assert "s3cret" not in proc.stdout + proc.stderr
    assert not (tmp_path / "v").exists()


def test_real_run_skips_host_without_egpu_and_is_idempotent(tmp_path: Path, wheel: Path) -> None:
    play = write_playbook(tmp_path, **_local_vars(tmp_path, wheel))
    out, proc = run_play(tmp_path, play)
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
    (skip,) = task_results(out, "Say why this host is skipped")
    assert "0 external NVIDIA GPUs found, need exactly one" in skip["msg"]
    assert task_results(out, "Install") == []
    assert out["stats"]["localhost"]["changed"] >= 3  # venv+wheel, facts dir, fact file

    again, proc2 = run_play(tmp_path, play)
    assert proc2.returncode == 0, proc2.stdout[-3000:]
    assert again["stats"]["localhost"]["changed"] == 0, [
        t["task"] for t in again["tasks"] if t["result"].get("changed")
    ]


# -- a real install into a Debian root ---------------------------------------------------------


@pytest.mark.debootstrap
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
    # An image before its first boot (machine-id(5)): systemd writes the id then.
    (root / "etc/machine-id").write_text("uninitialized\n")
    # The development install of this checkout (the wheel path is covered above).
    tool = Path(sys.executable).with_name("egpu-setup")
    play = write_playbook(
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
    out, proc = run_play(tmp_path, play)
    assert proc.returncode == 0, proc.stdout[-4000:]
    (first,) = task_results(out, "Install")
    assert first["rc"] == 0 and first["changed"], first
    done = [s for s in json.loads(first["stdout"])["result"]["steps"] if s["status"] == "done"]
    assert {s["kind"] for s in done} >= {"write-file", "enable-unit"}
    assert (root / "etc/udev/rules.d/71-egpu-setup.rules").is_file()
    assert task_results(out, "Verify that the eGPU trains") == []  # an image is not verified
    host_dir = tmp_path / "controller" / "reports" / "localhost"
    recorded = json.loads((host_dir / "install-ansible.json").read_text())
    assert recorded["schema"] == "egpu-setup/install/1"
    assert (
        recorded["ok"] is True and recorded["exit_code"] == 0 and recorded["changed"] == len(done)
    )
    # the identity is the image's own machine id, which it has not got yet (null, not a guess)
    assert json.loads((host_dir / "identity.json").read_text()) == {
        "schema": "egpu-setup/identity/1",
        "inventory_hostname": "localhost",
        "machine_id_sha256": machine_id_sha256(root / "etc/machine-id"),
        "root": str(root),
    }

    again, proc2 = run_play(tmp_path, play)
    assert proc2.returncode == 0, proc2.stdout[-4000:]
    (second,) = task_results(again, "Install")
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
