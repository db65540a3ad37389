"""Benchmark: `egpu-setup doctor --from DIR` on a 5 MB kernel log (target: under 300 ms).

Generates a realistic dmesg (a laptop up for days: USB, Wi-Fi, audit, AER noise, Thunderbolt
hot-plug cycles, NVRM loading lines) with a handful of eGPU failure signatures buried in it,
writes it into a temporary bundle, and times the real command line end to end (interpreter
start included) as the median of several runs. Also prints the in-process scan time.

    python benchmarks/doctor_dmesg.py [--size-mb 5] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOISE = (
    "usb 3-2: new high-speed USB device number {n} using xhci_hcd",
    "usb 3-2: New USB device found, idVendor=0bda, idProduct=8153, bcdDevice=30.00",
    "usb 3-2: USB disconnect, device number {n}",
    "iwlwifi 0000:00:14.3: Unhandled alg: 0x{n:x}",
    "wlp0s20f3: authenticate with 3c:84:6a:{n:02x}:11:22",
    "wlp0s20f3: associated",
    'audit: type=1400 audit({t:.3f}:{n}): apparmor="DENIED" operation="open" '
    'profile="snap.firefox.firefox" name="/proc/{n}/cgroup" pid={n} comm="firefox" '
    'requested_mask="r" denied_mask="r" fsuid=1000 ouid=0',
    "pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0",
    "pcieport 0000:00:1c.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
    "pcieport 0000:00:1c.0:   device [8086:a33c] error status/mask=00000001/00002000",
    "EXT4-fs (nvme0n1p2): re-mounted. Opts: errors=remount-ro. Quota mode: none.",
    "thunderbolt 0-1: new device found, vendor=0x127 device=0x{n:x}",
    "thunderbolt 0-1: Razer Core X",
    "pcieport 0000:00:07.0: pciehp: Slot(3): Card present",
    "pcieport 0000:00:07.0: pciehp: Slot(3): Link Up",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.163.01  Tue Apr  8 12:46:03 UTC 2025",
    "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.163.01",
    "[drm] Initialized nvidia-drm 0.0.0 20160202 for 0000:3c:00.0 on minor 1",
    "Bluetooth: hci0: Firmware timestamp 2024.{n} buildtype 1 build {n}",
    "input: Logitech MX Master 3 as "
    "/devices/virtual/misc/uhid/0005:046D:B023.{n:04X}/input/input{n}",
    "e1000e 0000:00:1f.6 enp0s31f6: NIC Link is Down",
    "perf: interrupt took too long ({n} > 2500), lowering kernel.perf_event_max_sample_rate to "
    "50000",
)

SIGNATURES = (
    "pci 0000:3c:00.0: [10de:2684] type 00 class 0x030000 PCIe Legacy Endpoint",
    "pci 0000:3b:01.0: PCI bridge to [bus 3c-3d]",
    "pci 0000:3c:00.0: BAR 1 [mem size 0x10000000 64bit pref]: can't assign; no space",
    "pci 0000:3c:00.0: BAR 1 [mem size 0x10000000 64bit pref]: failed to assign",
    "pci 0000:3c:00.0: 8.000 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe x4 link at "
    "0000:3a:00.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)",
    "NVRM: Xid (PCI:0000:3c:00): 79, pid=4211, name=python3, GPU has fallen off the bus.",
)


def make_dmesg(size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    lines = []
    total = 0
    t = 0.0
    sig_every = 4000
    i = 0
    while total < size:
        t += rng.random() * 0.8
        if i and i % sig_every == 0:
            msg = SIGNATURES[(i // sig_every) % len(SIGNATURES)]
        else:
            n = rng.randrange(1, 60000)
            msg = rng.choice(NOISE).format(n=n, t=1732000000 + t)
        line = f"[{t:12.6f}] {msg}\n"
        lines.append(line)
        total += len(line)
        i += 1
    return "".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()

    text = make_dmesg(int(args.size_mb * 1024 * 1024))
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp)
        (bundle / "commands").mkdir()
        (bundle / "root").mkdir()
        (bundle / "commands" / "dmesg.txt").write_text(text)
        (bundle / "meta.json").write_text(json.dumps({"tool": "benchmark"}))

        from egpu_setup.doctor.dmesg import scan_dmesg

        scans = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            scan_dmesg(text)
            scans.append(time.perf_counter() - t0)

        argv = [sys.executable, "-m", "egpu_setup", "doctor", "--json", "--from", str(bundle)]
        walls = []
        ids: list[str] = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            walls.append(time.perf_counter() - t0)
            if proc.returncode not in (0, 1):
                print(proc.stderr, file=sys.stderr)
                return 2
            ids = [f["id"] for f in json.loads(proc.stdout)["findings"]]

    size_mb = len(text) / (1024 * 1024)
    median = statistics.median(walls) * 1000
    print(f"dmesg: {size_mb:.2f} MB, {text.count(chr(10))} lines")
    print(
        f"scan_dmesg (in process): median {statistics.median(scans) * 1000:.1f} ms over "
        f"{args.runs} runs"
    )
    print(f"doctor --from (whole command): median {median:.0f} ms, min {min(walls) * 1000:.0f} ms")
    print(f"findings: {', '.join(ids)}")
    print("PASS" if median < 300 else "SLOW", "(target: 300 ms)")
    return 0 if median < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
