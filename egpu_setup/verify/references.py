"""Training throughput of verify's smoke model on cards in an internal PCIe slot: the reference a
verify over Thunderbolt/USB4/OCuLink is compared with (`train-throughput`: steps/s as a share).

The workload is the child's own (`_child.train`: AMP, cudnn.benchmark, a batch uploaded per
step from pinned memory with non_blocking=True, TRAIN_SHAPES in session.py), so no published
benchmark measures it: every entry comes from a verify report of that card in a desktop or server
slot, committed under docs/reports/ and named as the `source`. No public PyTorch training
throughput of one card in a Thunderbolt enclosure and in a desktop slot exists to take instead
(tests/data/real/cuda/README.md, "What was not found").

To add one: run `scripts/gpu_verify.sh` on the card in an internal slot, commit the report,
then add `reference_from_report(json.load(open(path)), path)`'s value here, written out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ThroughputReference:
    name: str  # as torch names the card: "NVIDIA H200"
    pci_ids: tuple[str, ...]  # PCI device ids it covers ("2335"), lower case
    slot: str  # "PCIe 5.0 x16 (server)"
    steps_per_s: Mapping[str, float]  # "quick" / "full": the two smoke sizes
    torch: str  # torch version of the run
    source: str  # the committed report

    def for_mode(self, quick: bool) -> dict[str, Any] | None:
        """What the child compares with, for --quick or a full run; None when not measured."""
        rate = self.steps_per_s.get("quick" if quick else "full")
        if not rate:
            return None
        return {"name": self.name, "slot": self.slot, "steps_per_s": rate, "source": self.source}


# None measured yet: a first H200 run (PCIe 5.0 x16 server slot) is the first.
REFERENCES: tuple[ThroughputReference, ...] = ()


def find_reference(
    device_id: str | None, name: str | None, table: Sequence[ThroughputReference] = REFERENCES
) -> ThroughputReference | None:
    """The entry for a card, by PCI device id, else by the exact name torch reports."""
    dev = (device_id or "").lower().removeprefix("0x").split(":")[-1]
    for ref in table:
        if dev and dev in ref.pci_ids:
            return ref
    wanted = (name or "").strip().lower()
    return next((r for r in table if wanted and r.name.lower() == wanted), None)


def reference_from_report(report: Mapping[str, Any], source: str) -> ThroughputReference:
    """The entry a verify report of a card in an internal slot gives (ValueError if it has
    none): its measured `train-throughput` and `pcie-link`, keyed by the run's mode."""
    checks = {c.get("id"): c for c in report.get("checks") or () if isinstance(c, Mapping)}
    rate = (checks.get("train-throughput") or {}).get("value") or {}
    if not isinstance(rate, Mapping) or not rate.get("steps_per_s"):
        raise ValueError(f"{source}: no train-throughput measurement")
    device = report.get("device") or {}
    if device.get("external"):
        raise ValueError(f"{source}: measured on an eGPU, not in an internal slot")
    link = (checks.get("pcie-link") or {}).get("value") or {}
    speed, width = link.get("speed_gts"), link.get("width")
    gens = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
    slot = f"PCIe {gens.get(speed, '?')}.0 x{width}" if speed and width else "an internal slot"
    mode = "quick" if (report.get("options") or {}).get("quick") else "full"
    return ThroughputReference(
        name=str(device.get("name") or ""),
        pci_ids=(str(device["device_id"]).lower(),) if device.get("device_id") else (),
        slot=slot,
        steps_per_s={mode: float(rate["steps_per_s"])},
        torch=str(device.get("torch") or ""),
        source=source,
    )
