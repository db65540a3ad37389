"""The verify child: runs inside the TARGET Python (the venv that received torch), by path.

The parent (egpu_setup/verify/runner.py) starts this file as
`<target python> -I _child.py CONFIG.json` in its own process group with a hard timeout, so a
GPU that hangs the CUDA driver (Blackwell eGPUs over TB4/TB5 hard-lock under CUDA:
reference/egpu-tools.md item 18, hotplug-security.md §7 rows 10 and 39) can never hang the tool.

Why one self-contained file: the target venv does not have egpu_setup installed, and must not
need it, so this file imports only the standard library and torch (torch inside the functions that
use it, so a missing torch is a check result, not a crash).
Keep it compatible with every Python the PyTorch wheels support (3.9+).

Protocol (read by the parent):
- CONFIG.json: what to run (device, quick, burn-in, skips, expectations, the eGPU's PCI address).
- `results` (JSON lines, flushed per line): {"kind": "check", id, status, detail, value,
  expected, seconds, hint}, {"kind": "device", ...}, {"kind": "end"}.
- `progress` (JSON lines, fsynced per line): {"event": "step", "step", "time", "pid"} written
  BEFORE each step starts, so a machine that locks up mid-step leaves the step's name on disk.

Test hooks (documented in docs/reports/README.md; they fire only when set):
- EGPU_SETUP_VERIFY_TEST_HANG=<step>: sleep forever when <step> starts (a hung CUDA call).
- EGPU_SETUP_VERIFY_TEST_CRASH=<step>: die by SIGSEGV when <step> starts (a crashing driver).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

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
    "burn-in",
    "ddp",
)

# PCIe transfer rate per lane and line code (PCI Express Base Specification 1.0-6.0: 8b/10b for
# 2.5/5 GT/s, 128b/130b from 8 GT/s; 6.0's FLIT mode is close to 1.0 and counted as such).
_ENCODING = {2.5: 0.8, 5.0: 0.8, 8.0: 128 / 130, 16.0: 128 / 130, 32.0: 128 / 130, 64.0: 1.0}
_SPEED_BY_GEN = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

# The PCIe link a tunnel carries (inference from reference/hotplug-security.md §1.6: TB3/TB4 and
# USB4 v1 tunnel about PCIe 3.0 x4, TB5 / USB4 v2 and OCuLink about PCIe 4.0 x4). The GPU's own
# link to the enclosure's bridge may read x16: the tunnel is the real limit.
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


def judge_ratio(value: float, expected: float | None, fail_below: float, warn_below: float):
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


# -- plumbing ----------------------------------------------------------------------------------


class Out:
    """Results and progress files. Results are flushed per line; progress is fsynced per line."""

    def __init__(self, results: str, progress: str | None):
        self._results = open(results, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as we do
        self._progress = progress

    def emit(self, record: dict) -> None:
        self._results.write(json.dumps(record, default=str) + "\n")
        self._results.flush()

    def check(self, cid, status, detail, value=None, expected=None, seconds=None, hint=None):
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
        """Record (durably) that `name` starts now, then honour the test hooks."""
        if self._progress:
            line = json.dumps(
                {"event": "step", "step": name, "time": time.time(), "pid": os.getpid()}
            )
            fd = os.open(self._progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        if os.environ.get("EGPU_SETUP_VERIFY_TEST_HANG") == name:
            while True:  # a CUDA call that never returns
                time.sleep(3600)
        if os.environ.get("EGPU_SETUP_VERIFY_TEST_CRASH") == name:
            os.kill(os.getpid(), signal.SIGSEGV)


class Sampler:
    """Temperature, power and clocks-event reasons of one GPU, sampled by nvidia-smi in a thread.

    nvidia-smi rather than NVML bindings: torch.cuda.temperature() needs pynvml, which CUDA wheels
    do not pull in; nvidia-smi ships with every driver. It runs in our process group, so the
    parent's timeout kills it with us.
    """

    FIELDS = ("temperature.gpu", "power.draw", "clocks_event_reasons.active")

    def __init__(self, bus_id: str | None, interval: float):
        self.bus_id = bus_id
        self.interval = interval
        self.samples: list[dict] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._smi = shutil.which("nvidia-smi")
        self._fields = self.FIELDS

    def __enter__(self):
        if self._smi and self.bus_id:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        elif not self._smi:
            self.error = "nvidia-smi not found"
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def sample_once(self) -> None:
        argv = [
            self._smi or "nvidia-smi",
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


def parse_sample(line: str) -> dict | None:
    """ "64, 312.45, 0x0000000000000004" -> {"temp": 64.0, "power": 312.45, "reasons": 4}."""
    parts = [p.strip() for p in line.splitlines()[0].split(",")] if line else []
    if len(parts) != 3:
        return None

    def num(text):
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
    values: list,
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


def sampler_checks(out: Out, sampler: Sampler, expect: dict) -> None:
    """Temperature, power and throttle checks from the samples (warnings only: issue #7)."""
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
    seen = sorted({n for m in masks for n in throttle_names(m)})
    if not masks:
        out.check("gpu-throttle", "skip", "the GPU reports no clocks event reasons")
    elif seen:
        out.check(
            "gpu-throttle",
            "warn",
            "clocks slowed: " + ", ".join(seen),
            value=seen,
            hint="check cooling and the enclosure's power supply",
        )
    else:
        out.check("gpu-throttle", "pass", "no thermal or power-brake slowdown", value=[])


# -- torch work ----------------------------------------------------------------------------------


def check_import(out: Out) -> object | None:
    t0 = time.perf_counter()
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything
        out.check(
            "torch-import",
            "fail",
            f"cannot import torch in {sys.executable}: {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            hint="install torch into this venv: `egpu-setup install --only torch --profile NAME`",
        )
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    out.check(
        "torch-import",
        "pass",
        f"torch {torch.__version__} ({build}) in {time.perf_counter() - t0:.1f} s",
        value=torch.__version__,
        seconds=time.perf_counter() - t0,
    )
    return torch


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_matmul(torch, device, dtype, n: int, min_seconds: float) -> float:
    """Achieved TFLOPS of an n x n x n matmul (2 n^3 flops per product)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.matmul(a, b)
    _sync(torch, device)
    iters = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(4):
            torch.matmul(a, b)
        iters += 4
        _sync(torch, device)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            break
    return 2.0 * n**3 * iters / elapsed / 1e12


def run_matmul(out: Out, torch, device, cfg: dict) -> None:
    expect = cfg["expect"]
    quick = cfg["quick"]
    if device.type == "cuda":
        n = 4096 if quick else 8192
        min_s = 0.2 if quick else 0.5
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
        n = 512 if quick else 1024
        min_s = 0.1 if quick else 0.3
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
            t0 = time.perf_counter()
            try:
                tflops = _timed_matmul(torch, device, dtype, n, min_s)
            except Exception as exc:
                out.check(
                    cid, "fail", f"{n}x{n} matmul failed: {exc}", seconds=time.perf_counter() - t0
                )
                continue
            # expectations are vendor peak rates; torch reaches roughly 60-90 % of them on large
            # matmuls, so only a GPU far below (stuck clocks, throttling) warns or fails
            status = judge_ratio(tflops, expected, 0.25, 0.5)
            detail = f"{tflops:.2f} TFLOPS ({n}x{n})"
            if expected:
                detail += f", {tflops / expected:.0%} of the expected {expected:g}"
            out.check(
                cid,
                status,
                detail,
                value=round(tflops, 3),
                expected=expected,
                seconds=time.perf_counter() - t0,
                hint="the GPU is far below its rated speed: check clocks, power and temperature "
                "(nvidia-smi -q -d PERFORMANCE)"
                if status != "pass"
                else None,
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32


def make_data(torch, device, n: int, size: int, seed: int):
    """Synthetic 4-class images: which quadrant is bright (reference/fleet-and-testing.md §5)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g) * 0.5
    y = torch.randint(0, 4, (n,), generator=g)
    h = size // 2
    for cls, (r, c) in enumerate(((0, 0), (0, h), (h, 0), (h, h))):
        idx = (y == cls).nonzero().flatten()
        x[idx, :, r : r + h, c : c + h] += 1.5
    return x.to(device), y.to(device)


