"""The install report: <state>/reports/install-<time>.json, on success and on failure alike,
for `egpu-setup report` (schema egpu-setup/install/1)."""

from __future__ import annotations

import time
from typing import Any

from egpu_setup.errors import EXIT_FAILED, EXIT_REBOOT, EgpuSetupError
from egpu_setup.execute.executor import ExecResult
from egpu_setup.host.identity import machine_id_sha256
from egpu_setup.install.prepared import Prepared
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.install")


def install_report(
    run: Prepared,
    started: float,
    result: ExecResult | None,
    verify: dict[str, Any] | None,
    error: EgpuSetupError | None,
) -> dict[str, Any]:
    steps = [s.to_json() for s in result.steps] if result else []
    torch = run.resolution.torch.version if run.resolution.torch else None
    ok = error is None and (verify is None or bool(verify.get("ok")))
    if error is not None:
        exit_code = error.exit_code
    elif not ok:
        exit_code = EXIT_FAILED
    else:
        exit_code = EXIT_REBOOT if result and result.reboot_required else 0
    return {
        "schema": "egpu-setup/install/1",
        "ok": ok,
        "exit_code": exit_code,
        "changed": sum(1 for s in steps if s.get("status") == "done"),
        "reboot_required": result.reboot_required if result else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "profile": run.profile.name,
        # which machine (or image, under --root) this is: `egpu-setup report` keeps machines
        # apart by it, never by the hostname alone (cloned laptops share one)
        "machine_id_sha256": machine_id_sha256(run.target),
        "host": run.facts.fleet_summary(
            run.facts.egpu, hostname=run.target.read_attr("/proc/sys/kernel/hostname"), torch=torch
        ),
        "resolution": run.resolution.to_json(),
        "steps": steps,
        "verify_ok": verify.get("ok") if verify else None,
        # "cpu": the verify that ran trained on the CPU (a CPU install), no GPU was verified
        "verify_device": verify.get("device_kind") if verify else None,
        "error": {"message": error.message, "hint": error.hint} if error else None,
    }


def save_install_report(
    run: Prepared,
    started: float,
    result: ExecResult | None,
    verify: dict[str, Any] | None,
    error: EgpuSetupError | None,
) -> None:
    """Save it; a report that cannot be written never turns a good install into a failure."""
    from egpu_setup.state.reports import BUILD_REPORTS, REPORTS, save_report
    from egpu_setup.text import redact_tree

    # 0644, collected from every laptop: no token of an index URL goes with it (text.py)
    data = redact_tree(install_report(run, started, result, verify, error))
    # an image's build report would be collected from every machine made from it as its own
    folder = BUILD_REPORTS if run.target.kind == "root" else REPORTS
    try:
        path = save_report(
            run.paths.state_dir, "install", data, started, folder, anchor=run.paths.anchor
        )
    except OSError as exc:
        log.warning("could not save the install report: %s", exc)
        return
    except EgpuSetupError as exc:  # a link planted where the reports go: said, not followed
        log.warning("could not save the install report: %s", exc.message)
        return
    log.info("report: %s", path)
