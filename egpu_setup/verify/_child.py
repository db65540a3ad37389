"""The verify child: runs inside the TARGET Python (the venv that received torch), by path.

The parent (egpu_setup/verify/runner.py) starts this file as
`<target python> -I _child.py CONFIG.json` in a session of its own with a hard timeout, so a GPU
that hangs the CUDA driver (Blackwell eGPUs hard-lock the host under CUDA over TB4/TB5 and
OCuLink: NVIDIA/open-gpu-kernel-modules issues #979 and #1247) can never hang the tool.

Why one self-contained file: the target venv does not have egpu_setup installed, and must not
need it, so this file imports only the standard library and torch (torch inside the functions that
use it, so a missing torch is a check result, not a crash).
Keep it compatible with every Python the PyTorch wheels support (3.9+).

Protocol (read by the parent):
- CONFIG.json: what to run (device, quick, burn-in, skips, budgets, expectations, the target GPU).
- stdout carries JSON lines only, one per record, flushed as they happen: {"kind": "step",
  "step", "pid", "seq"}, {"kind": "check", id, status, detail, value, expected, seconds, hint},
  {"kind": "device", ...}, {"kind": "end"}. Anything else that writes to fd 1 (NCCL_DEBUG, a
  print inside a library) is sent to stderr instead, so it can never corrupt a record.
- `progress`: the parent's progress log (JSON lines, fsynced per line, root's when root runs
  verify). The parent writes {"event": "step", "step", "pid", "seq", "time"} for each step
  record it reads; the child waits (a second at most) until that line is there BEFORE the step
  starts, so a machine that locks up mid-step leaves the step's name on disk. The child only
  reads the log: it never writes a file the next run trusts.
- `nvidia_smi`: the absolute path of nvidia-smi, found by the parent (None: not sampled). The
  child's environment is the parent's choice (a fixed PATH, no EGPU_SETUP_* variable): nothing
  here is looked up through it.

Time: every step has a budget in seconds (`budgets` in CONFIG.json, chosen by the parent per
device and --quick), not a step count. A training run stops at its budget or when its loss
reaches the target, whichever comes first; a slow or busy machine does fewer steps, never more
time. On a GPU, durations are CUDA event times (what the stream executed); on the CPU, wall time.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False  # typing is for mypy only: this file runs on any Python torch supports
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, TextIO

    # torch itself (imported inside the functions that use it) and what it returns: a device,
    # a tensor, a dtype, a CUDA event are Any here (their types live in torch, which mypy does
    # not read).
    Torch = ModuleType

# -I keeps the script directory off sys.path; without -I (a user-chosen --python) drop it by hand
# so a sibling module here can never shadow a real one.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

STEPS = (
    "import",
    "cuda-init",
    "identity",
    "allocation",
    "bandwidth",
    "matmul",
    "amp",
    "throughput",
    "burn-in",
    "ddp",
)

# PCIe transfer rate per lane and line code (PCI Express Base Specification 1.0-6.0: 8b/10b for
# 2.5/5 GT/s, 128b/130b from 8 GT/s; 6.0's FLIT mode is close to 1.0 and counted as such).
_ENCODING = {2.5: 0.8, 5.0: 0.8, 8.0: 128 / 130, 16.0: 128 / 130, 32.0: 128 / 130, 64.0: 1.0}
_SPEED_BY_GEN = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

# The PCIe link a tunnel carries: TB3/TB4 and USB4 v1 tunnel about PCIe 3.0 x4, TB5 / USB4 v2
# and OCuLink about PCIe 4.0 x4 (an inference from the Thunderbolt 3/4/5 and OCuLink specs as
# vendors summarise them; the GPU's own link to the enclosure's bridge may read x16, the tunnel
# is the real limit). A plain slot has no such cap: it is judged against its own link.
_TUNNEL_CAP = {
    "thunderbolt": (8.0, 4),
    "usb4": (8.0, 4),
    "thunderbolt5": (16.0, 4),
    "oculink": (16.0, 4),
}

# NVML clocks event reasons that mean the GPU slowed down for heat or power delivery
# (NVML API reference, "NvmlClocksEventReasons"); SwPowerCap (0x4) is normal under full load.
_BAD_REASONS = {
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
}

# The smallest training run whose loss fall is judged: loss_dropped() compares the mean of the
# first and the last quarter (at least 2 steps each), so one noisy batch decides nothing.
MIN_JUDGED_STEPS = 8


def pcie_rate_gbs(speed_gts: float | None, width: int | None) -> float | None:
    """Theoretical one-direction PCIe payload rate in GB/s (before TLP overhead)."""
    if not speed_gts or not width:
        return None
    return speed_gts * _ENCODING.get(speed_gts, 128 / 130) * width / 8.0


def tunnel_cap(connection: str | None, tb_generation: int | None) -> tuple[float, int] | None:
    """(GT/s, width) the connection itself allows, or None for a plain slot / unknown."""
    if connection == "thunderbolt" and tb_generation is not None and tb_generation >= 5:
        return _TUNNEL_CAP["thunderbolt5"]
    return _TUNNEL_CAP.get(connection or "")


def parse_speed(text: str | None) -> float | None:
    """sysfs current_link_speed "8.0 GT/s PCIe" -> 8.0."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def normalize_bus_id(text: str) -> str:
    """nvidia-smi/CUDA "00000000:3C:00.0" or "0000:3c:00.0" -> "0000:3c:00.0"."""
    text = text.strip().lower()
    m = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$", text)
    if not m:
        return text
    dom = int(m.group(1) or "0", 16)
    return f"{dom:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def compare_cuda(wheel: str | None, driver: str | None) -> tuple[str, str]:
    """(status, detail) for a wheel built against CUDA `wheel` on a driver supporting `driver`.

    CUDA's minor version compatibility lets a 12.x runtime run on any 12.y driver (y < x) except
    for features needing the newer driver and PTX JIT of newer PTX (CUDA Compatibility guide,
    "Minor Version Compatibility"); a newer MAJOR never runs.
    """
    if not wheel:
        return "fail", "torch is a CPU-only build (torch.version.cuda is None)"
    if not driver:
        return "skip", f"torch built for CUDA {wheel}; the driver's CUDA version is unknown"
    w = _major_minor(wheel)
    d = _major_minor(driver)
    if w is None or d is None:
        return "skip", f"cannot compare CUDA {wheel!r} with driver CUDA {driver!r}"
    if w[0] > d[0]:
        return "fail", f"torch needs CUDA {wheel}; the driver supports only CUDA {driver}"
    if w > d:
        return (
            "warn",
            f"torch built for CUDA {wheel} on a driver for CUDA {driver}: runs through minor "
            "version compatibility, but PTX JIT and newer features need a newer driver",
        )
    return "pass", f"torch CUDA {wheel} <= driver CUDA {driver}"


def _major_minor(text: str) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def arch_covers(arch_list: list[str], cc: tuple[int, int]) -> tuple[str, str]:
    """(status, detail): does the compiled arch list run compute capability `cc`?

    sm_XY cubins run on the same major with minor >= Y (CUDA binary compatibility); compute_XY
    (PTX) is JIT-compiled for any newer device, slowly on first use. "sm_90a"-style suffixes are
    arch-specific and run only on exactly that device.
    """
    want = cc[0] * 10 + cc[1]
    sms: list[int] = []
    ptx: list[int] = []
    for entry in arch_list:
        m = re.match(r"^(sm|compute)_(\d+)([a-z]?)$", entry)
        if not m:
            continue
        num = int(m.group(2))
        if m.group(1) == "sm":
            if m.group(3):
                if num == want:
                    sms.append(num)
            elif num // 10 == cc[0] and num <= want:
                sms.append(num)
        elif num <= want:
            ptx.append(num)
    label = f"sm_{want}"
    if want in sms:
        return "pass", f"{label} is compiled in"
    if sms:
        return "pass", f"{label} runs the compiled sm_{max(sms)} code (same major)"
    if ptx:
        return "warn", f"no {label} code: PTX compute_{max(ptx)} is JIT-compiled (slow first run)"
    return "fail", f"this torch has no code for {label} (compiled: {' '.join(arch_list) or 'none'})"


