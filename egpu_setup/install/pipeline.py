"""The install pipeline, one way: prepare (detect -> resolve -> render -> plan), then show it,
or apply it (preflight, the lock, the same plan again under it, execute, verify).

Every stage takes typed values and returns one; nothing here prints or reads the terminal: the
command passes `warn` and `confirm` for that, and prints the Outcome.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.execute.executor import ExecOptions, ExecResult
from egpu_setup.install.options import InstallOptions
from egpu_setup.install.prepared import NOTHING_TO_DO, Outcome, Prepared
from egpu_setup.state.paths import StatePaths

log = logging.getLogger("egpu_setup.install")


VERIFY_TIMEOUT_S = 300


def prepare(options: InstallOptions) -> Prepared:
    """Detect, resolve, render and plan; nothing on the target changes. UsageError on bad flags."""
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.install import inputs
    from egpu_setup.install.offline import narrow_to_bundle, open_bundle
    from egpu_setup.plan.build import build_plan
    from egpu_setup.plan.options import parse_only
    from egpu_setup.profile.load import load_profile
    from egpu_setup.resolve.resolver import resolve

    only = parse_only(options.only)
    bundle = open_bundle(options) if options.bundle_dir else None
    inputs.check_flags(options, bundle)
    if options.profile or bundle is None:
        profile = load_profile(options.profile or "")
    else:
        profile = bundle.load_profile()  # checked against the pinned manifest first
    target, facts_host = inputs.hosts(options)
    facts = detect_host(facts_host)
    inputs.refuse_non_nvidia_egpu(facts)
    only, warnings = inputs.scope(facts, profile, only)
    resolution = resolve(facts, profile, inputs.constraints(options, profile))
    source = None
    if bundle is not None:
        resolution, source = narrow_to_bundle(bundle, resolution, only, target)
    rendered = inputs.render(options, facts, profile, resolution, target, only)
    paths = StatePaths.for_root(target.root)
    manifest, note = inputs.manifest(paths)
    warnings += note
    plan_options = inputs.plan_options(options, target, paths, only, source)
    plan = build_plan(
        facts,
        profile,
        resolution,
        rendered.files,
        target,
        plan_options,
        manifest,
        rendered.commands,
        rendered.links,
    )
    stale = inputs.stale_warning(paths)
    warnings += [stale] if stale else []
    warnings += [*resolution.warnings, *plan.warnings, *rendered.notes]
    return Prepared(
        options,
        facts,
        profile,
        resolution,
        rendered,
        plan,
        target,
        paths,
        plan_options,
        tuple(warnings),
        stale,
    )


def apply(
    prepared: Prepared,
    *,
    warn: Callable[[str], None],
    confirm: Callable[[Prepared], None],
) -> Outcome:
    """Execute under the lock, verify, keep a report. `confirm` shows the plan and returns when
    the user agreed (it raises to refuse); it is not called with --yes."""
    from egpu_setup.execute.executor import execute
    from egpu_setup.install.preflight import preflight
    from egpu_setup.install.report import save_install_report
    from egpu_setup.state.lock import RunLock

    preflight(prepared.plan, prepared.target, prepared.paths, prepared.facts, prepared.plan_options)
    with RunLock(prepared.paths.lock):
        run = prepare(prepared.options)  # plan again: another run may have finished meanwhile
        for w in run.warnings:
            if w != run.stale_warning:
                warn(w)
        if run.plan.empty:
            return Outcome(run, message=NOTHING_TO_DO)
        _consent(run, confirm)
        started = time.time()
        options = ExecOptions.from_env(force=run.options.force)
        try:
            result = execute(run.plan, run.target, run.paths, options)
        except EgpuSetupError as exc:
            save_install_report(run, started, None, None, exc)
            raise
    try:
        _require_enrolled_key(run, result)
    except EgpuSetupError as exc:
        save_install_report(run, started, result, None, exc)
        raise
    verify = _verify_after(run, result)
    save_install_report(run, started, result, verify, None)
    return Outcome(run, result, verify)


def _consent(run: Prepared, confirm: Callable[[Prepared], None]) -> None:
    """--yes agrees to the plan, never to a change of the boot configuration."""
    if run.plan.consent_steps and run.options.yes:
        what = ", ".join(" ".join(s.argv) for s in run.plan.consent_steps)
        raise UsageError(
            f"the plan changes the boot configuration ({what}): --yes cannot consent to that",
            "run without --yes and confirm the plan, or run those commands yourself",
        )
    if not run.options.yes:
        confirm(run)


def _require_enrolled_key(run: Prepared, result: ExecResult) -> None:
    """Secure Boot: dkms made its signing key with the first build; exit 4 before the reboot."""
    from egpu_setup.install.preflight import builds_dkms_module, require_enrolled_key

    driver_done = any(s.kind == "apt-install" and s.status == "done" for s in result.steps)
    if not driver_done or not builds_dkms_module(run.plan):
        return
    if run.facts.os.secure_boot and run.target.kind == "live":
        require_enrolled_key(run.target)


def _verify_after(run: Prepared, result: ExecResult) -> dict[str, Any] | None:
    """`verify --quick` when torch went in on the running system and no reboot is due."""
    torch_done = any(s.kind == "pip-install" and s.status == "done" for s in result.steps)
    live = run.target.kind == "live"
    if not (run.options.run_verify and torch_done and not result.reboot_required and live):
        return None
    return quick_verify(run.plan_options.venv)


def quick_verify(venv: str) -> dict[str, Any] | None:
    """`egpu-setup verify --quick --json` in a child process (a hung GPU cannot hang us)."""
    import json

    from egpu_setup.host.machine import LiveHost
    from egpu_setup.host.trust import run_as

    argv = [sys.executable, "-m", "egpu_setup", "verify", "--quick", "--json", "--venv", venv]
    try:
        # the tool's own Python, under the same rule as any other (host/trust.py)
        owner = run_as(sys.executable)
        res = LiveHost().run(argv, timeout=VERIFY_TIMEOUT_S, run_as=owner)
    except EgpuSetupError as exc:  # verify's failure is reported, it does not undo the install
        log.warning("verify did not run: %s", exc.message)
        return None
    try:
        report = json.loads(res.out)
    except ValueError:
        log.warning("verify printed no JSON (exit %s): %s", res.rc, res.err.strip()[-300:])
        return None
    return report if isinstance(report, dict) else None
