"""nvidia-smi for tests: answers verify's sampler query (`--query-gpu=... -i BUS`) with recorded
real values, one sample per call, the way the real tool prints them with csv,noheader,nounits.

Started through a wrapper that tests/helpers/cuda_recordings.py writes as `nvidia-smi` on PATH;
the spec (EGPU_SETUP_TEST_SMI, JSON) holds the GPUs' bus ids, the driver branch, the samples and
what to answer instead (a recorded error text). Standard library only: it runs in any Python.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# NVML clocks event reason bits (NVML API reference, "NvmlClocksEventReasons")
REASON_BITS = {
    "Idle": 0x1,
    "Applications Clocks Setting": 0x2,
    "SW Power Cap": 0x4,
    "HW Slowdown": 0x8,
    "Sync Boost": 0x10,
    "SW Thermal Slowdown": 0x20,
    "HW Thermal Slowdown": 0x40,
    "HW Power Brake Slowdown": 0x80,
    "Display Clock Setting": 0x100,
}


def bus_key(text: str) -> str:
    dom, bus, rest = text.lower().rsplit(":", 2)
    return f"{int(dom, 16):04x}:{bus}:{rest}"


def value(field: str, sample: dict[str, Any]) -> str:
    if field == "temperature.gpu":
        v = sample.get("temperature_c")
    elif field == "power.draw":
        v = sample.get("power_w")
    else:
        active = sample.get("reasons_active")
        if active is None:
            return "[N/A]"
        return f"0x{sum(REASON_BITS[name] for name in active):016x}"
    return "[N/A]" if v is None else f"{v:g}" if isinstance(v, int) else f"{v:.2f}"


def main(argv: list[str]) -> int:
    with open(os.environ["EGPU_SETUP_TEST_SMI"], encoding="utf-8") as f:
        spec = json.load(f)
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), "")
    bus = argv[argv.index("-i") + 1] if "-i" in argv else None
    if spec.get("error"):
        print(spec["error"])
        return 6
    if bus is not None and bus_key(bus) not in {bus_key(b) for b in spec["buses"]}:
        print(spec["no_devices"])
        return 6
    fields = query.split(",")
    if spec.get("driver_branch", 999) < 535 and "clocks_event_reasons.active" in fields:
        print(spec["invalid_field"].format(field="clocks_event_reasons.active"))
        return 2
    samples = spec.get("samples") or []
    if not samples:
        print("cuda stand-in: no recorded sample of this GPU", file=sys.stderr)
        return 0
    counter = os.environ["EGPU_SETUP_TEST_SMI"] + ".calls"
    try:
        with open(counter) as f:
            n = int(f.read() or 0)
    except OSError:
        n = 0
    with open(counter, "w") as f:
        f.write(str(n + 1))
    sample = samples[n % len(samples)]
    print(", ".join(value(field, sample) for field in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