def judge_ratio(value: float, expected: float | None, fail_below: float, warn_below: float) -> str:
    """pass / warn / fail for a measured `value` against an `expected` one (None: pass)."""
    if expected is None or expected <= 0:
        return "pass"
    ratio = value / expected
    if ratio < fail_below:
        return "fail"
    if ratio < warn_below:
        return "warn"
    return "pass"


def loss_dropped(losses: list[float], fraction: float) -> tuple[bool, float, float]:
    """(ok, first, last): mean of the first losses vs the last ones (5 each, fewer for short
    runs, so one noisy batch decides nothing); ok when last <= fraction * first (profile
    `expect.amp_loss_drop`: 0.5 = the loss must halve)."""
    k = min(5, max(1, len(losses) // 4))
    first = sum(losses[:k]) / k
    last = sum(losses[-k:]) / k
    return (last <= first * fraction), first, last


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in sorted(_BAD_REASONS.items()) if mask & bit]


def judge_throttle(masks: list[int]) -> tuple[str, str, list[str] | None, str | None]:
    """(status, detail, value, hint) of the gpu-throttle check from sampled reason bitmasks."""
    if not masks:
        return "skip", "the GPU reports no clocks event reasons", None, None
    seen = sorted({n for m in masks for n in throttle_names(m)})
    if seen:
        return (
            "warn",
            "clocks slowed: " + ", ".join(seen),
            seen,
            "check cooling and the enclosure's power supply",
        )
    return "pass", "no thermal or power-brake slowdown", [], None


def matmul_size_for(rate_flops: float, seconds: float, lo: int = 128, hi: int = 1024) -> int:
    """The square size whose product takes about `seconds` at `rate_flops` (2 n^3 flops), in
    [lo, hi] and a multiple of 64: a slow CPU (bf16 without native support) gets a small one."""
    n = int((max(rate_flops, 1.0) * seconds / 2.0) ** (1.0 / 3.0))
    return max(lo, min(hi, n // 64 * 64))


# -- plumbing ----------------------------------------------------------------------------------


class Out:
    """The record stream (stdout, flushed per line), and the parent's progress log it waits on."""

    def __init__(self, progress: str | None, stream: TextIO | None = None) -> None:
        if stream is None:
            # Records get their own copy of fd 1; fd 1 itself then points at stderr, so C code
            # printing to stdout (NCCL's INFO lines) or a stray print() cannot break a record.
            stream = os.fdopen(os.dup(1), "w", encoding="utf-8")
            os.dup2(2, 1)
        self._stream = stream
        self._progress = progress
        self._seq = 0

    def emit(self, record: dict[str, Any]) -> None:
        self._stream.write(json.dumps(record, default=str) + "\n")
        self._stream.flush()

    def check(
        self,
        cid: str,
        status: str,
        detail: str,
        value: Any = None,
        expected: Any = None,
        seconds: float | None = None,
        hint: str | None = None,
    ) -> str:
        self.emit(
            {
                "kind": "check",
                "id": cid,
                "status": status,
                "detail": detail,
                "value": value,
                "expected": expected,
                "seconds": None if seconds is None else round(seconds, 3),
                "hint": hint,
            }
        )
        return status

    def step(self, name: str) -> None:
        """Tell the parent that `name` starts, and wait until its progress log says so."""
        self._seq += 1
        pid = os.getpid()
        self.emit({"kind": "step", "step": name, "pid": pid, "seq": self._seq})
        if self._progress and not logged(self._progress, pid, self._seq, PROGRESS_WAIT_S):
            self._progress = None  # nobody writes it (the child run on its own): stop waiting


PROGRESS_WAIT_S = 1.0


def logged(path: str, pid: int, seq: int, wait_s: float) -> bool:
    """True once the progress log at `path` holds the step line for (pid, seq), within wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 65536))
                tail = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            tail = []
        for line in reversed(tail):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("pid") == pid and event.get("seq") == seq:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


class Budget:
    """A wall-clock allowance for one check, started when it is made."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.start = time.perf_counter()

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def over(self, share: float = 1.0) -> bool:
        return self.spent() >= self.seconds * share


class Clock:
    """Device time between two marks: CUDA events on a GPU (the time the stream spent, which is
    what a throughput is), time.perf_counter on the CPU."""

    def __init__(self, torch: Torch, device: Any) -> None:
        self.torch = torch
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:  # a CUDA event, or perf_counter seconds
        if not self.cuda:
            return time.perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            wall: float = end - start
            return wall
        end.synchronize()
        milliseconds: float = start.elapsed_time(end)
        return milliseconds / 1000.0


def import_torch() -> Torch:
    import torch

    module: Torch = torch  # Any to mypy (torch is not read); a module all the same
    return module


class Sampler:
    """Temperature, power and clocks-event reasons of one GPU, sampled by nvidia-smi in a thread.

    nvidia-smi rather than NVML bindings: torch.cuda.temperature() needs pynvml, which CUDA wheels
    do not pull in; nvidia-smi ships with every driver. It runs in our session, so the parent's
    timeout kills it with us.
    """

    FIELDS = ("temperature.gpu", "power.draw", "clocks_event_reasons.active")

    def __init__(self, bus_id: str | None, interval: float, smi: str | None):
        self.bus_id = bus_id
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._smi = smi if smi and os.path.isabs(smi) else None
        self._fields = self.FIELDS

    def __enter__(self) -> Sampler:
        if self._smi and self.bus_id:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        elif not self._smi:
            self.error = "nvidia-smi not found"
        else:
            self.error = "torch reports no PCI bus id to name the GPU by"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def sample_once(self) -> None:
        argv = [
            self._smi or "/nonexistent/nvidia-smi",
            "--query-gpu=" + ",".join(self._fields),
            "--format=csv,noheader,nounits",
            "-i",
            self.bus_id or "0",
        ]
        try:
            out = subprocess.run(  # noqa: S603 - argv list, never a shell
                argv, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.error = f"nvidia-smi: {exc}"
            return
        text = (out.stdout or out.stderr).strip()
        if "not a valid field" in text and "clocks_event_reasons" in self._fields[2]:
            # drivers before R535 call it clocks_throttle_reasons (NVML docs: renamed, deprecated)
            self._fields = (*self._fields[:2], "clocks_throttle_reasons.active")
            return
        sample = parse_sample(text)
        if sample is None:
            self.error = f"nvidia-smi: {text[:200]}"
        else:
            self.samples.append(sample)


def parse_sample(line: str) -> dict[str, Any] | None:
    """ "64, 312.45, 0x0000000000000004" -> {"temp": 64.0, "power": 312.45, "reasons": 4}."""
    parts = [p.strip() for p in line.splitlines()[0].split(",")] if line else []
    if len(parts) != 3:
        return None

    def num(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None  # "[N/A]", "[Not Supported]"

    reasons = None
    if parts[2].lower().startswith("0x"):
        try:
            reasons = int(parts[2], 16)
        except ValueError:
            reasons = None
    temp, power = num(parts[0]), num(parts[1])
    if temp is None and power is None and reasons is None:
        return None
    return {"temp": temp, "power": power, "reasons": reasons}


def peak_check(
    out: Out,
    cid: str,
    values: list[Any],
    limit: float | None,
    unit: str,
    counted: str | None,
    hint: str,
    missing: str,
) -> None:
    """A warning when the peak of a sampled value reaches the profile's limit."""
    if not values:
        out.check(cid, "skip", missing)
        return
    peak = max(values)
    status = "warn" if limit is not None and peak >= limit else "pass"
    detail = f"peak {peak:.0f} {unit}" + (f" over {len(values)} {counted}" if counted else "")
    if limit is not None:
        detail += f" (limit {limit:.0f} {unit})"
    out.check(
        cid, status, detail, value=peak, expected=limit, hint=hint if status == "warn" else None
    )


def sampler_checks(out: Out, sampler: Sampler, expect: dict[str, Any]) -> None:
    """Temperature, power and throttle checks from the samples: warnings only (docs/design.md,
    verify's exit codes)."""
    if not sampler.samples:
        reason = sampler.error or "no samples"
        for cid in ("gpu-temperature", "gpu-power", "gpu-throttle"):
            out.check(cid, "skip", f"not sampled: {reason}")
        return
    temps = [s["temp"] for s in sampler.samples if s["temp"] is not None]
    powers = [s["power"] for s in sampler.samples if s["power"] is not None]
    peak_check(
        out, "gpu-temperature", temps, expect.get("max_temp_c"), "°C", "samples",
        "improve the enclosure's airflow; enclosures above 90 °C abort training",
        "the GPU reports no temperature",
    )  # fmt: skip
    peak_check(
        out, "gpu-power", powers, expect.get("max_power_w"), "W", None,
        "the enclosure's power supply may not carry this GPU", "the GPU reports no power draw",
    )  # fmt: skip
    masks = [s["reasons"] for s in sampler.samples if s["reasons"] is not None]
    status, detail, value, hint = judge_throttle(masks)
    out.check("gpu-throttle", status, detail, value=value, hint=hint)


# -- torch work ----------------------------------------------------------------------------------


def check_import(out: Out) -> Torch | None:
    t0 = time.perf_counter()
    try:
        torch = import_torch()
    except Exception as exc:  # ImportError, or a broken install raising anything
        out.check(
            "torch-import",
            "fail",
            f"cannot import torch in {sys.executable}: {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            hint="install torch into this venv: `egpu-setup install --only torch --profile NAME`",
        )
        return None
    build = torch_build(torch.version.cuda, getattr(torch.version, "hip", None))
    out.check(
        "torch-import",
        "pass",
        f"torch {torch.__version__} ({build}) in {time.perf_counter() - t0:.1f} s",
        value=torch.__version__,
        seconds=time.perf_counter() - t0,
    )
    return torch


def cpu_native_bf16(torch: Torch) -> bool | None:
    """Does this CPU compute bf16 natively (AVX512-BF16 or AMX on x86, the BF16 extension on
    Arm)? Without it torch emulates bf16 through fp32 and bf16 work is several times slower."""
    probe = getattr(getattr(torch, "cpu", None), "_is_avx512_bf16_supported", None)
    amx = getattr(getattr(torch, "cpu", None), "_is_amx_tile_supported", None)
    try:  # torch's own probe (cpuinfo) also knows whether the OS enabled AMX: trust it
        if probe is not None:
            return bool(probe() or (amx is not None and amx()))
    except Exception:
        pass
    # a torch without the probe (before 2.2): the kernel's flags; None when they are unknown
    flags = set((_read("/proc/cpuinfo") or "").split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}) if flags else None


def _read(path: str) -> str | None:
    """A small text file (sysfs, procfs), or None when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _timed_matmul(
    torch: Torch, device: Any, dtype: Any, n: int, budget: Budget, min_seconds: float
) -> float:
    """Achieved TFLOPS of n x n x n matmuls (2 n^3 flops per product) in device time; stops when
    `min_seconds` are measured or the budget is spent (at least one timed batch)."""
    clock = Clock(torch, device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2 if clock.cuda else 1):
        torch.matmul(a, b)
    per_batch = 4 if clock.cuda else 1
    iters = 0
    start = clock.mark()
    while True:
        for _ in range(per_batch):
            torch.matmul(a, b)
        iters += per_batch
        elapsed = clock.seconds(start, clock.mark())
        if elapsed >= min_seconds or budget.over():
            break
    return 2.0 * n**3 * iters / elapsed / 1e12


def _cpu_matmul_size(torch: Torch, dtype: Any, budget: Budget) -> int:
    """Size the CPU matmul so about ten products fit the budget (one 256^3 probe first)."""
    a = torch.randn(256, 256, dtype=dtype)
    t0 = time.perf_counter()
    torch.matmul(a, a)
    rate = 2.0 * 256**3 / max(time.perf_counter() - t0, 1e-6)
    return matmul_size_for(rate, budget.seconds / 10.0)


def run_matmul(out: Out, torch: Torch, device: Any, cfg: dict[str, Any]) -> None:
    expect = cfg["expect"]
    seconds = cfg["budgets"]["matmul"]
    if device.type == "cuda":
        n = 4096 if cfg["quick"] else 8192  # the sizes the profiles' and recorded numbers use
        major = torch.cuda.get_device_capability(device)[0]
        fp16 = expect.get("fp16_tflops")
        # TF32 tensor throughput is half the FP16 rate on Ampere, Ada and Hopper (NVIDIA
        # architecture whitepapers), so the FP16 expectation gives a TF32 one.
        cases = [
            ("matmul-fp32", torch.float32, False, expect.get("fp32_tflops")),
            ("matmul-tf32", torch.float32, True, fp16 / 2 if fp16 else None),
            ("matmul-fp16", torch.float16, False, fp16),
            ("matmul-bf16", torch.bfloat16, False, fp16),
        ]
    else:
        n = None
        major = 0
        cases = [
            ("matmul-fp32", torch.float32, False, None),
            ("matmul-bf16", torch.bfloat16, False, None),
        ]
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for cid, dtype, tf32, expected in cases:
            if device.type == "cuda" and (tf32 or dtype is torch.bfloat16) and major < 8:
                out.check(cid, "skip", f"needs compute capability 8.0+ (this GPU: {major}.x)")
                continue
            torch.backends.cuda.matmul.allow_tf32 = tf32
            budget = Budget(seconds)
            size = n or _cpu_matmul_size(torch, dtype, budget)
            try:
                tflops = _timed_matmul(torch, device, dtype, size, budget, seconds * 0.5)
            except Exception as exc:
                out.check(
                    cid, "fail", f"{size}x{size} matmul failed: {exc}", seconds=budget.spent()
                )
                continue
            detail = f"{tflops:.2f} TFLOPS ({size}x{size})"
            if device.type == "cpu":
                # A CPU's matmul rate says nothing about an eGPU, and bf16 depends on AVX512-BF16
                # / AMX being there: a measurement, never a verdict.
                out.check(cid, "info", detail, value=round(tflops, 4), seconds=budget.spent())
                continue
            # expectations are vendor peak rates; torch reaches roughly 60-90 % of them on large
            # matmuls, so only a GPU far below (stuck clocks, throttling) warns or fails
            status = judge_ratio(tflops, expected, 0.25, 0.5)
            if expected:
                detail += f", {tflops / expected:.0%} of the expected {expected:g}"
            out.check(
                cid,
                status,
                detail,
                value=round(tflops, 3),
                expected=expected,
                seconds=budget.spent(),
                hint="the GPU is far below its rated speed: check clocks, power and temperature "
                "(nvidia-smi -q -d PERFORMANCE)"
                if status != "pass"
                else None,
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32


def make_data(torch: Torch, n: int, size: int, seed: int) -> tuple[Any, Any]:
    """Synthetic 4-class images on the host: which quadrant is bright (a task any working GPU
    learns in a few steps, and a GPU computing garbage never does)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g) * 0.5
    y = torch.randint(0, 4, (n,), generator=g)
    h = size // 2
    for cls, (r, c) in enumerate(((0, 0), (0, h), (h, 0), (h, h))):
        idx = (y == cls).nonzero().flatten()
        x[idx, :, r : r + h, c : c + h] += 1.5
    return x, y


def make_model(torch: Torch, width: int) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, width * 2, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(width * 2 * 16, 4),
    )


class Momentum:
    """SGD with momentum (torch.optim.SGD's update without dampening or Nesterov), by hand:
    torch.optim's first use imports torch._dynamo and sympy, 1-2 s that a smoke run of a few
    steps cannot afford. GradScaler drives it like any optimizer (param_groups, step)."""

    def __init__(self, torch: Torch, params: Any, lr: float, momentum: float) -> None:
        self.torch = torch
        self.params = list(params)
        self.param_groups = [{"params": self.params}]
        self.lr = lr
        self.momentum = momentum
        self.buffers: list[Any] = [None] * len(self.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        with self.torch.no_grad():
            for i, p in ((i, p) for i, p in enumerate(self.params) if p.grad is not None):
                buf = self.buffers[i]
                if buf is None:
                    buf = self.buffers[i] = p.grad.detach().clone()
                else:
                    buf.mul_(self.momentum).add_(p.grad)
                p.add_(buf, alpha=-self.lr)


class TrainRun:
    """What one training run measured."""

    def __init__(
        self,
        losses: list[float],
        timed_steps: int,
        seconds: float,
        skipped: int,
        dtype: str,
        stopped: str,
        wall: float,
    ) -> None:
        self.losses = losses
        self.timed_steps = timed_steps
        self.seconds = seconds  # device time of the timed steps
        self.skipped = skipped  # steps the GradScaler skipped (inf/NaN gradients)
        self.dtype = dtype
        self.stopped = stopped  # "target" / "budget" / "steps"
        self.wall = wall

    @property
    def ms_per_step(self) -> float:
        return self.seconds * 1000.0 / self.timed_steps if self.timed_steps else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.timed_steps / self.seconds if self.seconds > 0 else 0.0


def train(
    torch: Torch,
    device: Any,
    cfg: dict[str, Any],
    *,
    amp: bool,
    budget_s: float,
    max_steps: int = 0,
    target: float | None = None,
    feed: str = "resident",
    seed: int = 0,
    step_ms: list[Any] | None = None,
) -> TrainRun:
    """Train the small CNN until `budget_s` is spent, `max_steps` are done or (with `target`) the
    loss has fallen to `target` of its start, whichever comes first.

    A judged run (`target` given) takes MIN_JUDGED_STEPS steps even when that overruns its
    budget: on a very slow machine (a VM without hardware virtualisation trains about 100x slower
    than its host) the loss is then judged on 8 steps instead of the check failing unjudged;
    the parent's hard timeout still ends a step that never finishes.

    CUDA: fp16 autocast + GradScaler; CPU: bf16 autocast, no scaler (GradScaler is for fp16 on
    CUDA; CPU autocast supports bf16 and fp16, bf16 being the fast one where the CPU has it).
    `feed`: "resident" keeps the data on the device; "pageable" uploads each batch from ordinary
    host memory, "pinned" from page-locked memory with non_blocking=True (how a DataLoader with
    pin_memory=True feeds a GPU). `step_ms` collects each step's wall duration (burn-in).
    """
    torch.manual_seed(seed)
    cuda = device.type == "cuda"
    shape = cfg["train"]  # batch, image size, channels: chosen by the parent per device
    batch, size, width = int(shape["batch"]), int(shape["size"]), int(shape["width"])
    x, y = make_data(torch, batch * 8, size, seed)
    if feed == "resident":
        x, y = x.to(device), y.to(device)
    elif feed == "pinned":
        x, y = x.pin_memory(), y.pin_memory()
    model = make_model(torch, width).to(device)
    opt = Momentum(torch, model.parameters(), lr=0.05, momentum=0.9)
    dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if (amp and cuda) else None
    clock = Clock(torch, device)
    warm = 3 if cuda else 1  # cuDNN picks its algorithms in the first steps
    budget = Budget(budget_s)
    floor = MIN_JUDGED_STEPS if target is not None else warm + 1  # steps before the budget counts
    losses: list[float] = []
    skipped = 0
    start = None
    stopped = "steps"
    t_prev = time.perf_counter()
    i = 0
    while True:
        if i >= floor and budget.over():
            stopped = "budget"
            break
        if max_steps and i >= max_steps:
            break
        if target is not None and i >= MIN_JUDGED_STEPS and loss_dropped(losses, target)[0]:
            stopped = "target"
            break
        if i == warm:
            start = clock.mark()
        j = (i % 8) * batch
        xb, yb = x[j : j + batch], y[j : j + batch]
        if feed != "resident":
            xb = xb.to(device, non_blocking=feed == "pinned")
            yb = yb.to(device, non_blocking=feed == "pinned")
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=amp):
            logits = model(xb)
            loss = torch.nn.functional.cross_entropy(logits, yb)
        if amp and logits.dtype != dtype:
            raise RuntimeError(f"autocast did not run in {dtype} (logits are {logits.dtype})")
        if scaler is not None:
            scale_before = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < scale_before:
                skipped += 1  # inf/NaN gradients: the scaler skipped this step
        else:
            loss.backward()
            opt.step()
        losses.append(float(loss.detach()))  # .item() synchronises: the step is done
        if step_ms is not None:
            now = time.perf_counter()
            if i >= warm:
                step_ms.append((now - t_prev) * 1000.0)
            t_prev = now
        i += 1
    timed = max(0, i - warm)
    seconds = clock.seconds(start, clock.mark()) if start is not None and timed else 0.0
    return TrainRun(
        losses, timed, seconds, skipped, str(dtype).replace("torch.", ""), stopped, budget.spent()
    )


def run_amp(out: Out, torch: Torch, device: Any, cfg: dict[str, Any]) -> bool:
    """The training smoke (its loss must fall, no inf/NaN), then AMP against FP32; True when the
    smoke passed."""
    expect = cfg["expect"]
    cap = int(expect.get("amp_steps") or 200)
    fraction = float(expect.get("amp_loss_drop") or 0.5)
    budgets = cfg["budgets"]
    cuda = device.type == "cuda"
    # Without native bf16 a CPU emulates it several times slower than FP32: the smoke then trains
    # in FP32 (what such a CPU trains in), and bf16 autocast is only timed, for a few steps, in
    # amp-speedup.
    amp = cuda or cpu_native_bf16(torch) is not False
    t0 = time.perf_counter()
    try:
        run = train(
            torch, device, cfg, amp=amp, budget_s=budgets["amp"], max_steps=cap, target=fraction
        )
    except Exception as exc:
        out.check(
            "amp-training",
            "fail",
            f"AMP training raised {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            hint="see `egpu-setup doctor`; a CUDA error here often means the link or driver failed",
        )
        return False
    losses = run.losses
    bad = [v for v in losses if not math.isfinite(v)]
    ok_drop, first, last = loss_dropped(losses, fraction)
    how = f"{run.dtype} autocast" + (", GradScaler" if cuda else "")
    if not amp:
        how = "float32 (no native bf16 on this CPU; bf16 is timed in amp-speedup)"
    why = {"target": "loss target reached", "budget": "budget spent", "steps": "step cap"}
    detail = (
        f"{len(losses)} steps {how} ({why[run.stopped]}): loss "
        f"{first:.3f} -> {last:.4f}, {run.steps_per_s:.1f} steps/s"
    )
    if run.skipped:
        detail += f", {run.skipped} steps skipped by the scaler"
    status = "pass"
    hint = None
    if bad:
        status, hint = "fail", "inf/NaN losses: check the GPU's stability (--burn-in) and driver"
        detail += f"; {len(bad)} inf/NaN losses"
    elif not ok_drop or len(losses) < MIN_JUDGED_STEPS:
        status = "fail"
        hint = (
            f"the budget ({budgets['amp']:g} s) ended after {len(losses)} steps: the machine is "
            "very slow or very busy; rerun when it is idle"
            if run.stopped == "budget" and len(losses) < MIN_JUDGED_STEPS
            else "the loss did not fall: the GPU computes wrong results or AMP is broken"
        )
        detail += f"; it had to fall to {fraction:g} of its start"
    out.check(
        "amp-training",
        status,
        detail,
        value={
            "ms_per_step": round(run.ms_per_step, 3),
            "steps_per_s": round(run.steps_per_s, 3),
            "loss_first": first,
            "loss_last": last,
            "steps": len(losses),
            "stopped": run.stopped,
            "amp": amp,
        },
        expected={"loss_drop": fraction, "max_steps": cap, "budget_s": budgets["amp"]},
        seconds=time.perf_counter() - t0,
        hint=hint,
    )
    if status == "fail":
        return False
    run_speedup(out, torch, device, cfg)
    return True


def run_speedup(out: Out, torch: Torch, device: Any, cfg: dict[str, Any]) -> None:
    """AMP against FP32 steps/s, half the budget each."""
    half = cfg["budgets"]["speedup"] / 2.0
    t1 = time.perf_counter()
    try:
        amp = train(torch, device, cfg, amp=True, budget_s=half, seed=1)
        fp32 = train(torch, device, cfg, amp=False, budget_s=half, seed=1)
    except Exception as exc:
        out.check("amp-speedup", "fail", f"the AMP/FP32 timing runs raised {exc}")
        return
    speedup = amp.steps_per_s / fp32.steps_per_s if fp32.steps_per_s > 0 else 0.0
    detail = (
        f"AMP {amp.ms_per_step:.1f} ms/step vs FP32 {fp32.ms_per_step:.1f} ms/step: {speedup:.2f}x"
    )
    value = {
        "speedup": round(speedup, 3),
        "amp_ms_per_step": round(amp.ms_per_step, 3),
        "fp32_ms_per_step": round(fp32.ms_per_step, 3),
        "steps": [amp.timed_steps, fp32.timed_steps],
    }
    if device.type == "cpu":
        # bf16 speed on a CPU depends on AVX512-BF16/AMX: reported, never judged.
        native = cpu_native_bf16(torch)
        if native is False:
            detail += " (this CPU has no native bf16: autocast is emulated, so slower)"
        out.check("amp-speedup", "info", detail, value=value, seconds=time.perf_counter() - t1)
        return
    # Tensor cores make fp16 faster from Volta (7.0) on.
    status = (
        "warn" if torch.cuda.get_device_capability(device)[0] >= 7 and speedup < 1.0 else "pass"
    )
    out.check(
        "amp-speedup",
        status,
        detail,
        value=value,
        seconds=time.perf_counter() - t1,
        hint="mixed precision is slower than FP32 here: check the clocks and the torch build"
        if status == "warn"
        else None,
    )


def run_throughput(out: Out, torch: Torch, device: Any, cfg: dict[str, Any]) -> None:
    """The training advice, measured (CUDA only): cudnn.benchmark for the conv steps, pinned
    memory with non_blocking uploads, and the resulting steps/s against the same card in an
    internal slot (PyTorch performance tuning guide: "Enable cuDNN auto-tuner", "Use pinned
    memory ... non_blocking=True")."""
    quarter = cfg["budgets"]["throughput"] / 4.0
    old = torch.backends.cudnn.benchmark
    t0 = time.perf_counter()
    try:
        torch.backends.cudnn.benchmark = False
        plain = train(torch, device, cfg, amp=True, budget_s=quarter, seed=2)
        torch.backends.cudnn.benchmark = True
        tuned = train(torch, device, cfg, amp=True, budget_s=quarter, seed=2)
        pageable = train(torch, device, cfg, amp=True, budget_s=quarter, seed=2, feed="pageable")
        pinned = train(torch, device, cfg, amp=True, budget_s=quarter, seed=2, feed="pinned")
    except Exception as exc:
        out.check(
            "train-throughput",
            "fail",
            f"the throughput runs raised {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
        )
        return
    finally:
        torch.backends.cudnn.benchmark = old
    gain = tuned.steps_per_s / plain.steps_per_s if plain.steps_per_s else 0.0
    out.check(
        "cudnn-benchmark",
        "info",
        f"torch.backends.cudnn.benchmark: {plain.ms_per_step:.2f} -> {tuned.ms_per_step:.2f} "
        f"ms/step ({gain:.2f}x)",
        value={"off_ms": round(plain.ms_per_step, 3), "on_ms": round(tuned.ms_per_step, 3)},
        hint="set torch.backends.cudnn.benchmark = True for fixed-size inputs"
        if gain > 1.05
        else None,
    )
    gain = pinned.steps_per_s / pageable.steps_per_s if pageable.steps_per_s else 0.0
    out.check(
        "h2d-pinned",
        "info",
        f"a batch uploaded per step: pageable {pageable.ms_per_step:.2f} ms/step, pinned + "
        f"non_blocking {pinned.ms_per_step:.2f} ms/step ({gain:.2f}x)",
        value={
            "pageable_ms": round(pageable.ms_per_step, 3),
            "pinned_ms": round(pinned.ms_per_step, 3),
        },
        hint="DataLoader(pin_memory=True) and .to(device, non_blocking=True)"
        if gain > 1.05
        else None,
    )
    ref = cfg.get("reference")
    rate = pinned.steps_per_s
    detail = f"{rate:.1f} steps/s (AMP, cudnn.benchmark, pinned non_blocking uploads)"
    value = {"steps_per_s": round(rate, 3), "share": None}
    if not ref:
        out.check(
            "train-throughput",
            "info",
            detail + "; no internal-slot reference for this card yet",
            value=value,
            seconds=time.perf_counter() - t0,
        )
        return
    share = rate / ref["steps_per_s"]
    value["share"] = round(share, 3)
    status = "pass" if share >= 0.5 else "warn"
    out.check(
        "train-throughput",
        status,
        detail + f": {share:.0%} of {ref['steps_per_s']:g} steps/s in {ref['slot']} "
        f"({ref['source']})",
        value=value,
        expected=ref,
        seconds=time.perf_counter() - t0,
        hint="far below the same card in an internal slot: check pcie-link and h2d-bandwidth"
        if status == "warn"
        else None,
    )


def run_burn_in(out: Out, torch: Torch, device: Any, cfg: dict[str, Any]) -> None:
    """One long AMP training run; the median step time of its last quarter against its first
    quarter shows thermal or power throttling, inf/NaN losses show instability."""
    seconds = float(cfg["burn_in_s"])
    t0 = time.perf_counter()
    step_ms: list[float] = []
    try:
        run = train(torch, device, cfg, amp=True, budget_s=seconds, step_ms=step_ms)
    except Exception as exc:
        out.check(
            "burn-in",
            "fail",
            f"failed after {time.perf_counter() - t0:.0f} s: {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            hint="the GPU is unstable under sustained load: check cooling and power",
        )
        return
    losses = run.losses
    bad = sum(1 for v in losses if not math.isfinite(v))
    q = max(1, len(step_ms) // 4)
    first = _median(step_ms[:q]) if step_ms else 0.0
    last = _median(step_ms[-q:]) if step_ms else 0.0
    slowdown = last / first if first > 0 else 1.0
    status = "fail" if bad else "warn" if slowdown > 1.3 else "pass"
    out.check(
        "burn-in",
        status,
        f"{time.perf_counter() - t0:.0f} s, {len(losses)} steps, {bad} inf/NaN, "
        f"median ms/step first quarter {first:.1f} -> last quarter {last:.1f}",
        value={
            "steps": len(losses),
            "slowdown": round(slowdown, 3),
            "nonfinite": bad,
            "scaler_skipped": run.skipped,
        },
        expected={"max_slowdown": 1.3},
        seconds=time.perf_counter() - t0,
        hint="steps slowed down over time: thermal or power throttling"
        if status == "warn"
        else "inf/NaN losses under sustained load: the GPU is unstable"
        if status == "fail"
        else None,
    )


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _ddp_worker(
    rank: int, world: int, backend: str, init_file: str, result_dir: str, rendezvous_s: float
) -> None:
    import datetime

    torch = import_torch()
    import torch.distributed as dist

    torch.set_num_threads(1)  # ranks share the machine; spinning OpenMP threads fight each other
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        # a rank that never arrives (or a hung NCCL init) ends the rendezvous, not the run
        timeout=datetime.timedelta(seconds=rendezvous_s),
    )
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        t = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(t)
        expected = world * (world + 1) / 2
        model = torch.nn.Linear(16, 4).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if backend == "nccl" else None
        )
        loss = ddp(torch.randn(8, 16, device=device)).sum()
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        for g in grads:
            dist.all_reduce(g)
        ok = bool(torch.allclose(t, torch.full_like(t, expected)))
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"ok": ok, "sum": float(t[0])}, f)
        # Every rank reaches this point before any tears down: gloo aborts a rank whose peer
        # closed its connection while it was still finishing (seen as a rare SIGABRT here).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ddp(out: Out, torch: Torch, device: Any, cfg: dict[str, Any], work_dir: str) -> None:
    import tempfile

    cuda = device.type == "cuda"
    if cuda:
        count = torch.cuda.device_count()
        if count < 2:
            out.check("ddp", "skip", f"{count} GPU: DDP/NCCL needs two or more")
            return
        world, backend = min(count, 8), "nccl"
    else:
        world, backend = 2, "gloo"
    budget = Budget(cfg["budgets"]["ddp"])
    tmp = tempfile.mkdtemp(prefix="ddp-", dir=work_dir)
    import torch.multiprocessing as mp

    ctx = None
    try:
        ctx = mp.start_processes(
            _ddp_worker,
            args=(world, backend, os.path.join(tmp, "init"), tmp, budget.seconds * 0.8),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        teardown = ""
        try:
            while not ctx.join(timeout=0.5):
                if budget.over():
                    raise TimeoutError(f"the ranks did not finish within {budget.seconds:g} s")
        except mp.ProcessExitedException as exc:
            # gloo can abort a rank while the group is torn down, after every rank wrote its
            # result (past the barrier): the all-reduce and the DDP step did run
            if not all(os.path.exists(os.path.join(tmp, f"rank{r}.json")) for r in range(world)):
                raise
            teardown = f" (then {exc} while the group was torn down)"
        results = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                results.append(json.load(f))
    except Exception as exc:
        if ctx is not None:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
                proc.join(5)
        out.check(
            "ddp",
            "fail",
            f"{world}-rank {backend} all-reduce/DDP failed: {type(exc).__name__}: {exc}",
            seconds=budget.spent(),
            hint="see NCCL_DEBUG=INFO output; peer-to-peer over Thunderbolt is often unsupported"
            if cuda
            else "the machine may be too busy to start two torch processes in time",
        )
        return
    ok = all(r["ok"] for r in results)
    out.check(
        "ddp",
        "pass" if ok else "fail",
        f"{world} ranks, {backend}: all-reduce {'correct' if ok else 'WRONG'}, DDP step ran"
        f"{teardown}",
        value=world,
        seconds=budget.spent(),
    )


# -- CUDA-only steps -------------------------------------------------------------------------------


def torch_build(cuda: str | None, hip: str | None) -> str:
    """What a torch build runs on: "CUDA 12.8", "ROCm (HIP 7.2.53211)" or "CPU-only build". A ROCm
    build has torch.version.hip set and torch.version.cuda None, and keeps the torch.cuda API
    and the "cuda" device (https://pytorch.org/docs/stable/notes/hip.html)."""
    if hip:
        return f"ROCm (HIP {hip})"
    return f"CUDA {cuda}" if cuda else "CPU-only build"


def gfx_covers(
    arch_list: list[str], gcn_arch: str | None, override: str | None = None
) -> tuple[str, str]:
    """(status, detail): does a ROCm build's arch list (gfx targets) hold this GPU's gfx target?
    `gcn_arch` is get_device_properties().gcnArchName, features after a colon
    ("gfx90a:sramecc+:xnack-"); no JIT stands in for a missing target, unlike CUDA's PTX.
    `override`: HSA_OVERRIDE_GFX_VERSION as the child got it. The runtime then reports the GPU
    as that target, so a pass rests on the override (not supported by AMD): a warning, said."""
    want = (gcn_arch or "").split(":", 1)[0]
    if not want:
        return "skip", "the GPU's gfx target is unknown (no gcnArchName)"
    have = [a.split(":", 1)[0] for a in arch_list]
    said = (
        f" (HSA_OVERRIDE_GFX_VERSION={override} is set: the runtime reports the GPU as this "
        "target, which AMD does not support)"
        if override
        else ""
    )
    if want in have:
        return ("warn" if override else "pass"), f"{want} is compiled in{said}"
    return "fail", f"{want} is not among the build's targets ({', '.join(have) or 'none'}){said}"


def cuda_init(out: Out, torch: Torch, cfg: dict[str, Any]) -> int | None:
    """torch-cuda-build, torch-driver-cuda, cuda-available; the device count, or None to stop."""
    gpus = cfg.get("nvidia_gpus") or []
    wheel = torch.version.cuda
    hip = getattr(torch.version, "hip", None)
    if hip:
        # a ROCm build: no CUDA runtime and no NVIDIA driver to compare it with (amdgpu is part
        # of the kernel; the ROCm libraries come with the wheel)
        out.check("torch-cuda-build", "pass", f"built for {torch_build(None, hip)}", value=hip)
        out.check(
            "torch-driver-cuda",
            "skip",
            "a ROCm build: amdgpu is part of the kernel, there is no CUDA driver to compare",
        )
        return _devices(out, torch)
    if not wheel:
        seen = f" while this machine has an NVIDIA GPU ({gpus[0]})" if gpus else ""
        out.check(
            "torch-cuda-build",
            "fail",
            f"torch {torch.__version__} is a CPU-only build{seen}",
            value=torch.__version__,
            hint="install a CUDA build: `egpu-setup install --only torch --profile NAME` "
            "(or `egpu-setup verify --device cpu` to check the CPU path)",
        )
        return None
    out.check("torch-cuda-build", "pass", f"built for CUDA {wheel}", value=wheel)
    driver = cfg.get("driver_cuda") or driver_cuda_version(torch)
    status, detail = compare_cuda(wheel, driver)
    out.check(
        "torch-driver-cuda",
        status,
        detail,
        value=wheel,
        expected=driver,
        hint="upgrade the driver or install the torch build for the driver's CUDA "
        "(`egpu-setup resolve` shows the match)"
        if status == "fail"
        else None,
    )
    return _devices(out, torch)


def _devices(out: Out, torch: Torch) -> int | None:
    """cuda-available: the device count torch sees (CUDA or ROCm), or None to stop."""
    t0 = time.perf_counter()
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
        reason = None
        if not available:
            try:
                torch.cuda.init()
            except Exception as exc:
                reason = (
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                )
    if not available or count == 0:
        why = reason or "; ".join(str(w.message).splitlines()[0] for w in caught) or "no device"
        out.check(
            "cuda-available",
            "fail",
            f"torch.cuda.is_available() is False: {why}",
            seconds=time.perf_counter() - t0,
            hint="run `egpu-setup doctor`: the driver is not loaded, too old for this wheel, "
            "or the eGPU is not authorized",
        )
        return None
    out.check(
        "cuda-available",
        "pass",
        f"{count} CUDA device(s)",
        value=count,
        seconds=time.perf_counter() - t0,
    )
    return count


def driver_cuda_version(torch: Torch) -> str | None:
    """The CUDA version the driver supports, from the driver API (e.g. 12040 -> "12.4"); this
    private torch function is long-standing but not a promise, so any failure is "unknown"."""
    try:
        v = int(torch._C._cuda_getDriverVersion())
    except Exception:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else None


def device_bus_id(torch: Torch, index: int) -> str | None:
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    dom = getattr(props, "pci_domain_id", 0) or 0
    dev = getattr(props, "pci_device_id", 0) or 0
    return f"{dom:04x}:{bus:02x}:{dev:02x}.0"


def pick_device(out: Out, torch: Torch, cfg: dict[str, Any], count: int) -> int | None:
    """Choose the CUDA index to verify and emit device-is-egpu; None when it must stop.

    The target is the eGPU, or, on a machine without one, the NVIDIA GPU detection found (a
    server's card in its PCIe slot): what is checked is that torch uses *that* GPU."""
    buses = [device_bus_id(torch, i) for i in range(count)]
    target = cfg.get("target") or {}
    want = target.get("pci_address")
    external = target.get("external")
    what = "the eGPU" if external else "the GPU"
    requested = cfg["device"]
    order_hint = None
    if count > 1:
        by_bus = sorted(range(count), key=lambda i: buses[i] or "")
        order_hint = by_bus
    if requested.startswith("cuda:"):
        index = int(requested.split(":", 1)[1])
        if index >= count:
            out.check("device-is-egpu", "fail", f"{requested} does not exist ({count} devices)")
            return None
    elif want and want in buses:
        index = buses.index(want)
    else:
        index = 0
    name = torch.cuda.get_device_name(index)
    bus = buses[index]
    value = {"index": index, "pci_bus_id": bus, "name": name, "external": external}
    if want is None:
        status = "skip" if requested != "auto" else "warn"
        detail = (
            f"no external GPU detected; verifying cuda:{index} {name} ({bus or 'bus id unknown'})"
        )
        out.check("device-is-egpu", status, detail, value=value)
    elif bus is None:
        out.check(
            "device-is-egpu",
            "warn",
            f"this torch does not report PCI bus ids; cannot confirm cuda:{index} is {want}",
            value=value,
            expected=want,
        )
    elif bus == want:
        where = f"{what} at {want}"
        status = "pass"
        hint = None
        if target.get("laptop_gpu") and not external:
            # the laptop's own GPU: what runs here is not the eGPU this tool is meant to prove
            where += " (the laptop's own GPU, not an eGPU)"
            status = "warn"
            hint = "connect the enclosure and authorize it (`egpu-setup doctor`) to verify the eGPU"
        elif not external:
            # a desktop or server slot (a datacenter card): verified as what it is
            where += f" (a {target.get('connection') or 'PCIe'} slot, not an eGPU)"
        detail = f"cuda:{index} {name} is {where}"
        if order_hint is not None:
            pci_index = order_hint.index(index)
            detail += f"; {count} GPUs: under CUDA_DEVICE_ORDER=PCI_BUS_ID it is cuda:{pci_index}"
            hint = hint or f"export CUDA_DEVICE_ORDER=PCI_BUS_ID so it is always cuda:{pci_index}"
        out.check("device-is-egpu", status, detail, value=value, expected=want, hint=hint)
    else:
        status = "fail" if requested == "auto" else "warn"
        out.check(
            "device-is-egpu",
            status,
            f"torch sees {', '.join(b or '?' for b in buses)} but not {what} at {want}",
            value=value,
            expected=want,
            hint="check CUDA_VISIBLE_DEVICES and that the enclosure is authorized "
            "(`egpu-setup doctor`)",
        )
        if status == "fail":
            return None
    return index


def emit_device(out: Out, torch: Torch, device: Any, cfg: dict[str, Any]) -> None:
    rec = {
        "kind": "device",
        "type": device.type,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        rec.update(
            index=device.index,
            name=props.name,
            pci_bus_id=device_bus_id(torch, device.index),
            compute_capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 2),
            total_memory=props.total_memory,
            mem_get_info=[free, total],
            multiprocessors=props.multi_processor_count,
            cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            device_count=torch.cuda.device_count(),
            driver_cuda=driver_cuda_version(torch),
            arch_list=torch.cuda.get_arch_list(),
            gcn_arch=getattr(props, "gcnArchName", None),  # ROCm builds only: "gfx1100"
        )
    else:
        rec.update(
            name="cpu",
            threads=torch.get_num_threads(),
            cpu_capability=_cpu_capability(torch),
            native_bf16=cpu_native_bf16(torch),
        )
    out.emit(rec)


def _cpu_capability(torch: Torch) -> Any:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:
        return None


def run_arch(out: Out, torch: Torch, device: Any) -> None:
    archs = torch.cuda.get_arch_list()
    if getattr(torch.version, "hip", None):
        # a ROCm build lists gfx targets; the device names its own in gcnArchName
        gcn = getattr(torch.cuda.get_device_properties(device), "gcnArchName", None)
        status, detail = gfx_covers(archs, gcn, os.environ.get("HSA_OVERRIDE_GFX_VERSION"))
        expected = (gcn or "").split(":", 1)[0] or None
        build = "the torch ROCm build for this gfx target"
    else:
        cc = torch.cuda.get_device_capability(device)
        status, detail = arch_covers(archs, cc)
        expected = f"sm_{cc[0]}{cc[1]}"
        build = "a torch build compiled for this GPU"
    out.check(
        "arch-list",
        status,
        detail,
        value=archs,
        expected=expected,
        hint=f"install {build} (`egpu-setup resolve` picks one)" if status == "fail" else None,
    )


def run_allocation(out: Out, torch: Torch, device: Any, cfg: dict[str, Any]) -> None:
    share = 0.5 if cfg["quick"] else 0.8
    t0 = time.perf_counter()
    free, total = torch.cuda.mem_get_info(device)
    want = int(free * share) // 4 * 4
    try:
        block = torch.empty(want // 4, dtype=torch.float32, device=device)
        block.fill_(1.0)
        total_sum = float(block[:: max(1, block.numel() // 4096)].sum())
        ok = total_sum > 0
        del block
        torch.cuda.empty_cache()
    except Exception as exc:
        out.check(
            "large-allocation",
            "fail",
            f"allocating {want / 2**30:.1f} GiB of {free / 2**30:.1f} GiB free failed: {exc}",
            seconds=time.perf_counter() - t0,
            hint="another process holds GPU memory (nvidia-smi), or the BAR/memory setup is broken",
        )
        return
    out.check(
        "large-allocation",
        "pass" if ok else "fail",
        f"{want / 2**30:.1f} GiB ({share:.0%} of {free / 2**30:.1f} GiB free, {total / 2**30:.1f} "
        "GiB total) allocated, written and read back",
        value=round(want / 2**30, 2),
        seconds=time.perf_counter() - t0,
    )


def read_link(bus_id: str | None, root: str = "/") -> dict[str, Any]:
    """The GPU's PCIe link from sysfs right now (it trains down when idle, so read under load).

    `root` is "/" on a live machine; a recorded machine's tree is read only where its links stay
    inside it."""
    if not bus_id:
        return {}
    base = os.path.realpath(os.path.join(root, "sys/bus/pci/devices", bus_id))
    if os.path.commonpath([base, os.path.realpath(root)]) != os.path.realpath(root):
        return {}
    vals = {}
    for key in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
        vals[key] = (_read(os.path.join(base, key)) or "").strip()

    def width(text: str | None) -> int | None:
        return int(text) if text and text.isdigit() else None

    return {
        "speed_gts": parse_speed(vals.get("current_link_speed")),
        "width": width(vals.get("current_link_width")),
        "max_speed_gts": parse_speed(vals.get("max_link_speed")),
        "max_width": width(vals.get("max_link_width")),
    }


def judge_link(
    link: dict[str, Any], connection: str | None, tb_gen: int | None, expect: dict[str, Any]
) -> tuple[str, str, tuple[float, int] | None]:
    """(status, detail, limit (GT/s, width) of the path) for the link seen under load."""
    speed, width = link.get("speed_gts"), link.get("width")
    mspeed, mwidth = link.get("max_speed_gts"), link.get("max_width")
    if speed is None or width is None:
        return "skip", "link speed/width not readable from sysfs", None
    gen = {v: k for k, v in _SPEED_BY_GEN.items()}.get(speed)
    text = f"PCIe {speed:g} GT/s (gen {gen}) x{width}"
    status = "pass"
    notes = []
    if mspeed and mwidth and (speed < mspeed or width < mwidth):
        notes.append(f"below the GPU's max {mspeed:g} GT/s x{mwidth}")
    cap = tunnel_cap(connection, tb_gen)
    limit = (speed, width)
    if cap:
        limit = (min(speed, cap[0]), min(width, cap[1]))
        notes.append(f"{connection} carries at most {cap[0]:g} GT/s x{cap[1]}")
    elif mspeed and mwidth and (speed < mspeed or width < mwidth):
        status = "warn"  # a plain slot or OCuLink should train to its max under load
    min_gen, min_width = expect.get("min_link_gen"), expect.get("min_link_width")
    if min_gen and gen and gen < min_gen:
        status = "warn"
        notes.append(f"profile expects gen {min_gen}+")
    if min_width and width < min_width:
        status = "warn"
        notes.append(f"profile expects x{min_width}+")
    # an x1 link is the classic degraded eGPU mode (the kernel's "limited by ... x1 link" line)
    if width <= 1:
        status = "warn"
    return status, text + ("; " + "; ".join(notes) if notes else ""), limit


def _bandwidth(
    torch: Torch, device: Any, direction: str, nbytes: int, budget: Budget, min_s: float
) -> float:
    """Pinned copies in one direction until `min_s` of device time is measured (or the budget
    is spent); GB/s."""
    clock = Clock(torch, device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src, dst = (host, dev) if direction == "h2d" else (dev, host)
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    n = 0
    start = clock.mark()
    while True:
        for _ in range(4):
            dst.copy_(src, non_blocking=True)
        n += 4
        elapsed = clock.seconds(start, clock.mark())
        if elapsed >= min_s or budget.over():
            break
    return nbytes * n / elapsed / 1e9


def run_bandwidth(
    out: Out, torch: Torch, device: Any, cfg: dict[str, Any], bus_id: str | None
) -> None:
    target = cfg.get("target") or {}
    connection = target.get("connection") if target.get("pci_address") == bus_id else None
    tb_gen = target.get("tb_generation")
    expect = cfg["expect"]
    root = cfg.get("sysfs_root") or "/"
    nbytes = (64 if cfg["quick"] else 256) * 2**20
    seconds = cfg["budgets"]["bandwidth"]
    results = {}
    link: dict[str, Any] = {}
    t0 = time.perf_counter()
    for direction in ("h2d", "d2h"):
        budget = Budget(seconds)
        try:
            stop = threading.Event()
            seen: list[dict[str, Any]] = []

            def watch(stop: threading.Event = stop, seen: list[dict[str, Any]] = seen) -> None:
                while not stop.is_set():
                    seen.append(read_link(bus_id, root))
                    stop.wait(0.05)

            th = threading.Thread(target=watch, daemon=True)
            th.start()
            try:
                gbs = _bandwidth(torch, device, direction, nbytes, budget, seconds * 0.5)
            finally:
                stop.set()
                th.join(timeout=5)
            if not link:
                link = max(
                    (s for s in seen if s.get("speed_gts")),
                    key=lambda s: (s.get("speed_gts") or 0, s.get("width") or 0),
                    default={},
                )
        except Exception as exc:
            out.check(
                f"{direction}-bandwidth",
                "fail",
                f"pinned copy failed: {type(exc).__name__}: {exc}",
                seconds=budget.spent(),
            )
            continue
        results[direction] = (gbs, budget.spent())
    if not link:
        link = read_link(bus_id, root)
    status, detail, limit = judge_link(link, connection, tb_gen, expect)
    out.check(
        "pcie-link",
        status,
        detail,
        value=link or None,
        expected={
            "connection": connection,
            "min_gen": expect.get("min_link_gen"),
            "min_width": expect.get("min_link_width"),
        },
        seconds=time.perf_counter() - t0,
        hint="reseat the cable / use a certified Thunderbolt cable; check `egpu-setup doctor`"
        if status == "warn"
        else None,
    )
    theory = pcie_rate_gbs(*limit) if limit else None
    # an internal slot is judged against its own link: the profile's "pcie" floor, or a share
    h2d_expect = (expect.get("h2d_gbps") or {}).get(connection or "pcie")
    for direction, (gbs, secs) in results.items():
        share = gbs / theory if theory else None
        expected = h2d_expect if direction == "h2d" else None
        if expected:  # profile `expect.h2d_gbps` is a floor: below it warns, below half fails
            status = judge_ratio(gbs, expected, 0.5, 1.0)
        elif share is not None:
            status = "warn" if share < 0.4 else "pass"
        else:
            status = "pass"
        detail = f"{gbs:.2f} GB/s pinned"
        if share is not None:
            detail += f", {share:.0%} of the link's {theory:.2f} GB/s"
        if expected:
            detail += f" (floor {expected:g} GB/s)"
        out.check(
            f"{direction}-bandwidth",
            status,
            detail,
            value=round(gbs, 3),
            expected=expected if expected else (round(theory, 3) if theory else None),
            seconds=secs,
            hint="low transfer rate: check the link (pcie-link) and the cable"
            if status != "pass"
            else None,
        )


# -- main ----------------------------------------------------------------------------------------


def run(cfg: dict[str, Any], out: Out | None = None) -> int:
    out = out or Out(cfg.get("progress"))
    skip = set(cfg.get("skip") or ())
    out.step("import")
    torch = check_import(out)
    if torch is None:
        out.emit({"kind": "end"})
        return 0
    want = cfg["device"]
    if want == "cpu":
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            # The smoke model is tiny: with every core busy elsewhere, OpenMP threads spinning
            # against each other made a step 8-13x slower than one thread (measured on a loaded
            # 2-core machine: 145-233 ms vs 18 ms). Half the cores, at most 4, avoids that.
            torch.set_num_threads(max(1, min(4, (os.cpu_count() or 2) // 2)))
        emit_device(out, torch, device, cfg)
    else:
        out.step("cuda-init")
        count = cuda_init(out, torch, cfg)
        if count is None:
            out.emit({"kind": "end"})
            return 0
        out.step("identity")
        index = pick_device(out, torch, cfg, count)
        if index is None:
            out.emit({"kind": "end"})
            return 0
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        emit_device(out, torch, device, cfg)
        run_arch(out, torch, device)
        if "allocation" not in skip:
            out.step("allocation")
            run_allocation(out, torch, device, cfg)
        if "bandwidth" not in skip:
            out.step("bandwidth")
            run_bandwidth(out, torch, device, cfg, device_bus_id(torch, index))
    cuda = device.type == "cuda"
    bus = device_bus_id(torch, device.index) if cuda else None
    sampler = Sampler(bus, 0.5 if cfg["quick"] else 1.0, cfg.get("nvidia_smi")) if cuda else None
    if sampler:
        sampler.__enter__()
    try:
        if "matmul" not in skip:
            out.step("matmul")
            run_matmul(out, torch, device, cfg)
        trains = True
        if "amp" not in skip:
            out.step("amp")
            trains = run_amp(out, torch, device, cfg)
        if cuda and trains and "throughput" not in skip:
            out.step("throughput")
            run_throughput(out, torch, device, cfg)
        if cfg.get("burn_in_s") and "burn-in" not in skip:
            out.step("burn-in")
            run_burn_in(out, torch, device, cfg)
    finally:
        if sampler:
            sampler.__exit__(None, None, None)
    if sampler:
        sampler_checks(out, sampler, cfg["expect"])
    if "ddp" not in skip and not (device.type == "cpu" and cfg["quick"]):
        out.step("ddp")
        run_ddp(out, torch, device, cfg, cfg["work_dir"])
    out.step("done")
    out.emit({"kind": "end"})
    return 0


def main(argv: list[str]) -> int:
    import faulthandler

    faulthandler.enable()  # a native crash (the CUDA driver) prints the Python stack to stderr
    with open(argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
