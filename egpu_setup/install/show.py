"""How a prepared plan and an outcome read: the dry run's text and JSON, and the summary after.

Pure: values in, text or a JSON-ready dict out; the command prints them. The JSON is a contract
(DESIGN.md): the `resolve --json` keys, `steps`, and `plan_warnings` or `result`.
"""

from __future__ import annotations

from typing import Any

from egpu_setup.install.prepared import NOTHING_TO_DO, Outcome, Prepared
from egpu_setup.plan.steps import WriteFile
from egpu_setup.resolve.resolution import format_resolution


def plan_json(run: Prepared) -> dict[str, Any]:
    data = dict(run.resolution.to_json())
    data["steps"] = run.plan.to_json()
    data["plan_warnings"] = list(run.warnings)
    return data


def plan_text(run: Prepared) -> str:
    """The resolution, every step, then each file's unified diff."""
    lines = [format_resolution(run.resolution, warnings=False)]
    if run.plan.empty:
        return "\n".join([*lines, NOTHING_TO_DO])
    n = len(run.plan.steps)
    lines.append(f"Plan ({n} step{'' if n == 1 else 's'}):")
    lines += [f"  {i:2d}. [{s.part_name}] {s.describe()}" for i, s in enumerate(run.plan.steps, 1)]
    for step in run.plan.steps:
        if isinstance(step, WriteFile) and step.diff:
            lines += ["", step.diff.rstrip("\n")]
    return "\n".join(lines)


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    run, result = outcome.prepared, outcome.result
    data = dict(run.resolution.to_json())
    data["steps"] = run.plan.to_json()
    data["result"] = {
        "run": result.run_id if result else None,
        "steps": [s.to_json() for s in result.steps] if result else [],
        "reboot_required": result.reboot_required if result else None,
        "resumed_from": result.resumed_from if result else None,
        "verify": outcome.verify,
    }
    return data


def outcome_text(outcome: Outcome) -> str:
    result = outcome.result
    if result is None:
        return outcome.message or NOTHING_TO_DO
    changed = sum(1 for s in result.steps if s.status == "done")
    simulated = sum(1 for s in result.steps if s.status == "simulated")
    skipped = sum(1 for s in result.steps if s.status == "skipped")
    lines = [
        f"Done: {changed} changed, {simulated} simulated, {skipped} skipped (run {result.run_id})."
    ]
    lines += [f"  {s.index + 1}. {s.status}: {s.detail}" for s in result.steps if s.detail]
    if outcome.verify is not None:
        lines.append(f"verify: {'FAILED' if outcome.verify_failed else 'ok'}")
    if result.reboot_required:
        lines.append(f"Reboot needed: {result.reboot_required}. Then run the same command again.")
    return "\n".join(lines)
