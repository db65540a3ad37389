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


def power_advice(
    profile: Profile, card: Gpu | None, limit_w: float | None, card_profile: Profile | None = None
) -> Advice | None:
    """The supply the detected card wants and the power limit it runs at now (nvidia-smi).

    The figure follows the card that was seen: when the profile is for another card (a
    `--profile rtx4090` run on an RTX 5090), its supply and note are that other card's, so the
    line takes them from `card_profile`, the profile that names the detected card's device id,
    and says there is no figure when none does."""
    parts = []
    source: Profile | None = profile
    if card is not None and profile.gpu.device_ids and not profile.gpu.matches(card.device_id):
        source = card_profile
        seen = f"{card.name or 'the detected GPU'} [10de:{card.device_id}]"
        if source is None or not source.power.psu_watts:
            parts.append(
                f"no supply figure for the detected {seen}: profile {profile.name}'s "
                f"{profile.power.psu_watts or 'figure'}"
                f"{' W' if profile.power.psu_watts else ''} is for a {profile.gpu.name}"
            )
    if source is not None and source.power.psu_watts:
        parts.append(
            f"profile {source.name} ({source.gpu.name}): a supply of "
            f"{source.power.psu_watts} W or more"
        )
    if source is not None and source.power.note:
        parts.append(source.power.note)
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


def pci_order_index(facts: HostFacts, card: Gpu | None) -> int | None:
    """The eGPU's `cuda:N` under CUDA_DEVICE_ORDER=PCI_BUS_ID when the machine has more than
    one NVIDIA GPU (a laptop's own and the eGPU), else None: one card is cuda:0 in any order.
    That order sorts by PCI domain, bus, device, function, which is how the full sysfs address
    sorts as text (CUDA Programming Guide, "CUDA Environment Variables": CUDA_DEVICE_ORDER,
    https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html)."""
    cards = sorted(g.pci_address.lower() for g in facts.nvidia_gpus)
    if card is None or len(cards) < 2 or card.pci_address.lower() not in cards:
        return None
    if sum(1 for g in facts.nvidia_gpus if g.external) > 1:
        return None  # several eGPUs are used together: hiding all but one is not the advice
    return cards.index(card.pci_address.lower())


def device_advice(facts: HostFacts, card: Gpu | None) -> Advice | None:
    """Which `cuda:N` is the eGPU when there are several NVIDIA GPUs. CUDA's default order is
    FASTEST_FIRST, so a bare `cuda:0` is whichever card CUDA ranks fastest, which can be the
    laptop's own; the PCI bus order is fixed by where the cards sit."""
    index = pci_order_index(facts, card)
    if index is None or card is None:
        return None
    others = ", ".join(
        f"{g.name or 'NVIDIA GPU'} at {g.pci_address}"
        for g in facts.nvidia_gpus
        if g.pci_address != card.pci_address
    )
    return Advice(
        "Devices",
        f"{len(facts.nvidia_gpus)} NVIDIA GPUs: the eGPU {card.name or 'NVIDIA GPU'} at "
        f"{card.pci_address} is cuda:{index} under CUDA_DEVICE_ORDER=PCI_BUS_ID (also {others}). "
        "CUDA's default order is fastest first, so a bare cuda:0 may be the other card"
        f"\n{cuda_env(index)} makes the eGPU the only one, cuda:0",
    )


def cuda_env(index: int | None) -> str:
    """The environment that makes the eGPU the only visible CUDA device ('' with one GPU)."""
    if index is None:
        return ""
    return f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={index}"


def torch_advice(venv: str, env: str = "") -> Advice:
    run = f"{env} {venv}/bin/python" if env else f"{venv}/bin/python"
    shell = f"source {venv}/bin/activate" + (f"; export {env}" if env else "")
    return Advice("Torch", f"run your code with {run} train.py\nor in a shell: {shell}")


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
    card_profile: Profile | None = None,
    venv: str,
    mode: str,
    only: frozenset[str],
    torch_planned: bool,
) -> tuple[Advice, ...]:
    """Every line of the summary, in the order it is shown."""
    out: list[Advice | None] = [power_advice(profile, card, limit_w, card_profile)]
    out.append(numa_advice(facts, card, f"{venv}/bin/python"))
    out.append(device_advice(facts, card))
    if "torch" in only and torch_planned:
        out.append(torch_advice(venv, cuda_env(pci_order_index(facts, card))))
    if mode == "display" and "config" in only:
        out.append(display_advice())
    return tuple(a for a in out if a is not None)


def profile_for_card(card: Gpu | None) -> Profile | None:
    """The profile in the search path made for this card: the one that names its device id
    (a generic profile names none, and one that does not load is passed over)."""
    if card is None or not card.device_id:
        return None
    from egpu_setup.profile.load import iter_profiles

    for _, loaded in iter_profiles():
        if not isinstance(loaded, Profile) or not loaded.gpu.device_ids:
            continue  # a profile that does not load, or a generic one
        if loaded.gpu.matches(card.device_id):
            return loaded
    return None


def card_for(facts: HostFacts, resolution: Any) -> Gpu | None:
    """The detected GPU the plan is for: the one whose ids the resolution names."""
    from egpu_setup.render.context import detected_cards

    cards = detected_cards(facts)
    pci_id = getattr(getattr(resolution, "gpu", None), "pci_id", None)
    for g in cards:
        if pci_id and f"{g.vendor_id or '10de'}:{g.device_id}" == pci_id:
            return g
    return cards[0] if cards else None
