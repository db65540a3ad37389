"""The install pipeline, one way: prepare (detect -> resolve -> render -> plan), then show it,
or apply it (preflight, the lock, the same plan again under it, execute, verify).

Every stage takes typed values and returns one; nothing here prints or reads the terminal: the
command passes `warn` and `confirm` for that, and prints the Outcome.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.execute.executor import ExecOptions, ExecResult
from egpu_setup.install.options import InstallOptions
from egpu_setup.install.prepared import NOTHING_TO_DO, Outcome, Prepared
from egpu_setup.log import get_logger
from egpu_setup.state.paths import StatePaths

if TYPE_CHECKING:
    from egpu_setup.detect.facts import HostFacts
    from egpu_setup.host.machine import Host
    from egpu_setup.install.review import Review
    from egpu_setup.plan.steps import Plan
    from egpu_setup.profile.types import Profile
    from egpu_setup.resolve.resolution import Resolution

log = get_logger("egpu_setup.install")


VERIFY_TIMEOUT_S = 300


def prepare(options: InstallOptions) -> Prepared:
    """Detect, resolve, render and plan; nothing on the target changes. UsageError on bad flags."""
    from egpu_setup.compat.matrix import select_matrix
    from egpu_setup.image.additions import finish_plan
    from egpu_setup.install import inputs
    from egpu_setup.install.enrol import EnrolPolicy, with_enclosure
    from egpu_setup.install.enrol import notes as enrol_notes
    from egpu_setup.install.mok_key import with_lab_key
    from egpu_setup.install.offline import narrow_to_bundle, open_bundle, tool_wheels
    from egpu_setup.plan.build import build_plan
    from egpu_setup.plan.options import parse_only
    from egpu_setup.profile.load import load_profile
    from egpu_setup.resolve.resolver import resolve

    only = parse_only(options.only)
    bundle = open_bundle(options) if options.bundle_dir else None
    inputs.check_flags(options, bundle)
    if options.profile or bundle is None:
        loaded = load_profile(options.profile or "")
    else:
        loaded = bundle.load_profile()  # checked against the pinned manifest first
    profile = with_enclosure(loaded, options.enclosure)
    target, facts_host = inputs.hosts(options)
    facts = inputs.facts_of(target, facts_host)
    inputs.refuse_non_nvidia_egpu(facts)
    only, warnings = inputs.scope(facts, profile, only)
    warnings += enrol_notes(facts, EnrolPolicy.of(profile.hotplug))
    resolution = resolve(
        facts, profile, inputs.constraints(options, profile), select_matrix(options.matrix)
    ).mirrored(options.index_url)
    source = None
    if bundle is not None:
        resolution, source = narrow_to_bundle(bundle, resolution, only, target)
    tool = inputs.tool_choice(options, target, facts, only, tool_wheels(bundle))
    rendered = inputs.render(options, facts, profile, resolution, target, only, tool.path)
    paths = StatePaths.for_root(target.root)
    manifest, note = inputs.manifest(paths)
    warnings += note
    plan_options = inputs.plan_options(options, target, paths, only, source, profile.driver.hold)
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
    plan = finish_plan(plan, tool, target, facts, profile, only, options.lock_timeout)
    plan = with_lab_key(plan, target, only, options.mok_key, options.lock_timeout)
    stale = inputs.stale_warning(paths)
    warnings += [stale] if stale else []
    warnings += [*resolution.warnings, *plan.warnings, *_without_waiting(rendered.notes, facts)]
    seen = _review(facts, profile, resolution, plan, target, options, only)
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
        tuple(warnings + list(seen.warnings)),
        stale,
        actions=seen.actions,
        mok_key=seen.mok_key,
        mismatch=seen.mismatch,
        advice=seen.advice,
    )


def _without_waiting(notes: tuple[str, ...], facts: HostFacts) -> list[str]:
    """The render notes less the one enrolment's note already says (what waits for
    authorization and what install enrols), so the dry run says it once."""
    from egpu_setup.install.enrol import needs_enrolment
    from egpu_setup.render.thunderbolt import WAITING

    if not needs_enrolment(facts):
        return list(notes)
    return [n for n in notes if not n.startswith(WAITING)]


def _review(
    facts: HostFacts,
    profile: Profile,
    resolution: Resolution,
    plan: Plan,
    target: Host,
    options: InstallOptions,
    only: frozenset[str],
) -> Review:
    """What a person must do, the card check, known problems and the summary (install/review)."""
    from egpu_setup.install.review import review

    return review(
        facts,
        profile,
        resolution,
        plan,
        target,
        mode=options.mode or profile.mode,
        only=only,
        venv=options.venv_path,
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
    from egpu_setup.install.attention import refuse_blocking
    from egpu_setup.install.preflight import preflight
    from egpu_setup.install.report import save_install_report
    from egpu_setup.state.lock import RunLock

    refuse_blocking(prepared.actions, prepared.options.force, warn)  # before any change
    preflight(prepared.plan, prepared.target, prepared.paths, prepared.facts, prepared.plan_options)
    with RunLock(prepared.paths.lock, prepared.paths.anchor):
        run = prepare(prepared.options)  # plan again: another run may have finished meanwhile
        for w in run.warnings:
            if w != run.stale_warning:
                warn(w)
        if run.plan.empty:
            return _nothing_to_do(run)
        _consent(run, confirm)
        started = time.time()
        options = ExecOptions.from_env(force=run.options.force)
        try:
            result = execute(run.plan, run.target, run.paths, options)
        except EgpuSetupError as exc:
            save_install_report(run, started, None, None, exc)
            raise
    try:
        _require_enrolled_key(run)
    except EgpuSetupError as exc:
        save_install_report(run, started, result, None, exc)
        raise
    verify = _verify_after(run, result)
    save_install_report(run, started, result, verify, None)
    return Outcome(run, result, verify)


def _nothing_to_do(run: Prepared) -> Outcome:
    """The machine matches the plan: after the reboot an install asked for, the boot-time
    verify's result comes with it (and decides the exit code); a key still not enrolled is a
    console step (exit 4). A report is saved either way (`changed: 0`), so a fleet's newest
    report is this run's, not the run that asked for the reboot."""
    from egpu_setup.install.day_after import after_reboot
    from egpu_setup.install.report import save_install_report

    started = time.time()
    try:
        _require_enrolled_key(run)
    except EgpuSetupError as exc:
        save_install_report(run, started, None, None, exc)
        raise
    seen = after_reboot(run.paths, run.target)
    verify = seen.report if seen is not None else None
    save_install_report(run, started, None, verify, None)
    return Outcome(run, verify=verify, message=NOTHING_TO_DO, seen=seen)


