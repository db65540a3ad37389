"""Which GPU the plan is for: the eGPU, the one NVIDIA GPU, `--gpu`, or the profile's GPU."""

from __future__ import annotations

import re
from dataclasses import dataclass

from egpu_setup.compat.matrix import (
    Architecture,
    Matrix,
)
from egpu_setup.compat.versions import (
    ComputeCapability,
)
from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.errors import UsageError
from egpu_setup.profile.types import Profile
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolution import Notes, ResolvedGpu

NVIDIA_VENDOR = "10de"


@dataclass(frozen=True)
class Target:
    gpu: ResolvedGpu
    cc: ComputeCapability | None
    arch: Architecture | None


def identify_gpu(text: str, matrix: Matrix, notes: Notes) -> Target:
    """`--gpu 10de:2b85`, `--gpu 2b85` or `--gpu "RTX 5090"` -> the target GPU."""
    from egpu_setup.compat import gpus  # the GPU table (parsers helper); loaded only when needed

    raw = text.strip()
    m = re.fullmatch(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{4})", raw)
    if m:
        vendor = (m.group(1) or NVIDIA_VENDOR).lower()
        device = m.group(2).lower()
        if vendor != NVIDIA_VENDOR:
            raise UsageError(
                f"--gpu {raw}: vendor {vendor} is not NVIDIA",
                "egpu-setup plans CUDA for NVIDIA GPUs (vendor id 10de); see `lspci -nn`",
            )
        model = gpus.gpu_by_id(device)
        if model is not None:
            return make_target(
                matrix, model.name, f"10de:{device}", model.architecture, model.compute_capability
            )
        arch = gpus.arch_from_device_id(device)
        if arch is not None:
            notes.warnings.append(
                f"10de:{device} is not in the GPU table; {arch[0]} (compute capability {arch[1]}) "
                "inferred from its device-id range"
            )
            return make_target(
                matrix, f"NVIDIA device {device}", f"10de:{device}", arch[0], arch[1]
            )
        if m.group(1) is not None:
            raise UsageError(
                f"--gpu {raw}: unknown NVIDIA device id",
                "pass the card's name instead, e.g. --gpu 'RTX 4090', or update egpu-setup",
            )
    model = gpus.gpu_by_name(raw)
    if model is None:
        # a short name as a person types it ("4090", "RTX4090", "3060 ti")
        short = gpus.gpus_by_short_name(raw)
        if len(short) > 1:
            raise UsageError(
                f"--gpu {raw!r} could mean {', '.join(m.name for m in short)}",
                f"pass one of them, e.g. --gpu {short[0].name!r}, or the PCI id from `lspci -nn`",
            )
        model = short[0] if short else None
    if model is not None:
        return make_target(
            matrix,
            model.name,
            f"10de:{model.device_id}",
            model.architecture,
            model.compute_capability,
        )
    arch = gpus.arch_from_text(raw)
    if arch is not None:
        return make_target(matrix, raw, None, arch[0], arch[1])
    raise UsageError(
        f"--gpu {raw!r}: unknown GPU",
        "use the PCI id from `lspci -nn` (e.g. --gpu 10de:2684) or a model name such as 'RTX 4090'",
    )


def make_target(
    matrix: Matrix, name: str, pci_id: str | None, arch_name: str | None, cc: str | None
) -> Target:
    capability = ComputeCapability.from_str(cc) if cc else None
    arch = matrix.architecture(capability) if capability else None
    if arch is None and arch_name:
        arch = matrix.architecture_named(arch_name)
    return Target(
        ResolvedGpu(name, pci_id, arch_name or (arch.name if arch else None), cc), capability, arch
    )


def target_from_fact(gpu: Gpu, matrix: Matrix) -> Target:
    cc = gpu.compute_capability
    arch_name = gpu.architecture
    name = gpu.name or f"NVIDIA device {gpu.device_id}"
    if cc is None and gpu.device_id:
        from egpu_setup.compat import gpus

        model = gpus.gpu_by_id(gpu.device_id)
        found = (model.architecture, model.compute_capability) if model else None
        found = found or gpus.arch_from_device_id(gpu.device_id)
        if found is None and gpu.name:
            found = gpus.arch_from_text(gpu.name)
        if found:
            arch_name, cc = found
    pci_id = f"{gpu.vendor_id or NVIDIA_VENDOR}:{gpu.device_id}" if gpu.device_id else None
    return make_target(matrix, name, pci_id, arch_name, cc)


