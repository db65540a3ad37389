"""`egpu-setup kernels check`: after a kernel or driver package changed (the apt hook), and at
boot (egpu-setup-kernels.service), give every installed kernel its NVIDIA module.

What DKMS can build it builds (`dkms autoinstall -k <release>`, one kernel at a time, so one
failed build does not hide the others); what it cannot is kept as the finding
`nvidia-module-missing-for-kernel` in <state>/kernels.json, which doctor reads. A failed build
is logged and recorded, never raised: the caller is apt's Post-Invoke.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.detect.kernels import KernelFacts, probe_kernels
from egpu_setup.doctor.kernels import KernelVerdict, judge_kernels, kernel_findings
from egpu_setup.errors import ExecutionError
from egpu_setup.execute.console import show_line
from egpu_setup.execute.dkms import DKMS_BUILD_TIMEOUT_S
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.execute")

SCHEMA_KERNELS = "egpu-setup/kernels/1"


KERNELS_FILE = "kernels.json"


@dataclass(frozen=True)
class KernelCheck:
    verdicts: tuple[KernelVerdict, ...]  # after the builds
    built: tuple[str, ...]  # kernels DKMS built a module for in this run
    failed: tuple[str, ...]  # kernels whose `dkms autoinstall` failed

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_KERNELS,
            "ok": all(v.state == "ok" for v in self.verdicts),
            "kernels": [
                {"release": v.release, "state": v.state, "running": v.running, "fix": v.fix}
                for v in self.verdicts
            ],
            "built": list(self.built),
            "failed": list(self.failed),
            "findings": [f.to_json() for f in kernel_findings(self.verdicts)],
        }


def check_kernels(host: Host, *, rebuild: bool = True) -> KernelCheck:
    """Judge every installed kernel; with `rebuild`, build what DKMS can and judge again."""
    facts = probe_kernels(host)
    verdicts = judge_kernels(facts)
    todo = [v.release for v in verdicts if v.state == "rebuild"]
    if not rebuild or not todo or host.which("dkms") is None:
        return KernelCheck(verdicts, (), ())
    for release in todo:
        log.warning("building the NVIDIA module for kernel %s (dkms autoinstall)", release)
        try:
            host.run_checked(
                ["dkms", "autoinstall", "-k", release],
                timeout=DKMS_BUILD_TIMEOUT_S,
                on_line=show_line,
            )
        except ExecutionError as exc:
            log.warning("dkms autoinstall -k %s failed: %s", release, exc.message)
    # what was built is judged by what is there afterwards, not by dkms's exit status
    again: KernelFacts = probe_kernels(host, read_dkms=True)
    verdicts = judge_kernels(again)
    ok = {v.release for v in verdicts if v.state == "ok"}
    return KernelCheck(
        verdicts,
        tuple(r for r in todo if r in ok),
        tuple(r for r in todo if r not in ok),
    )


def save_check(state_dir: Path, anchor: Path, check: KernelCheck) -> bool:
    """Keep the result in <state>/kernels.json (doctor's copy); False when it
    was unchanged, so a hook run that found nothing new writes nothing."""
    from egpu_setup.state.atomic import atomic_write, make_dirs
    from egpu_setup.state.paths import read_state

    data = (json.dumps(check.to_json(), indent=2, sort_keys=True) + "\n").encode()
    path = state_dir / KERNELS_FILE
    if read_state(path, anchor=anchor) == data:
        return False
    make_dirs(state_dir, anchor=anchor)
    atomic_write(path, data, 0o644, anchor=anchor)
    return True