def _consent(run: Prepared, confirm: Callable[[Prepared], None]) -> None:
    """--yes agrees to the plan, never to a change of the boot configuration, and not to a
    plan for another card than the profile's unless --force says so."""
    if run.mismatch and run.options.yes and not run.options.force:
        raise UsageError(
            f"{run.mismatch}; nothing was changed",
            "pass the profile of the detected card (see `egpu-setup profiles list`, or "
            "generic-nvidia), or add --force to install this plan for it anyway",
        )
    if run.plan.consent_steps and run.options.yes:
        what = ", ".join(" ".join(s.argv) for s in run.plan.consent_steps)
        raise UsageError(
            f"the plan changes the boot configuration ({what}): --yes cannot consent to that",
            "run without --yes and confirm the plan, or run those commands yourself",
        )
    if not run.options.yes:
        confirm(run)


def _require_enrolled_key(run: Prepared) -> None:
    """Secure Boot: DKMS made its signing key with the first build; after the automatic steps,
    exit 4 with the console steps while it is not enrolled (install/attention.py)."""
    from egpu_setup.install.attention import require_enrolled_key

    mok = any(a.id == "mok-enrolment" for a in run.actions)
    if mok and run.mok_key and run.target.kind == "live":
        require_enrolled_key(run.target, run.mok_key)


def _verify_after(run: Prepared, result: ExecResult) -> dict[str, Any] | None:
    """`verify --quick` when torch went in on the running system and no reboot is due; on the
    CPU when the CPU build went in (a CI box, a laptop away from its eGPU)."""
    torch_done = any(s.kind == "pip-install" and s.status == "done" for s in result.steps)
    live = run.target.kind == "live"
    if not (run.options.run_verify and torch_done and not result.reboot_required and live):
        return None
    torch = run.resolution.torch
    device = "cpu" if torch is not None and torch.variant == "cpu" else "auto"
    return quick_verify(run.plan_options.venv, device)


# egpu-setup run again as a child: isolated (-I), and the folder this very package was imported
# from put first on sys.path by hand, so the child runs the code that is running now (from a
# checkout too), never an `egpu_setup/` a user left in the working directory (`-m` would look
# there first without -I, and find no checkout with it).
_SELF = "import sys; sys.path.insert(0, sys.argv.pop(1)); from egpu_setup.cli import main; main()"


def self_argv() -> list[str]:
    """The argv that starts this egpu-setup again (its arguments follow)."""
    import egpu_setup

    home = Path(egpu_setup.__file__).resolve().parent.parent
    return [sys.executable, "-I", "-c", _SELF, str(home)]


def quick_verify(venv: str, device: str = "auto") -> dict[str, Any] | None:
    """`egpu-setup verify --quick --json` in a child process (a hung GPU cannot hang us)."""
    import json

    from egpu_setup.host.machine import LiveHost
    from egpu_setup.host.trust import run_as

    argv = [*self_argv(), "verify", "--quick", "--json", "--venv", venv, "--device", device]
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
