"""`run_verify`: one whole verify run (host checks, the child, the report), never importing torch.

Order: validate the options (bad input is exit 2 before anything runs), take the verify lock
(exit 5 if another verify runs), read the previous run's progress marker, detect the host,
run the host checks, write the `start` marker, run the child under its timeout, write `end`,
assemble the report. Saving and printing are the caller's (commands/verify.py).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host, LiveHost
from egpu_setup.verify.checks import Check
from egpu_setup.verify.progress import ProgressLog
from egpu_setup.verify.report import VerifyReport
from egpu_setup.verify.runner import ChildOutcome, run_child

log = logging.getLogger("egpu_setup.verify")

DEFAULT_VENV = "/opt/egpu-setup/venv"  # DESIGN.md, "Files on a provisioned machine"
SKIPPABLE = ("allocation", "bandwidth", "matmul", "amp", "burn-in", "ddp")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d{1,2})$")

# Base time limits: import torch (1-2 s; CUDA init and lazy module loading can take 10-30 s on a
# cold GPU), then the steps; --burn-in adds its own minutes.
TIMEOUT_QUICK_S = 120.0
TIMEOUT_FULL_S = 300.0

# Used when no --profile is given: the same defaults the profile schema documents
# (egpu_setup/data/profile.schema.json), minus the plain-slot bandwidth floor, which depends on
# the slot's width.
DEFAULT_EXPECT: dict[str, Any] = {
    "fp32_tflops": None,
    "fp16_tflops": None,
    "min_link_gen": None,
    "min_link_width": None,
    "h2d_gbps": {"thunderbolt": 2.0, "usb4": 2.0, "oculink": 5.0},
    "amp_steps": 200,
    "amp_loss_drop": 0.5,
    "max_temp_c": 87.0,
    "max_power_w": None,
}


@dataclass(frozen=True)
class VerifyOptions:
    python: str | None = None
    venv: str | None = None
    device: str = "auto"
    quick: bool = False
    timeout_s: float | None = None
    burn_in_minutes: float = 0.0
    profile: str | None = None
    skip: tuple[str, ...] = ()


def validate(options: VerifyOptions) -> None:
    """Raise UsageError (exit 2) for any bad option, before anything runs."""
    if not _DEVICE.match(options.device):
        raise UsageError(
            f"--device {options.device!r} is not one of auto, cuda, cuda:N, cpu",
            "use --device auto (the eGPU), cuda, cuda:1 or cpu",
        )
    if options.python and options.venv:
        raise UsageError("--python and --venv name two interpreters", "pass only one of them")
    if not 0 <= options.burn_in_minutes <= 24 * 60:
        raise UsageError(
            f"--burn-in {options.burn_in_minutes:g} is out of range",
            "give minutes between 0 and 1440",
        )
    if options.timeout_s is not None and not 0 < options.timeout_s <= 7 * 24 * 3600:
        raise UsageError(f"--timeout {options.timeout_s:g} is out of range", "give seconds above 0")
    unknown = [s for s in options.skip if s not in SKIPPABLE]
    if unknown:
        raise UsageError(
            f"--skip {','.join(unknown)}: unknown step", f"steps: {', '.join(SKIPPABLE)}"
        )


def target_python(options: VerifyOptions) -> tuple[str, bool]:
    """(interpreter path, isolated) of the Python to verify; UsageError when it is not there."""
    if options.python:
        path = Path(options.python)
        if path.is_dir():
            raise UsageError(
                f"--python {path} is a directory", "pass the interpreter itself, or use --venv DIR"
            )
        found = shutil.which(str(path)) if os.sep not in str(path) else str(path)
        if not found or not Path(found).is_file() or not os.access(found, os.X_OK):
            raise UsageError(
                f"target Python not found: {path}",
                "pass an existing interpreter, e.g. --python $(command -v python3)",
            )
        return found, False
    venv = Path(options.venv or os.environ.get("EGPU_SETUP_VENV") or DEFAULT_VENV)
    python = venv / "bin" / "python"
    if not python.is_file() or not os.access(python, os.X_OK):
        where = "--venv" if options.venv else "the default venv"
        raise UsageError(
            f"no Python at {python} ({where})",
            "install torch first (`egpu-setup install --profile NAME`), or pass --venv DIR / "
            "--python PATH",
        )
    # not resolved: a venv's python is a symlink to the base interpreter, and only the link's
    # location makes it the venv
    return str(python), True


def default_timeout(options: VerifyOptions) -> float:
    base = TIMEOUT_QUICK_S if options.quick else TIMEOUT_FULL_S
    return base + options.burn_in_minutes * 60.0 * 1.2


def state_dir() -> Path:
    """Where verify keeps its marker and reports: <state>/ (EGPU_SETUP_STATE_DIR overrides).

    Falls back to the user's XDG state directory when the system one is not writable (verify
    as a normal user), so the hang marker still works.
    """
    override = os.environ.get("EGPU_SETUP_STATE_DIR")
    base = Path(override) if override else Path("/var/lib/egpu-setup")
    try:
        (base / "verify").mkdir(parents=True, exist_ok=True)
        if os.access(base / "verify", os.W_OK):
            return base
    except OSError:
        pass
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    fallback = Path(xdg) / "egpu-setup"
    log.warning("%s is not writable; keeping verify state in %s", base, fallback)
    (fallback / "verify").mkdir(parents=True, exist_ok=True)
    return fallback


def expectations(profile: Any, facts: HostFacts | None) -> dict[str, Any]:
    """The child's thresholds: the profile's `expect`, else defaults plus the GPU table's peaks."""
    if profile is not None:
        exp = profile.expect
        out = {k: getattr(exp, k, DEFAULT_EXPECT[k]) for k in DEFAULT_EXPECT}
        out["h2d_gbps"] = dict(out["h2d_gbps"] or {})
        return out
    out = dict(DEFAULT_EXPECT)
    egpu = _target_gpu(facts)
    if egpu is not None and egpu.device_id:
        try:
            from egpu_setup.compat.gpus import gpu_by_id
        except ImportError:
            return out
        model = gpu_by_id(egpu.device_id)
        if model is not None:
            out["fp32_tflops"] = model.fp32_tflops
            out["fp16_tflops"] = model.fp16_tflops
    return out


