"""The plan summary: the advice a person needs where they look, at the end of the plan and of
the run. The supply the card wants and the power limit it runs at, the NUMA node to bind
training to, how to use the venv, a re-login (known problems of the GPU on its link are warnings:
doctor/known_issues.py).

Pure over facts, profile and plan, plus one read-only nvidia-smi query for the power limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.detect.nvidia import NVIDIA_SMI_TIMEOUT_S
from egpu_setup.host.machine import Host
from egpu_setup.profile.types import Profile


@dataclass(frozen=True)
class Advice:
    label: str  # "Power", "NUMA", "Torch", "Display"
    text: str

    def to_json(self) -> dict[str, str]:
        return {"label": self.label, "text": self.text}


def power_advice(profile: Profile, card: Gpu | None, limit_w: float | None) -> Advice | None:
    """The profile's supply advice, and the power limit the card runs at now (nvidia-smi)."""
    parts = []
    if profile.power.psu_watts:
        parts.append(
            f"profile {profile.name} ({profile.gpu.name}): a supply of "
            f"{profile.power.psu_watts} W or more"
        )
    if profile.power.note:
        parts.append(profile.power.note)
    if limit_w is not None and card is not None:
        parts.append(f"{card.name or 'the card'} runs with a {limit_w:.0f} W power limit now")
    return Advice("Power", "; ".join(parts)) if parts else None


def power_limit(target: Host, facts: HostFacts, card: Gpu | None) -> float | None:
    """The card's enforced power limit from nvidia-smi: a recording's text, or on this machine
    one `--query-gpu` when the driver is loaded (it is never started for this)."""
    if card is None or target.kind == "root":
        return None
    if target.kind == "live" and not facts.nvidia.module_loaded:
        return None
    from egpu_setup.detect.nvidia_smi import parse_nvidia_smi

    argv = ["nvidia-smi", "--query-gpu=pci.bus_id,power.limit", "--format=csv"]
    text = target.command("nvidia-smi", argv, timeout=NVIDIA_SMI_TIMEOUT_S)
    if not text:
        return None
    gpus = parse_nvidia_smi(text).gpus
    for g in gpus:
        if g.pci_bus_id and g.pci_bus_id.lower() == card.pci_address.lower():
            return g.power_limit_w
    return gpus[0].power_limit_w if len(gpus) == 1 else None


def numa_advice(facts: HostFacts, card: Gpu | None, python: str) -> Advice | None:
    """On a machine with several NUMA nodes: the eGPU's node and the numactl line that keeps
    training's CPU threads and memory next to it. A laptop has one node, and every PCI device
    there reports numa_node -1 ("unknown"), so the node count decides, not that value
    (Documentation/ABI/testing/sysfs-bus-pci: numa_node; /sys/devices/system/node/online)."""
    if len(facts.numa_nodes) < 2 or card is None:
        return None
    nodes = len(facts.numa_nodes)
    if card.numa_node is None:
        return Advice(
            "NUMA",
            f"{nodes} NUMA nodes, and the firmware does not say which one the eGPU is on "
            "(numa_node -1): `nvidia-smi topo -m` shows its CPU affinity",
        )
    n = card.numa_node
    return Advice(
        "NUMA",
        f"the eGPU is on NUMA node {n} of {nodes}: keep training's threads and memory there "
        "(torchrun: --numa-binding=node, https://docs.pytorch.org/docs/stable/elastic/numa.html)"
        f"\nnumactl --cpunodebind={n} --membind={n} {python} train.py",
    )


def torch_advice(venv: str) -> Advice:
    return Advice(
        "Torch",
        f"run your code with {venv}/bin/python train.py\nor in a shell: source {venv}/bin/activate",
    )


def display_advice() -> Advice:
    # X reads xorg.conf.d only when it starts, and a changed module option or blacklist needs
    # the module loaded again: a new login at least, a reboot where the plan says so.
    return Advice(
        "Display",
        "display mode: log out and back in (or reboot) so the desktop starts on the eGPU",
    )


def plan_advice(
    facts: HostFacts,
    profile: Profile,
    card: Gpu | None,
    limit_w: float | None,
    *,
    venv: str,
    mode: str,
    only: frozenset[str],
    torch_planned: bool,
) -> tuple[Advice, ...]:
    """Every line of the summary, in the order it is shown."""
    out: list[Advice | None] = [power_advice(profile, card, limit_w)]
    out.append(numa_advice(facts, card, f"{venv}/bin/python"))
    if "torch" in only and torch_planned:
        out.append(torch_advice(venv))
    if mode == "display" and "config" in only:
        out.append(display_advice())
    return tuple(a for a in out if a is not None)


def card_for(facts: HostFacts, resolution: Any) -> Gpu | None:
    """The detected GPU the plan is for: the one whose ids the resolution names."""
    from egpu_setup.render.context import detected_cards

    cards = detected_cards(facts)
    pci_id = getattr(getattr(resolution, "gpu", None), "pci_id", None)
    for g in cards:
        if pci_id and f"{g.vendor_id or '10de'}:{g.device_id}" == pci_id:
            return g
    return cards[0] if cards else None
