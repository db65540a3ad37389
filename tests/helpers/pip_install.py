"""A torch-only plan and its run through the real executor, into a venv at any path (the pip
tests: a loopback index, a venv on a loop-mounted ext4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from egpu_setup.execute.executor import ExecOptions, ExecResult, execute
from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import Plan
from egpu_setup.state.lock import RunLock
from egpu_setup.state.paths import StatePaths
from helpers import install_values as values


def plan_torch(venv: Path, requirements: tuple[str, ...], index: str, **options: Any) -> Plan:
    return build_plan(
        values.facts(),
        values.profile(),
        values.resolution(torch_requirements=requirements, index_url=index),
        (),
        LiveHost(),
        PlanOptions(only=frozenset({"torch"}), venv=str(venv), target="live", **options),
    )


def install_torch(
    venv: Path,
    requirements: tuple[str, ...],
    index: str,
    installer: str = "pip",
    **options: Any,
) -> tuple[Plan, ExecResult]:
    """plan_torch's plan (`options`: more PlanOptions), run by the executor as root."""
    plan = plan_torch(venv, requirements, index, **options)
    paths = StatePaths.for_root(Path("/"))
    with RunLock(paths.lock):
        return plan, execute(
            plan, LiveHost(), paths, ExecOptions(installer=installer), lambda _t: None
        )
