"""The install stages alone, over typed values: prepare -> show, the Outcome's exit code, and the
bundle's profile as the default without any flag being rewritten."""

from __future__ import annotations

import dataclasses
import json
import shutil
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES, REPO
from egpu_setup.errors import EXIT_FAILED, EXIT_OK, EXIT_REBOOT, UsageError
from egpu_setup.execute.executor import ExecResult
from egpu_setup.install.offline import open_bundle
from egpu_setup.install.options import InstallOptions
from egpu_setup.install.pipeline import prepare
from egpu_setup.install.prepared import Outcome
from egpu_setup.install.show import outcome_json, outcome_text, plan_json, plan_text

RECORDED = str(FIXTURES / "tb4-rtx4090-ubuntu2404")


def _dry_run(**kw: Any) -> InstallOptions:
    return InstallOptions(profile="rtx4090", dry_run=True, from_dir=RECORDED, **kw)


def test_prepare_plans_a_recorded_machine_and_show_says_it() -> None:
    options = _dry_run(only="config")
    run = prepare(options)
    assert run.options is options  # the flags travel as they were given
    assert run.facts.egpu is not None and run.facts.egpu.device_id == "2684"
    assert run.profile.name == "rtx4090" and run.resolution.gpu is not None
    assert run.plan.steps and {s.part_name for s in run.plan.steps} == {"config"}
    text = plan_text(run)
    assert text.startswith("GPU      GeForce RTX 4090 [10de:2684]")
    assert f"Plan ({len(run.plan.steps)} steps):" in text
    assert "Why" in text and "Warnings" not in text  # warnings go to stderr, once
    data = plan_json(run)
    assert data["schema"] == "egpu-setup/resolution/1"
    assert [s["kind"] for s in data["steps"]] == [s.kind for s in run.plan.steps]
    assert data["plan_warnings"] == list(run.warnings)


def test_the_options_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _dry_run().profile = "other"  # type: ignore[misc]  # the assignment the test expects to fail


def test_flags_that_cannot_go_together_are_refused_before_anything_is_read() -> None:
    with pytest.raises(UsageError, match="--from describes another machine"):
        prepare(InstallOptions(profile="rtx4090", from_dir=RECORDED))
    with pytest.raises(UsageError, match="--profile is required"):
        prepare(InstallOptions(dry_run=True, from_dir=RECORDED))
    with pytest.raises(UsageError, match="only https"):
        prepare(_dry_run(index_url="http://mirror.example/whl/cpu"))


def test_a_bundle_gives_the_profile_without_a_flag_being_changed(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(REPO / "profiles" / "rtx4090.yaml", bundle / "profile.yaml")
    profile = (bundle / "profile.yaml").read_bytes()
    entry = {"path": "profile.yaml", "size": len(profile), "sha256": sha256(profile).hexdigest()}
    manifest = json.dumps({"schema": "egpu-setup/bundle/1", "targets": [], "files": [entry]})
    (bundle / "manifest.json").write_text(manifest)
    pin = sha256(manifest.encode()).hexdigest()  # what `bundle` printed on the build machine
    options = InstallOptions(
        dry_run=True, bundle_dir=str(bundle), bundle_sha256=pin, from_dir=RECORDED
    )
    opened = open_bundle(options)
    assert opened.profile_file == str(bundle.resolve() / "profile.yaml")
    assert options.profile is None
    with pytest.raises(UsageError, match="cannot be combined with --bundle"):
        open_bundle(dataclasses.replace(options, cuda="cpu"))
    with pytest.raises(UsageError, match="has no target"):
        prepare(options)  # the bundle's profile was loaded; its (empty) targets were asked
    assert options.profile is None


@pytest.mark.parametrize(
    ("reboot", "verify", "code"),
    [
        (None, None, EXIT_OK),
        ("the new NVIDIA kernel module takes effect at the next boot", None, EXIT_REBOOT),
        (None, {"ok": True}, EXIT_OK),
        (None, {"ok": False}, EXIT_FAILED),
        ("a reboot", {"ok": False}, EXIT_FAILED),  # installed, but the eGPU does not train
    ],
)
def test_the_outcome_says_the_exit_code(
    reboot: str | None, verify: dict[str, bool] | None, code: int
) -> None:
    run = prepare(_dry_run(only="config"))
    outcome = Outcome(run, ExecResult("run-1", reboot_required=reboot), verify)
    assert outcome.exit_code == code
    assert outcome.reboot_required == reboot
    assert outcome_json(outcome)["result"]["reboot_required"] == reboot
    text = outcome_text(outcome)
    assert text.startswith("Done: 0 changed")
    assert ("Reboot needed" in text) == bool(reboot)


def test_nothing_to_do_is_said_and_exits_0() -> None:
    run = prepare(_dry_run(only="config"))
    outcome = Outcome(run, message="Nothing to do: this machine already matches the profile.")
    assert outcome.exit_code == EXIT_OK and outcome.result is None
    assert outcome_text(outcome).startswith("Nothing to do")
    assert outcome_json(outcome)["result"]["steps"] == []
