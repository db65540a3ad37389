"""The install report: <state>/reports/install-<time>.json, on success and on failure alike,
for `egpu-setup report` (schema egpu-setup/install/1)."""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from egpu_setup.errors import EXIT_FAILED, EXIT_REBOOT, EgpuSetupError
from egpu_setup.execute.executor import ExecResult
from egpu_setup.host.machine import Host
from egpu_setup.install.prepared import Prepared

log = logging.getLogger("egpu_setup.install")


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
        "host": run.facts.fleet_summary(
            run.facts.egpu, hostname=run.target.read_attr("/proc/sys/kernel/hostname"), torch=torch
        ),
        "machine_id": machine_id(run.target),
        "resolution": run.resolution.to_json(),
        "steps": steps,
        "verify_ok": verify.get("ok") if verify else None,
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
    from egpu_setup.state.reports import save_report
    from egpu_setup.text import redact_tree

    # 0644, collected from every laptop: no token of an index URL goes with it (text.py)
    data = redact_tree(install_report(run, started, result, verify, error))
    try:
        path = save_report(run.paths.state_dir, "install", data, started)
    except OSError as exc:
        log.warning("could not save the install report: %s", exc)
        return
    except EgpuSetupError as exc:  # a link planted where the reports go: said, not followed
        log.warning("could not save the install report: %s", exc.message)
        return
    log.info("report: %s", path)


def machine_id(target: Host) -> str | None:
    """sha256 of the target's /etc/machine-id (machine-id(5)): tells apart laptops that share a
    hostname (cloned from one image) in `report`, without the id itself leaving the machine."""
    text = target.read("/etc/machine-id", limit=4096)
    value = text.strip() if text else ""
    return hashlib.sha256(value.encode()).hexdigest() if value else None