def make_model(torch, width: int):
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


def train(
    torch,
    device,
    steps: int,
    amp: bool,
    cfg: dict,
    seed: int = 0,
    deadline: float = 0.0,
    step_ms: list | None = None,
):
    """Train the small CNN; return (losses, ms per step, skipped steps, amp dtype name).

    CUDA: fp16 autocast + GradScaler; CPU: bf16 autocast, no scaler (GradScaler is for fp16 on
    CUDA; CPU autocast supports bf16 and fp16, bf16 being the fast one: reference §5).
    With `deadline` (burn-in) it runs until time.perf_counter() passes it; `step_ms` then
    collects each step's duration (synchronised per step, so a slowing GPU shows).
    """
    torch.manual_seed(seed)
    cuda = device.type == "cuda"
    batch, size, width = (256, 64, 64) if cuda else (64, 32, 16)
    if cfg["quick"] and cuda:
        batch = 128
    x, y = make_data(torch, device, batch * 8, size, seed)
    model = make_model(torch, width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if (amp and cuda) else None
    losses: list[float] = []
    skipped = 0
    warm = 3
    t_start = None
    t_prev = time.perf_counter()
    i = 0
    while True:
        if deadline and time.perf_counter() >= deadline:
            break
        if not deadline and i >= max(steps, warm + 1):
            break
        if i == warm:
            _sync(torch, device)
            t_start = time.perf_counter()
        j = (i % 8) * batch
        xb, yb = x[j : j + batch], y[j : j + batch]
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
    _sync(torch, device)
    timed = max(1, i - warm)
    ms = (time.perf_counter() - (t_start or time.perf_counter())) * 1000.0 / timed
    return losses, ms, skipped, str(dtype).replace("torch.", "")


def run_amp(out: Out, torch, device, cfg: dict) -> None:
    expect = cfg["expect"]
    steps = int(expect.get("amp_steps") or 200)
    if cfg["quick"]:
        steps = max(20, steps // 5)
    fraction = float(expect.get("amp_loss_drop") or 0.5)
    t0 = time.perf_counter()
    try:
        losses, ms, skipped, dtype = train(torch, device, steps, True, cfg)
    except Exception as exc:
        out.check(
            "amp-training",
            "fail",
            f"AMP training raised {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            hint="see `egpu-setup doctor`; a CUDA error here often means the link or driver failed",
        )
        return
    bad = [v for v in losses if not math.isfinite(v)]
    ok_drop, first, last = loss_dropped(losses, fraction)
    scaler = ", GradScaler" if device.type == "cuda" else ""
    detail = (
        f"{len(losses)} steps {dtype} autocast{scaler}: loss {first:.3f} -> {last:.4f}, "
        f"{ms:.1f} ms/step"
    )
    if skipped:
        detail += f", {skipped} steps skipped by the scaler"
    status = "pass"
    hint = None
    if bad:
        status, hint = "fail", "inf/NaN losses: check the GPU's stability (--burn-in) and driver"
        detail += f"; {len(bad)} inf/NaN losses"
    elif not ok_drop:
        status, hint = (
            "fail",
            "the loss did not fall: the GPU computes wrong results or AMP is broken",
        )
        detail += f"; it had to fall to {fraction:g} of its start"
    out.check(
        "amp-training",
        status,
        detail,
        value={
            "ms_per_step": round(ms, 3),
            "loss_first": first,
            "loss_last": last,
            "steps": len(losses),
        },
        expected={"loss_drop": fraction, "steps": steps},
        seconds=time.perf_counter() - t0,
        hint=hint,
    )
    if status == "fail":
        return
    t1 = time.perf_counter()
    try:
        _, ms32, _, _ = train(torch, device, steps, False, cfg)
    except Exception as exc:
        out.check("amp-speedup", "fail", f"FP32 comparison run raised {exc}")
        return
    speedup = ms32 / ms if ms > 0 else 0.0
    # Tensor cores make fp16 faster from Volta (7.0) on; on the CPU, bf16 speed depends on
    # AVX512-BF16/AMX (reference §5): report it, never judge it there.
    status = "pass"
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 7 and speedup < 1.0:
        status = "warn"
    out.check(
        "amp-speedup",
        status,
        f"AMP {ms:.1f} ms/step vs FP32 {ms32:.1f} ms/step: {speedup:.2f}x",
        value=round(speedup, 3),
        seconds=time.perf_counter() - t1,
    )


def run_burn_in(out: Out, torch, device, cfg: dict) -> None:
    """One long AMP training run; the median step time of its last quarter against its first
    quarter shows thermal or power throttling, inf/NaN losses show instability."""
    seconds = float(cfg["burn_in_s"])
    t0 = time.perf_counter()
    step_ms: list[float] = []
    try:
        losses, _, skipped, _ = train(
            torch, device, 0, True, cfg, deadline=t0 + seconds, step_ms=step_ms
        )
    except Exception as exc:
        out.check(
            "burn-in",
            "fail",
            f"failed after {time.perf_counter() - t0:.0f} s: {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            hint="the GPU is unstable under sustained load: check cooling and power",
        )
        return
    bad = sum(1 for v in losses if not math.isfinite(v))
    q = max(1, len(step_ms) // 4)
    first = _median(step_ms[:q]) if step_ms else 0.0
    last = _median(step_ms[-q:]) if step_ms else 0.0
    slowdown = last / first if first > 0 else 1.0
    status = "fail" if bad or not losses else "warn" if slowdown > 1.3 else "pass"
    out.check(
        "burn-in",
        status,
        f"{time.perf_counter() - t0:.0f} s, {len(losses)} steps, {bad} inf/NaN, "
        f"median ms/step first quarter {first:.1f} -> last quarter {last:.1f}",
        value={
            "steps": len(losses),
            "slowdown": round(slowdown, 3),
            "nonfinite": bad,
            "scaler_skipped": skipped,
        },
        expected={"max_slowdown": 1.3},
        seconds=time.perf_counter() - t0,
        hint="steps slowed down over time: thermal or power throttling"
        if status == "warn"
        else None,
    )


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _ddp_worker(rank: int, world: int, backend: str, init_file: str, result_dir: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
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


def run_ddp(out: Out, torch, device, cfg: dict, work_dir: str) -> None:
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
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="ddp-", dir=work_dir)
    try:
        import torch.multiprocessing as mp

        mp.spawn(
            _ddp_worker,
            args=(world, backend, os.path.join(tmp, "init"), tmp),
            nprocs=world,
            join=True,
        )
        results = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                results.append(json.load(f))
    except Exception as exc:
        out.check(
            "ddp",
            "fail",
            f"{world}-rank {backend} all-reduce/DDP failed: {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            hint="see NCCL_DEBUG=INFO output; peer-to-peer over Thunderbolt is often unsupported",
        )
        return
    ok = all(r["ok"] for r in results)
    out.check(
        "ddp",
        "pass" if ok else "fail",
        f"{world} ranks, {backend}: all-reduce {'correct' if ok else 'WRONG'}, DDP step ran",
        value=world,
        seconds=time.perf_counter() - t0,
    )


# -- CUDA-only steps -------------------------------------------------------------------------------


def cuda_init(out: Out, torch, cfg: dict):
    """torch-cuda-build, torch-driver-cuda, cuda-available; the device count, or None to stop."""
    gpus = cfg.get("nvidia_gpus") or []
    wheel = torch.version.cuda
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
    driver = cfg.get("driver_cuda")
    if not driver:
        try:  # CUDA driver API version, e.g. 12040 (private but long-standing torch API)
            v = int(torch._C._cuda_getDriverVersion())
            driver = f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else None
        except Exception:
            driver = None
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


def device_bus_id(torch, index: int) -> str | None:
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    dom = getattr(props, "pci_domain_id", 0) or 0
    dev = getattr(props, "pci_device_id", 0) or 0
    return f"{dom:04x}:{bus:02x}:{dev:02x}.0"


def pick_device(out: Out, torch, cfg: dict, count: int):
    """Choose the CUDA index to verify and emit device-is-egpu; None when it must stop."""
    buses = [device_bus_id(torch, i) for i in range(count)]
    egpu = cfg.get("egpu") or {}
    want = egpu.get("pci_address")
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
    value = {"index": index, "pci_bus_id": bus, "name": name}
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
        detail = f"cuda:{index} {name} is the eGPU at {want}"
        hint = None
        if order_hint is not None:
            pci_index = order_hint.index(index)
            detail += (
                f"; {count} GPUs: under CUDA_DEVICE_ORDER=PCI_BUS_ID the eGPU is cuda:{pci_index}"
            )
            hint = f"export CUDA_DEVICE_ORDER=PCI_BUS_ID so the eGPU is always cuda:{pci_index}"
        out.check("device-is-egpu", "pass", detail, value=value, expected=want, hint=hint)
    else:
        status = "fail" if requested == "auto" else "warn"
        out.check(
            "device-is-egpu",
            status,
            f"torch sees {', '.join(b or '?' for b in buses)} but not the eGPU at {want}",
            value=value,
            expected=want,
            hint="check CUDA_VISIBLE_DEVICES and that the enclosure is authorized "
            "(`egpu-setup doctor`)",
        )
        if status == "fail":
            return None
    return index


def emit_device(out: Out, torch, device, cfg: dict) -> None:
    rec = {
        "kind": "device",
        "type": device.type,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        rec.update(
            index=device.index,
            name=props.name,
            pci_bus_id=device_bus_id(torch, device.index),
            compute_capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 2),
            multiprocessors=props.multi_processor_count,
            cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            device_count=torch.cuda.device_count(),
        )
    else:
        rec.update(
            name="cpu",
            threads=torch.get_num_threads(),
            cpu_capability=_cpu_capability(torch),
        )
    out.emit(rec)


def _cpu_capability(torch):
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:
        return None


def run_arch(out: Out, torch, device) -> None:
    cc = torch.cuda.get_device_capability(device)
    archs = torch.cuda.get_arch_list()
    status, detail = arch_covers(archs, cc)
    out.check(
        "arch-list",
        status,
        detail,
        value=archs,
        expected=f"sm_{cc[0]}{cc[1]}",
        hint="install a torch build compiled for this GPU (`egpu-setup resolve` picks one)"
        if status == "fail"
        else None,
    )


def run_allocation(out: Out, torch, device, cfg: dict) -> None:
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


def read_link(bus_id: str | None) -> dict:
    """The GPU's PCIe link from sysfs right now (it trains down when idle, so read under load)."""
    if not bus_id:
        return {}
    base = f"/sys/bus/pci/devices/{bus_id}"
    vals = {}
    for key in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
        try:
            with open(os.path.join(base, key)) as f:
                vals[key] = f.read().strip()
        except OSError:
            pass

    def width(text):
        return int(text) if text and text.isdigit() else None

    return {
        "speed_gts": parse_speed(vals.get("current_link_speed")),
        "width": width(vals.get("current_link_width")),
        "max_speed_gts": parse_speed(vals.get("max_link_speed")),
        "max_width": width(vals.get("max_link_width")),
    }


def judge_link(link: dict, connection: str | None, tb_gen: int | None, expect: dict):
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
    if width <= 1:  # an x1 link is the classic degraded eGPU mode (hotplug-security.md §7 row 31)
        status = "warn"
    return status, text + ("; " + "; ".join(notes) if notes else ""), limit


def _bandwidth(torch, device, direction: str, nbytes: int, min_seconds: float) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for _ in range(2):
        (
            dev.copy_(host, non_blocking=True)
            if direction == "h2d"
            else host.copy_(dev, non_blocking=True)
        )
    torch.cuda.synchronize(device)
    n = 0
    t0 = time.perf_counter()
    while True:
        if direction == "h2d":
            dev.copy_(host, non_blocking=True)
        else:
            host.copy_(dev, non_blocking=True)
        n += 1
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            break
    return nbytes * n / elapsed / 1e9


def run_bandwidth(out: Out, torch, device, cfg: dict, bus_id: str | None) -> None:
    egpu = cfg.get("egpu") or {}
    connection = egpu.get("connection") if egpu.get("pci_address") == bus_id else None
    tb_gen = egpu.get("tb_generation")
    expect = cfg["expect"]
    nbytes = (64 if cfg["quick"] else 256) * 2**20
    min_s = 0.3 if cfg["quick"] else 1.0
    results = {}
    link: dict = {}
    t0 = time.perf_counter()
    for direction in ("h2d", "d2h"):
        t1 = time.perf_counter()
        try:
            stop = threading.Event()
            seen: list[dict] = []

            def watch(stop=stop, seen=seen):
                while not stop.is_set():
                    seen.append(read_link(bus_id))
                    stop.wait(0.05)

            th = threading.Thread(target=watch, daemon=True)
            th.start()
            try:
                gbs = _bandwidth(torch, device, direction, nbytes, min_s)
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
                seconds=time.perf_counter() - t1,
            )
            continue
        results[direction] = (gbs, time.perf_counter() - t1)
    if not link:
        link = read_link(bus_id)
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


def run(cfg: dict) -> int:
    out = Out(cfg["results"], cfg.get("progress"))
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
    bus = device_bus_id(torch, device.index) if device.type == "cuda" else None
    sampler = Sampler(bus, 0.5 if cfg["quick"] else 1.0) if device.type == "cuda" else None
    if sampler:
        sampler.__enter__()
    try:
        if "matmul" not in skip:
            out.step("matmul")
            run_matmul(out, torch, device, cfg)
        if "amp" not in skip:
            out.step("amp")
            run_amp(out, torch, device, cfg)
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
