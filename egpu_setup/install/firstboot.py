"""`egpu-setup firstboot`: a lab image's machine finishes its own setup, with nobody at it.

egpu-setup-firstboot.service runs it at boot and whenever an enclosure or an NVIDIA GPU is
plugged in, while /var/lib/egpu-setup/firstboot-pending exists (`install --root` leaves it):

1. an unauthorized Thunderbolt device the profile's policy names is enrolled (install/enrol.py:
   a pinned UUID, or only where the profile opts in the first device of a named model); then
   the GPU behind it is waited for;
2. with the eGPU visible, the configuration is installed again for it (`install --only config
   --enclosure UUID`: the udev rule or bolt keeps the enclosure authorized at every plug-in,
   and the rules match the card really there), the helper brings the driver up
   (`egpu-hotplug add`), and `verify --quick` runs on it;
3. with Secure Boot on and the lab's key in the image (`install --mok-key`), its enrolment is
   queued for MokManager (install/attention.py queue_lab_key), and the report's `mok` says
   mok-needed until it is enrolled, mok-enrolled after;
4. the outcome goes to /var/lib/egpu-setup/firstboot.json (what the fleet fetches; verify keeps
   its own report under reports/), and the marker is removed only when verify passed.

Without an eGPU (or with only devices the policy does not name) it ends with exit 0 and says so
("no-egpu", "not-enrolled"); the marker stays, so the next boot or plug-in tries again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egpu_setup.errors import EXIT_FAILED, EXIT_OK, EgpuSetupError
from egpu_setup.host.machine import Host, LiveHost, RootHost
from egpu_setup.install import enrol
from egpu_setup.log import get_logger
from egpu_setup.state.paths import StatePaths

log = get_logger("egpu_setup.install")

SCHEMA = "egpu-setup/firstboot/1"
REPORT_NAME = "firstboot.json"
HOTPLUG_HELPER = "/usr/local/bin/egpu-hotplug"


@dataclass(frozen=True)
class FirstbootOptions:
    profile: str
    venv: str
    enclosures: tuple[str, ...] = ()
    wait_s: int = enrol.ENROL_WAIT_S
    root_dir: str | None = None  # tests: a root-prefixed tree (sysfs writes land inside it)
    run_verify: bool = True


@dataclass(frozen=True)
class FirstbootOutcome:
    outcome: str  # no-egpu / not-enrolled / no-gpu-after-enrol / ready / passed / failed
    message: str
    enrolled: str | None = None
    devices: tuple[str, ...] = ()
    verify: dict[str, Any] | None = None
    marker_removed: bool = False
    report_path: str | None = None
    steps: tuple[str, ...] = field(default=())
    mok: str | None = None  # mok-needed / mok-enrolled (install/attention.py mok_status)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.outcome == "failed" else EXIT_OK

    def to_json(self, host: Host, profile: str) -> dict[str, Any]:
        machine_id = (host.read("/etc/machine-id") or "").strip()
        return {
            "schema": SCHEMA,
            "outcome": self.outcome,
            "message": self.message,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hostname": os.uname().nodename if host.kind == "live" else None,
            "machine_id_sha256": hashlib.sha256(machine_id.encode()).hexdigest()
            if machine_id
            else None,
            "profile": profile,
            "enrolled": self.enrolled,
            "devices": list(self.devices),
            "marker_removed": self.marker_removed,
            "steps": list(self.steps),
            "verify": self.verify,
            "mok": self.mok,
        }


def run_firstboot(options: FirstbootOptions, say: Callable[[str], None]) -> FirstbootOutcome:
    """Steps 1-4 of the module docstring; never raises for a missing eGPU."""
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.profile.load import load_profile

    host: Host = RootHost(options.root_dir) if options.root_dir else LiveHost()
    profile = load_profile(options.profile)
    policy = enrol.EnrolPolicy.of(profile.hotplug, options.enclosures)
    paths = StatePaths.for_root(host.root)
    facts = detect_host(host)
    done: list[str] = []
    devices = tuple(enrol.describe(d) for d in enrol.candidates(facts))
    enrolled = None
    if enrol.needs_enrolment(facts):
        choice = enrol.choose(enrol.candidates(facts), policy)
        refused = enrol.unpinned_refusal(choice, facts, profile.hotplug)
        if refused:
            outcome = FirstbootOutcome("not-enrolled", refused, devices=devices)
            return _finish(host, options, outcome, say)
        if choice.device is None:
            return _finish(
                host,
                options,
                FirstbootOutcome(
                    "not-enrolled",
                    f"no eGPU is visible and the profile names none of the waiting devices "
                    f"({choice.reason}); pin the lab's enclosures in hotplug.enclosure_unique_ids",
                    devices=devices,
                ),
                say,
            )
        done.append(enrol.apply_enrolment(host, paths, choice.device, facts, profile.hotplug))
        say(done[-1])
        enrolled = choice.device.unique_id
        seen = enrol.wait_for_egpu(host, options.wait_s)
        if seen is None:
            return _finish(
                host,
                options,
                FirstbootOutcome(
                    "no-gpu-after-enrol",
                    f"enrolled {enrol.describe(choice.device)}, but no NVIDIA GPU appeared "
                    f"within {options.wait_s} s: is the card powered and seated?",
                    enrolled=enrolled,
                    devices=devices,
                    steps=tuple(done),
                ),
                say,
            )
        facts = seen
    if not facts.nvidia_gpus:
        return _finish(
            host,
            options,
            FirstbootOutcome(
                "no-egpu",
                "no eGPU is connected: nothing to enrol or verify yet; this runs again at the "
                "next boot and when an enclosure is plugged in",
                devices=devices,
            ),
            say,
        )
    if host.kind == "live":
        done += _configure(options, profile.name, enrolled, say)
        done += _bring_up(host, options.wait_s, say)
    if not (options.run_verify and host.kind == "live"):
        why = "--no-verify" if not options.run_verify else "a root-prefixed tree (--root)"
        outcome = FirstbootOutcome(
            "ready",
            f"the eGPU is visible; verify not run ({why}): the marker stays",
            enrolled=enrolled,
            devices=devices,
            steps=tuple(done),
        )
        return _finish(host, options, outcome, say)
    report = _verify(options)
    ok = bool(report and report.get("ok"))
    outcome = FirstbootOutcome(
        "passed" if ok else "failed",
        "verify passed on the eGPU: first boot is done"
        if ok
        else "verify did not pass on the eGPU: see the verify report; this runs again at the "
        "next boot",
        enrolled=enrolled,
        devices=devices,
        verify=report,
        steps=tuple(done),
    )
    return _finish(host, options, outcome, say)


def _configure(
    options: FirstbootOptions, profile: str, enclosure: str | None, say: Callable[[str], None]
) -> list[str]:
    """`install --only config` for the eGPU that is now there (and its enclosure, pinned)."""
    from egpu_setup.install.options import InstallOptions
    from egpu_setup.install.pipeline import apply, prepare

    install = InstallOptions(
        profile=profile,
        yes=True,
        only="config",
        venv=options.venv,
        enclosure=enclosure,
        run_verify=False,
    )

    def refuse(_run: object) -> None:  # --yes: never asked
        raise AssertionError("install --yes asked for confirmation")

    outcome = apply(prepare(install), warn=say, confirm=refuse)
    steps = len(outcome.result.steps) if outcome.result else 0
    return [f"install --only config: {steps} step(s)" if steps else "configuration up to date"]


def _bring_up(host: Host, wait_s: int, say: Callable[[str], None]) -> list[str]:
    """The hot-plug helper's bring-up (driver bound, device node there), bounded by wait_s."""
    if host.which("egpu-hotplug") is None:
        return []
    res = host.run([HOTPLUG_HELPER, "add", str(wait_s)], timeout=wait_s + 30)
    tail = (res.err or res.out).strip().splitlines()[-1:] or [f"exit {res.rc}"]
    say(f"egpu-hotplug add: {tail[0]}")
    return [f"egpu-hotplug add: exit {res.rc}"]