def _target_gpu(facts: HostFacts | None):
    if facts is None:
        return None
    if facts.egpu is not None:
        return facts.egpu
    gpus = facts.nvidia_gpus
    return gpus[0] if len(gpus) == 1 else None


def _tb_generation(facts: HostFacts | None) -> int | None:
    # The tunnel runs at the lower of the host router's and the enclosure's generation.
    gens = [d.generation for d in facts.thunderbolt.devices if d.generation] if facts else []
    return min(gens) if gens else None


def load_profile_option(name: str | None) -> Any:
    if name is None:
        return None
    try:
        from egpu_setup.profile.load import load_profile
    except ImportError as exc:  # pragma: no cover - the profiles module ships with the package
        raise UsageError(f"cannot load profile {name!r}: {exc}", "reinstall egpu-setup") from exc
    return load_profile(name)


def detect_facts(host: Host) -> HostFacts | None:
    try:
        from egpu_setup.detect.probe import detect_host
    except ImportError:  # pragma: no cover - detect ships with the package
        log.warning("host detection is unavailable; skipping the host checks")
        return None
    return detect_host(host, run_smi=True)


def run_verify(
    options: VerifyOptions,
    host: Host | None = None,
    facts: HostFacts | None = None,
) -> VerifyReport:
    """Run verify as `options` say; `facts` replaces detection (tests, recorded hosts)."""
    from egpu_setup.state.lock import RunLock

    validate(options)
    python, isolated = target_python(options)
    profile = load_profile_option(options.profile)
    timeout = options.timeout_s or default_timeout(options)
    cpu = options.device == "cpu"
    state = state_dir()
    with RunLock(state / "verify" / "verify.lock"):
        progress = ProgressLog(state / "verify")
        previous = progress.previous()
        checks: list[Check] = []
        if previous is not None:
            checks.append(
                Check(
                    "previous-run",
                    "warn",
                    previous.describe() + ": the machine probably locked up or rebooted",
                    value={"step": previous.step, "started": previous.started},
                    hint=f"if it hung in `{previous.step}`, this GPU/enclosure may hard-lock under "
                    "CUDA (see `egpu-setup doctor`); `--skip STEP` runs the rest",
                )
            )
        if not cpu:
            host = host or LiveHost()
            if facts is None:
                facts = detect_facts(host)
            from egpu_setup.verify.host_checks import probe_host_checks

            checks.extend(probe_host_checks(host, facts))
        egpu = facts.egpu if facts is not None else None
        config: dict[str, Any] = {
            "device": options.device,
            "quick": options.quick,
            "burn_in_s": options.burn_in_minutes * 60.0,
            "skip": list(options.skip),
            "expect": expectations(profile, facts),
            "egpu": None
            if egpu is None
            else {
                "pci_address": egpu.pci_address,
                "name": egpu.name,
                "connection": egpu.connection,
                "compute_capability": egpu.compute_capability,
                "tb_generation": _tb_generation(facts),
            },
            "nvidia_gpus": [g.pci_address for g in facts.nvidia_gpus] if facts else [],
            "driver_cuda": facts.nvidia.cuda_version if facts else None,
        }
        work = Path(tempfile.mkdtemp(prefix="egpu-setup-verify-"))
        config.update(
            results=str(work / "results.jsonl"),
            progress=str(progress.path),
            work_dir=str(work),
        )
        started = time.time()
        progress.begin(python, {"device": options.device, "quick": options.quick})
        outcome: ChildOutcome | None = None
        try:
            outcome = run_child(python, isolated, config, work, timeout)
        finally:
            step = progress.last_step()
            progress.end(outcome.outcome if outcome else "interrupted", step)
            if outcome is None or not outcome.stuck:
                shutil.rmtree(work, ignore_errors=True)
    return assemble(options, python, profile, facts, checks, outcome, step, started, timeout)


