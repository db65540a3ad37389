"""diagnose: pure over facts and inputs; every finding, worst first; the `doctor --json` shape."""

from __future__ import annotations

from typing import Any

from egpu_setup.detect.facts import HostFacts
from egpu_setup.doctor.catalog import ORDER, SCHEMA_FINDINGS, SEVERITIES
from egpu_setup.doctor.checks import run_checks
from egpu_setup.doctor.findings import DoctorInput, Finding
from egpu_setup.doctor.torchcheck import TorchInfo


def diagnose(
    facts: HostFacts, inputs: DoctorInput, torch_info: TorchInfo | None = None
) -> tuple[Finding, ...]:
    """Pure: every finding, errors first, then in catalog order."""
    found = run_checks(facts, inputs, torch_info)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return tuple(sorted(found, key=lambda f: (rank[f.severity], ORDER[f.id])))


def report_json(findings: tuple[Finding, ...], inputs: DoctorInput | None = None) -> dict[str, Any]:
    """The `doctor --json` contract (docs/design.md):
    {"schema", "findings": [{id, severity, summary, evidence, fix}]}, plus counts and sources."""
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    data: dict[str, Any] = {
        "schema": SCHEMA_FINDINGS,
        "findings": [f.to_json() for f in findings],
        "counts": counts,
        "ok": counts["error"] == 0,
    }
    if inputs is not None:
        data["sources"] = inputs.sources()
    return data
