"""`egpu-setup doctor --from` on kernel logs of growing size: memory stays flat.

Generates a realistic dmesg (a laptop up for days: USB, Wi-Fi, audit, AER noise, Thunderbolt
hot-plug cycles, NVRM loading lines) with a handful of eGPU failure signatures buried in it,
writes it into a temporary bundle, and runs the real command line on it (the installed one),
measuring the peak resident memory and the wall time of each whole process, sizes interleaved.

Goal: at most 50 MiB peak at any size, and memory flat: a 100 MB log costs no more than a 10 MB
one (doctor streams the log a block of about 1 MiB at a time, so a log smaller than a block, the
1 MB one, costs a few MiB less: shown, not a goal; over 64 MiB it reads the newest part and says
so on stderr).

    python benchmarks/doctor_dmesg.py [--sizes-mb 1,10,100] [--rounds 3] [--smoke]
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

import _bench as b

PEAK_GOAL_MIB = 50.0

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


def write_dmesg(path: Path, size: int, seed: int = 1) -> int:
    """Write about `size` bytes of log to `path` (a line at a time: no copy in memory); lines."""
    rng = random.Random(seed)
    total = 0
    t = 0.0
    sig_every = 4000
    i = 0
    with path.open("w") as f:
        while total < size:
            t += rng.random() * 0.8
            if i and i % sig_every == 0:
                msg = SIGNATURES[(i // sig_every) % len(SIGNATURES)]
            else:
                n = rng.randrange(1, 60000)
                msg = rng.choice(NOISE).format(n=n, t=1732000000 + t)
            line = f"[{t:12.6f}] {msg}\n"
            f.write(line)
            total += len(line)
            i += 1
    return i


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--sizes-mb", default="1,10,100", help="log sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sizes = [1.0, 2.0, 3.0] if args.smoke else [float(x) for x in args.sizes_mb.split(",")]
    rounds = 1 if args.smoke else args.rounds
    b.banner("doctor --from on big kernel logs: peak memory and time")
    tool = b.tool()
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        bundles = {}
        for mb in sizes:
            bundle = Path(tmp) / f"{mb:g}mb"
            (bundle / "commands").mkdir(parents=True)
            (bundle / "meta.json").write_text(json.dumps({"tool": "benchmark"}))
            lines = write_dmesg(bundle / "commands" / "dmesg.txt", int(mb * 1024 * 1024))
            bundles[mb] = (bundle, lines)
        runs: dict[float, list[tuple[float, float]]] = {mb: [] for mb in sizes}
        for _ in range(rounds):
            for mb in sizes:  # interleaved: every size sees the same load
                argv = [*tool, "doctor", "--json", "--from", str(bundles[mb][0])]
                seconds, mib, rc = b.peak_rss(argv)
                if rc not in (0, 1):
                    sys.exit(f"{' '.join(argv)}: exit {rc}")
                runs[mb].append((seconds, mib))
        _, check = b.run([*tool, "doctor", "--json", "--from", str(bundles[sizes[-1]][0])])
        ids = [f["id"] for f in json.loads(check.stdout)["findings"]]
        note = check.stderr.strip().splitlines()[-1] if check.stderr.strip() else ""
    print(f"\n{'kernel log':<22} {'lines':>10} {'median s':>9} {'peak MiB':>9}  ({rounds} rounds)")
    peaks = {}
    for mb in sizes:
        peaks[mb] = max(m for _, m in runs[mb])
        seconds = b.median([s for s, _ in runs[mb]])
        print(f"{mb:>8g} MB{'':<11} {bundles[mb][1]:>10} {seconds:>9.2f} {peaks[mb]:>9.1f}")
    print(f"findings in the biggest: {', '.join(ids)}")
    if note:
        print(f"doctor said: {note}")
    # the first size reads whole when it is under one block: flatness is judged from the next
    small, big = sizes[0], sizes[-1]
    ref = sizes[1] if len(sizes) > 2 else small
    goals = [
        b.Goal(
            "doctor --from: peak memory at every size",
            f"{max(peaks.values()):.1f} MiB",
            f"<= {PEAK_GOAL_MIB:g} MiB",
            max(peaks.values()) <= PEAK_GOAL_MIB,
        ),
        b.Goal(
            f"flat: a {big:g} MB log vs a {ref:g} MB one",
            f"{peaks[big] / peaks[ref]:.2f}x",
            "<= 1.05x",
            peaks[big] <= peaks[ref] * 1.05,
            f"{peaks[big]:.1f} vs {peaks[ref]:.1f} MiB; vs the {small:g} MB log "
            f"{peaks[big] / peaks[small]:.2f}x ({peaks[small]:.1f} MiB)",
        ),
    ]
    return b.report(goals, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