def target_from_profile(profile: Profile, matrix: Matrix) -> Target | None:
    spec = profile.gpu
    cc = spec.compute_capability
    arch_name: str | None = spec.architecture
    ids = spec.device_ids
    name = spec.name or "profile GPU"
    if cc is None and (arch_name or "any") == "any" and not ids:
        return None  # a generic profile names no GPU
    if cc is None:
        from egpu_setup.compat import gpus

        found = gpus.arch_from_text(arch_name or name)
        if found:
            arch_name, cc = found
    return make_target(matrix, name, f"10de:{ids[0]}" if ids else None, arch_name, cc)


def pick_target(
    facts: HostFacts | None, profile: Profile | None, c: Constraints, m: Matrix, n: Notes
) -> tuple[Target | None, list[Target]]:
    nvidia = list(facts.nvidia_gpus) if facts is not None else []
    if c.gpu:
        target = identify_gpu(c.gpu, m, n)
        others = [
            target_from_fact(g, m) for g in nvidia if f"10de:{g.device_id}" != target.gpu.pci_id
        ]
        return target, others
    if nvidia:
        chosen = _choose(facts, profile, nvidia, m, n)
        others = [target_from_fact(g, m) for g in nvidia if g is not chosen]
        target = target_from_fact(chosen, m)
        if chosen.external:
            n.reasons.append(f"planning for the external GPU at {chosen.pci_address}")
        elif chosen.external is False and profile is not None:
            n.warnings.append(
                f"no external NVIDIA GPU detected: planning for the internal "
                f"{target.gpu.name} at {chosen.pci_address}"
            )
        return target, others
    if profile is not None:
        from_profile = target_from_profile(profile, m)
        if from_profile is not None:
            n.reasons.append(
                f"no NVIDIA GPU detected: planning for the profile's GPU, {from_profile.gpu.name}"
            )
            n.warnings.append(
                f"no external NVIDIA GPU detected: planning for the profile's GPU "
                f"({from_profile.gpu.name})"
            )
        return from_profile, []
    return None, []


def _choose(
    facts: HostFacts | None, profile: Profile | None, nvidia: list[Gpu], m: Matrix, n: Notes
) -> Gpu:
    """The NVIDIA GPU to plan for: the eGPU; else among the external ones (all of them when
    several are), the profile's card, else the only one, else the newest; one warning that says
    which when there was a choice."""
    egpu = facts.egpu if facts is not None else None
    if egpu is not None:
        return egpu
    external = [g for g in nvidia if g.external]
    pool = external or nvidia
    ids = set(profile.gpu.device_ids) if profile is not None else set()
    chosen = next((g for g in pool if g.device_id in ids), None)
    if chosen is None and len(pool) == 1:
        return pool[0]
    if chosen is None:
        targets = [target_from_fact(g, m) for g in pool]
        best = max(range(len(pool)), key=lambda i: targets[i].cc or ComputeCapability(0, 0))
        chosen = pool[best]
    name = target_from_fact(chosen, m).gpu.name
    if len(external) > 1:
        same = len({g.device_id for g in external}) == 1
        n.warnings.append(
            f"{len(external)} external NVIDIA GPUs "
            f"({', '.join(g.pci_address for g in external)}): planning for {name}"
            + (
                ", the same model in each, so one driver and one torch serve all of them"
                if same
                else f" at {chosen.pci_address} (pass --gpu to choose)"
            )
        )
    elif not external and len(pool) > 1 and chosen.device_id not in ids:
        n.warnings.append(
            f"{len(nvidia)} NVIDIA GPUs and none known to be external: planning for "
            f"{name} at {chosen.pci_address} (pass --gpu to choose)"
        )
    return chosen