def assemble(
    options: VerifyOptions,
    python: str,
    profile: Any,
    facts: HostFacts | None,
    checks: list[Check],
    outcome: ChildOutcome,
    step: str | None,
    started: float,
    timeout: float,
) -> VerifyReport:
    """The report from the host checks and what the child left behind."""
    device: dict[str, Any] = {"type": "cpu" if options.device == "cpu" else "cuda"}
    for rec in outcome.records:
        if rec.get("kind") == "check":
            checks.append(Check.from_record(rec))
        elif rec.get("kind") == "device":
            device.update({k: v for k, v in rec.items() if k != "kind"})
    if not outcome.finished:
        checks.append(child_check(outcome, step, timeout))
    verified = any(c.id == "cuda-available" and c.status == "pass" for c in checks)
    # never success without the GPU it is meant to verify (issue #7)
    if options.device != "cpu" and not verified and not any(c.status == "fail" for c in checks):
        checks.append(Check("cuda-device", "fail", "no CUDA device was verified"))
    egpu = facts.egpu if facts is not None else None
    if egpu is not None and device.get("pci_bus_id") == egpu.pci_address:
        device["connection"] = egpu.connection
        device["external"] = True
    if facts is not None and facts.nvidia.driver_version:
        device["driver"] = facts.nvidia.driver_version
    return VerifyReport(
        checks=tuple(checks),
        device=device,
        python=python,
        profile=getattr(profile, "name", None),
        options={
            "device": options.device,
            "quick": options.quick,
            "burn_in_minutes": options.burn_in_minutes,
            "timeout_s": timeout,
            "skip": list(options.skip),
        },
        outcome=outcome.outcome,
        started=started,
        seconds=round(time.time() - started, 3),
        hostname=socket.gethostname(),
        host=_host_summary(facts, device),
    )


def child_check(outcome: ChildOutcome, step: str | None, timeout: float) -> Check:
    """The `verify-child` failure: timed out, crashed, or exited early, and in which step."""
    where = f"in step `{step}`" if step else "before its first step"
    tail = outcome.output_tail.strip().splitlines()[-12:]
    if outcome.outcome == "timeout":
        detail = f"did not finish within {timeout:g} s {where}: killed"
        if outcome.stuck:
            detail += (
                f"; pid {outcome.pid} is stuck in the driver (uninterruptible sleep) and "
                "survives SIGKILL"
            )
        hint = (
            "the GPU stopped answering (known for some eGPUs under CUDA): reboot before using "
            f"it, check `sudo dmesg | grep -i xid`; `--skip {step}` runs the rest"
            if step and step in SKIPPABLE
            else "the GPU stopped answering: reboot, then run `egpu-setup doctor`"
        )
    elif outcome.outcome == "crashed":
        detail = f"crashed {where} ({outcome.signal_name or outcome.returncode})"
        hint = "a native crash in torch or the driver: see the output tail in the JSON report"
    else:
        detail = f"exited with status {outcome.returncode} {where}"
        hint = "see the output tail in the JSON report (`--json`)"
    return Check(
        "verify-child",
        "fail",
        detail,
        value={"outcome": outcome.outcome, "step": step, "output_tail": tail},
        expected={"timeout_s": timeout},
        seconds=round(outcome.seconds, 3),
        hint=hint,
    )


def _host_summary(facts: HostFacts | None, device: dict[str, Any]) -> dict[str, Any]:
    """The `host` block `egpu-setup report` reads for its fleet table."""
    hostname, torch = socket.gethostname(), device.get("torch")
    if facts is None:
        return {"hostname": hostname, "torch": torch}
    return facts.fleet_summary(_target_gpu(facts), hostname=hostname, torch=torch)
