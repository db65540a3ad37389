"""`run_verify`: one whole verify run (host checks, the child, the report), never importing torch.

Order: validate the options (bad input is exit 2 before anything runs), take the verify lock
(exit 5 if another verify runs), read the previous run's progress marker, detect the host,
run the host checks, write the `start` marker, run the child under its timeout, write `end`,
assemble the report. Every check is passed to `on_event` the moment it is known, so the caller
can print while the child works; saving and printing are the caller's (commands/verify.py).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.host.identity import machine_id_sha256
from egpu_setup.host.machine import Host, LiveHost
from egpu_setup.log import get_logger
from egpu_setup.state.paths import TORCH_VENV
from egpu_setup.verify.checks import Check
from egpu_setup.verify.progress import PreviousRun, ProgressLog
from egpu_setup.verify.report import VerifyReport
from egpu_setup.verify.runner import ChildOutcome, run_child

log = get_logger("egpu_setup.verify")

DEFAULT_VENV = TORCH_VENV
SKIPPABLE = ("allocation", "bandwidth", "matmul", "amp", "throughput", "burn-in", "ddp")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d{1,2})$")

# Base time limits: import torch (1-2 s idle, several times that on a loaded machine; CUDA init
# and lazy module loading can take 10-30 s on a cold GPU), then the steps, each bounded by its
# budget below; --burn-in adds its own minutes.
TIMEOUT_QUICK_S = 120.0
TIMEOUT_FULL_S = 300.0

# Seconds each step of the child may spend (per matmul precision, per bandwidth direction), by
# device kind and --quick. A step stops at its budget (a training run earlier, at its loss
# target), so a slow or loaded machine measures less, never runs longer. The sums stay far
# inside the timeouts above: what is left is for importing torch and starting the DDP ranks.
BUDGETS: dict[tuple[str, bool], dict[str, float]] = {
    ("cpu", True): {"matmul": 0.25, "amp": 4.0, "speedup": 0.8, "ddp": 60.0},
    ("cpu", False): {"matmul": 1.0, "amp": 15.0, "speedup": 3.0, "ddp": 90.0},
    ("cuda", True): {
        "bandwidth": 0.5, "matmul": 0.6, "amp": 15.0, "speedup": 2.0, "throughput": 4.0,
        "ddp": 60.0,
    },
    ("cuda", False): {
        "bandwidth": 1.0, "matmul": 1.5, "amp": 30.0, "speedup": 4.0, "throughput": 8.0,
        "ddp": 90.0,
    },
}  # fmt: skip

# The smoke model's batch, image size and channel width: big enough to load a GPU, small enough
# that a CPU trains it in milliseconds per step.
TRAIN_SHAPES: dict[tuple[str, bool], dict[str, int]] = {
    ("cpu", True): {"batch": 64, "size": 32, "width": 16},
    ("cpu", False): {"batch": 64, "size": 32, "width": 16},
    ("cuda", True): {"batch": 128, "size": 64, "width": 64},
    ("cuda", False): {"batch": 256, "size": 64, "width": 64},
}

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
        # absolute (the child starts in its scratch directory), but not resolved: a venv's
        # python is a symlink whose location makes it the venv
        return os.path.abspath(found), False
    venv = Path(os.path.abspath(options.venv or os.environ.get("EGPU_SETUP_VENV") or DEFAULT_VENV))
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
    from egpu_setup.errors import EgpuSetupError
    from egpu_setup.state.atomic import make_dirs
    from egpu_setup.state.paths import StatePaths

    user = StatePaths.for_user()
    fallback, anchor = user.state_dir, user.anchor
    log.warning("%s is not writable; keeping verify state in %s", base, fallback)
    try:
        make_dirs(fallback / "verify", anchor=anchor, mode=0o700)
    except OSError as exc:
        raise EgpuSetupError(
            f"neither {base} nor {fallback} can hold verify's state: {exc.strerror}",
            "run verify as a user with a writable home, or set XDG_STATE_HOME (or "
            "EGPU_SETUP_STATE_DIR) to a folder you can write",
        ) from exc
    return fallback


def expectations(profile: Any, facts: HostFacts | None) -> dict[str, Any]:
    """The child's thresholds: the profile's `expect` (else the defaults), with the peak rates a
    profile leaves open (generic-nvidia) taken from the GPU table for the detected card."""
    if profile is not None:
        exp = profile.expect
        out = {k: getattr(exp, k, DEFAULT_EXPECT[k]) for k in DEFAULT_EXPECT}
        out["h2d_gbps"] = dict(out["h2d_gbps"] or {})
    else:
        out = dict(DEFAULT_EXPECT)
    gpu = _target_gpu(facts)
    if gpu is not None and gpu.device_id and None in (out["fp32_tflops"], out["fp16_tflops"]):
        from egpu_setup.compat.gpus import gpu_by_id

        model = gpu_by_id(gpu.device_id)
        if model is not None:
            out["fp32_tflops"] = out["fp32_tflops"] or model.fp32_tflops
            out["fp16_tflops"] = out["fp16_tflops"] or model.fp16_tflops
    return out


def _target_gpu(facts: HostFacts | None) -> Gpu | None:
    if facts is None:
        return None
    if facts.egpu is not None:
        return facts.egpu
    gpus = facts.nvidia_gpus
    if gpus:
        return gpus[0] if len(gpus) == 1 else None
    # no NVIDIA GPU: the one external AMD GPU, which a ROCm torch runs on (an internal Radeon
    # or an APU beside it is never taken for the eGPU)
    amd = [g for g in facts.gpus if g.vendor == "amd" and g.external]
    return amd[0] if len(amd) == 1 else None


def _is_laptop_gpu(name: str | None) -> bool:
    from egpu_setup.compat.gpus import is_mobile_name

    return bool(name) and is_mobile_name(name or "")


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


EventSink = Callable[[str, Any], None]


def build_config(
    options: VerifyOptions,
    profile: Any,
    facts: HostFacts | None,
    host: Host | None,
    references: tuple[Any, ...] | None = None,
) -> dict[str, Any]:
    """What the child runs: device, budgets, expectations, the GPU it must find (the eGPU, or the
    one NVIDIA GPU of a machine without one), where its sysfs is."""
    kind = "cpu" if options.device == "cpu" else "cuda"
    target = _target_gpu(facts)
    reference = None
    if target is not None and kind == "cuda":
        from egpu_setup.verify.references import REFERENCES, find_reference

        ref = find_reference(
            target.device_id, target.name, REFERENCES if references is None else references
        )
        reference = ref.for_mode(options.quick) if ref is not None else None
    return {
        "device": options.device,
        "quick": options.quick,
        "burn_in_s": options.burn_in_minutes * 60.0,
        "skip": list(options.skip),
        "budgets": dict(BUDGETS[(kind, options.quick)]),
        "train": dict(TRAIN_SHAPES[(kind, options.quick)]),
        "expect": expectations(profile, facts),
        "reference": reference,
        "target": None
        if target is None
        else {
            "pci_address": target.pci_address,
            "name": target.name,
            "connection": target.connection,
            "external": target.external,
            "laptop_gpu": _is_laptop_gpu(target.name),
            "compute_capability": target.compute_capability,
            "tb_generation": _tb_generation(facts),
        },
        "nvidia_gpus": [g.pci_address for g in facts.nvidia_gpus] if facts else [],
        "driver_cuda": facts.nvidia.cuda_version if facts else None,
        # a recorded host (tests) has its sysfs under its root; a live one under /
        "sysfs_root": str(Path(host.root).resolve()) if host is not None else "/",
    }


def run_verify(
    options: VerifyOptions,
    host: Host | None = None,
    facts: HostFacts | None = None,
    on_event: EventSink | None = None,
    references: tuple[Any, ...] | None = None,
) -> VerifyReport:
    """Run verify as `options` say; `facts` replaces detection (tests, recorded hosts);
    `on_event(kind, payload)` gets each "check" (a Check), "device" (a dict) and "step" (a name)
    as it happens; `references` replaces the internal-slot throughput table."""
    from egpu_setup.state.lock import RunLock

    validate(options)
    python, isolated = target_python(options)
    profile = load_profile_option(options.profile)
    timeout = options.timeout_s or default_timeout(options)
    cpu = options.device == "cpu"
    state = state_dir()
    emit = on_event or (lambda kind, payload: None)
    with RunLock(state / "verify" / "verify.lock"):
        progress = ProgressLog(state / "verify")
        previous = progress.previous()
        checks: list[Check] = []
        if previous is not None:
            checks.append(previous_run_check(previous))
        if not cpu:
            host = host or LiveHost()
            if facts is None:
                facts = detect_facts(host)
            from egpu_setup.verify.host_checks import probe_host_checks

            checks.extend(probe_host_checks(host, facts))
        for check in checks:
            emit("check", check)
        config = build_config(options, profile, facts, host if not cpu else None, references)
        work = scratch_dir()
        config.update(progress=str(progress.path), work_dir=str(work), nvidia_smi=nvidia_smi())
        started = time.time()
        progress.begin(python, {"device": options.device, "quick": options.quick})

        def record(rec: dict[str, Any]) -> None:
            kind = rec.get("kind")
            if kind == "check":
                emit("check", Check.from_record(rec))
            elif kind == "device":
                emit("device", {k: v for k, v in rec.items() if k != "kind"})
            elif kind == "step":
                # root's log, written by root from what the child said (verify/records.py
                # checked the name); the child waits for this line before the step starts
                progress.step(rec["step"], rec.get("pid"), rec.get("seq"))
                emit("step", rec.get("step"))

        outcome: ChildOutcome | None = None
        try:
            outcome = run_child(python, isolated, config, work, timeout, record)
        finally:
            step = progress.last_step()
            progress.end(outcome.outcome if outcome else "interrupted", step)
            if outcome is None or not outcome.stuck:
                shutil.rmtree(work, ignore_errors=True)
    report = assemble(options, python, profile, facts, checks, outcome, step, started, timeout)
    # the machine that ran it (a CPU run has no Host of its own: this one)
    return replace(report, machine_id_sha256=machine_id_sha256(host or LiveHost()))


def scratch_dir() -> Path:
    """A private directory for the child (its config, DDP's rendezvous file): under TMPDIR when
    it is set, else /tmp. A TMPDIR that cannot be used is said, not silently replaced."""
    base = os.environ.get("TMPDIR") or "/tmp"
    named = "TMPDIR" if os.environ.get("TMPDIR") else "the temp directory"
    try:
        return Path(tempfile.mkdtemp(prefix="egpu-setup-verify-", dir=base))
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise EgpuSetupError(
            f"no usable temp directory: cannot create verify's scratch directory in {base} "
            f"({named}): {why}",
            f"free space in {base} or point TMPDIR at a writable directory with room "
            "(a few MiB), e.g. TMPDIR=/var/tmp",
        ) from exc


def nvidia_smi() -> str | None:
    """nvidia-smi's absolute path for the child's sampler (the child has no PATH of ours)."""
    return LiveHost().which("nvidia-smi")


def previous_run_check(previous: PreviousRun) -> Check:
    """The warning about a run that never finished, with a hint that fits what it verified."""
    step = previous.step
    if previous.device == "cpu":
        hint = "the tool or the machine stopped during a CPU run (power loss, OOM killer?)"
    else:
        hint = (
            f"if it hung in `{step}`, this GPU/enclosure may hard-lock under CUDA (see "
            "`egpu-setup doctor`); `--skip STEP` runs the rest"
        )
    return Check(
        "previous-run",
        "warn",
        previous.describe() + ": the machine probably locked up or rebooted",
        value={"step": step, "started": previous.started, "device": previous.device},
        hint=hint,
    )


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
        checks.append(child_check(outcome, step, timeout, device["type"]))
    verified = any(c.id == "cuda-available" and c.status == "pass" for c in checks)
    # never success without the GPU it is meant to verify (docs/design.md, verify's exit codes)
    if options.device != "cpu" and not verified and not any(c.status == "fail" for c in checks):
        checks.append(Check("cuda-device", "fail", "no CUDA device was verified"))
    target = _target_gpu(facts)
    if target is not None and device.get("pci_bus_id") == target.pci_address:
        device["connection"] = target.connection
        device["external"] = target.external
        device["device_id"] = target.device_id  # the PCI product id, which torch does not give
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


def child_check(
    outcome: ChildOutcome, step: str | None, timeout: float, device_type: str = "cuda"
) -> Check:
    """The `verify-child` failure: timed out, crashed, or exited early, and in which step; the
    hint fits the device (a CPU run has no GPU that could have stopped answering)."""
    where = f"in step `{step}`" if step else "before its first step"
    tail = outcome.output_tail.strip().splitlines()[-12:]
    cpu = device_type == "cpu"
    if outcome.outcome == "timeout":
        detail = f"did not finish within {timeout:g} s {where}: killed"
        if outcome.stuck:
            detail += (
                f"; pid {', '.join(map(str, outcome.stuck_pids)) or outcome.pid} is stuck in "
                "uninterruptible sleep and survives SIGKILL"
            )
        skip = f"; `--skip {step}` runs the rest" if step in SKIPPABLE else ""
        if cpu:
            hint = (
                "the CPU run was too slow for the time limit: the machine is busy or small; "
                f"rerun when it is idle or give more time (--timeout S){skip}"
            )
        elif step in SKIPPABLE:
            hint = (
                "the GPU stopped answering (known for some eGPUs under CUDA): reboot before "
                f"using it, check `sudo dmesg | grep -i xid`{skip}"
            )
        else:
            hint = "the GPU stopped answering: reboot, then run `egpu-setup doctor`"
    elif outcome.outcome == "crashed":
        detail = f"crashed {where} ({outcome.signal_name or outcome.returncode})"
        hint = (
            "a native crash in torch: see the output tail in the JSON report"
            if cpu
            else "a native crash in torch or the driver: see the output tail in the JSON report"
        )
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