def _verify(options: FirstbootOptions) -> dict[str, Any] | None:
    from egpu_setup.install.pipeline import quick_verify

    return quick_verify(options.venv)


def _finish(
    host: Host, options: FirstbootOptions, outcome: FirstbootOutcome, say: Callable[[str], None]
) -> FirstbootOutcome:
    """Remove the marker after a passed verify; write the report; say the outcome."""
    from egpu_setup.detect.system import probe_secure_boot
    from egpu_setup.install.attention import mok_status, queue_lab_key
    from egpu_setup.state.atomic import atomic_write
    from egpu_setup.state.verify_marker import remove_firstboot_marker

    removed = remove_firstboot_marker(host) if outcome.outcome == "passed" else False
    paths = StatePaths.for_root(host.root)
    report = paths.state_dir / REPORT_NAME
    secure_boot = probe_secure_boot(host)
    queued = queue_lab_key(host, secure_boot)  # before the status: a queued key is mok-needed
    if queued:
        say(queued)
    outcome = dataclasses.replace(
        outcome,
        marker_removed=removed,
        report_path=str(report),
        steps=(*outcome.steps, *([queued] if queued else [])),
        mok=mok_status(host, secure_boot),
    )
    data = outcome.to_json(host, options.profile)
    try:
        text = (json.dumps(data, indent=2) + "\n").encode()
        atomic_write(report, text, 0o644, anchor=paths.anchor)
    except OSError as exc:
        raise EgpuSetupError(
            f"cannot write the first-boot report {report}: {exc.strerror or exc}",
            "run it as root (it is egpu-setup-firstboot.service's command)",
        ) from exc
    say(f"first boot: {outcome.outcome}: {outcome.message}")
    return outcome
