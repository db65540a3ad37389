"""How a prepared plan and an outcome read: the dry run's text and JSON, and the summary after.

Pure: values in, text or a JSON-ready dict out; the command prints them. The JSON is a contract
(docs/design.md): the `resolve --json` keys, `steps`, and `plan_warnings` or `result`.
"""

from __future__ import annotations

from typing import Any

from egpu_setup.install.advice import Advice
from egpu_setup.install.preflight import space_needs
from egpu_setup.install.prepared import NOTHING_TO_DO, Outcome, Prepared
from egpu_setup.plan.steps import WriteFile
from egpu_setup.resolve.resolution import format_resolution

DIFF_SEPARATOR = "-" * 30 + " file diffs " + "-" * 30


def plan_json(run: Prepared) -> dict[str, Any]:
    data = dict(run.resolution.to_json())
    # --only without driver: the driver is what torch needs, not what this run installs
    data["driver"] = {**data["driver"], "in_run": "driver" in run.plan_options.only}
    data["steps"] = run.plan.to_json()
    data["plan_warnings"] = list(run.warnings)
    data["actions"] = [a.to_json() for a in run.actions]
    data["advice"] = [a.to_json() for a in run.advice]
    data["profile_mismatch"] = run.mismatch
    data["space_needed"] = [need.to_json() for need in space_needs(run.plan, run.target)]
    return data


def plan_text(run: Prepared, *, diff: bool = False) -> str:
    """What fits a screen: the resolution, what a person must do first, the steps, what a person
    must do after them, the summary; each file's unified diff only with `diff` (--diff), after a
    separator (the warnings go to stderr, before all of it)."""
    in_run = "driver" in run.plan_options.only
    lines = [format_resolution(run.resolution, warnings=False, driver_in_run=in_run)]
    lines += _actions(run, "before", "Before anything changes, a person must:")
    if run.plan.empty:
        lines += ["", NOTHING_TO_DO]
        return "\n".join(lines)
    n = len(run.plan.steps)
    lines += ["", f"Plan ({n} step{'' if n == 1 else 's'}):"]
    lines += [f"  {i:2d}. [{s.part_name}] {s.describe()}" for i, s in enumerate(run.plan.steps, 1)]
    space = [f"Disk space: {need.describe()}" for need in space_needs(run.plan, run.target)]
    lines += [""] + space if space else []
    lines += _actions(
        run, "after", "After these steps, a person must (the run stops there, exit 4):"
    )
    lines += _actions(run, "each-laptop", "On each laptop that boots this image, a person must:")
    lines += summary_lines(run.advice)
    diffs = [s.diff for s in run.plan.steps if isinstance(s, WriteFile) and s.diff]
    if diffs and not diff:
        lines += [
            "",
            f"{len(diffs)} file{'' if len(diffs) == 1 else 's'} change: --diff shows how.",
        ]
    elif diffs:
        lines += ["", DIFF_SEPARATOR]
        for d in diffs:
            lines += ["", d.rstrip("\n")]
    return "\n".join(lines)


def _actions(run: Prepared, when: str, title: str) -> list[str]:
    todo = [a for a in run.actions if a.when == when]
    if not todo:
        return []
    out = ["", title]
    for a in todo:
        out += _wrapped("  ! ", a.summary)
        for i, step in enumerate(a.steps, 1):
            out += _wrapped(f"    {i}. ", step)
    if when == "before":
        out.append("  install refuses (exit 4) until then; --force goes ahead anyway")
    return out


def summary_lines(advice: tuple[Advice, ...]) -> list[str]:
    """The plan's (and the run's) summary: one labelled paragraph per piece of advice."""
    if not advice:
        return []
    out = ["", "Summary"]
    for a in advice:
        out += _wrapped(f"  {a.label:<8} ", a.text)
    return out


def _wrapped(head: str, text: str) -> list[str]:
    """`text` under `head`, each of its lines a paragraph of its own, aligned under the first.
    Not wrapped here: the command wraps the whole plan to the terminal (text.fit), and a pipe
    gets one line per paragraph, as a script reads it."""
    paragraphs = text.split("\n")
    return [head + paragraphs[0]] + [" " * len(head) + p for p in paragraphs[1:]]


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    run, result = outcome.prepared, outcome.result
    data = dict(run.resolution.to_json())
    data["driver"] = {**data["driver"], "in_run": "driver" in run.plan_options.only}
    data["steps"] = run.plan.to_json()
    data["result"] = {
        "run": result.run_id if result else None,
        "steps": [s.to_json() for s in result.steps] if result else [],
        "reboot_required": result.reboot_required if result else None,
        "resumed_from": result.resumed_from if result else None,
        "verify": outcome.verify,
        "after_reboot": _seen_json(outcome),
    }
    data["actions"] = [a.to_json() for a in run.actions]
    data["advice"] = [a.to_json() for a in run.advice]
    return data


def _seen_json(outcome: Outcome) -> dict[str, Any] | None:
    seen = outcome.seen
    if seen is None:
        return None
    return {"ok": seen.ok, "report": seen.path, "pending": seen.pending, "text": seen.text()}


def outcome_text(outcome: Outcome) -> str:
    """What the run did, the verify that followed, then the summary: how to use torch, a
    re-login in display mode, the power and NUMA advice."""
    result = outcome.result
    if result is None:
        lines = [outcome.message or NOTHING_TO_DO]
        if outcome.seen is not None:
            lines.append(f"After the reboot: {outcome.seen.text()}")
        return "\n".join(lines + summary_lines(outcome.prepared.advice))
    changed = sum(1 for s in result.steps if s.status == "done")
    skipped = sum(1 for s in result.steps if s.status == "skipped")
    lines = [f"Done: {changed} changed, {skipped} skipped (run {result.run_id})."]
    lines += [f"  {s.index + 1}. {s.status}: {s.detail}" for s in result.steps if s.detail]
    if outcome.verify is not None:
        lines.append(f"verify: {'FAILED' if outcome.verify_failed else 'ok'}{_on(outcome.verify)}")
    if result.reboot_required:
        lines.append(f"Reboot needed: {result.reboot_required}. Then run the same command again.")
    return "\n".join(lines + summary_lines(outcome.prepared.advice))


def _on(verify: dict[str, Any]) -> str:
    if verify.get("device_kind") == "cpu":
        return " (device: cpu; torch trains on the CPU, no GPU was verified)"
    name = (verify.get("device") or {}).get("name")
    return f" (device: {name})" if name else ""
