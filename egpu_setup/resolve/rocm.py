"""The resolver's AMD branch: a Radeon (or Instinct) GPU -> a torch ROCm wheel, or why none runs.

Pure. Keys on the GPU's gfx target, the link it sits behind, the distribution, the Python and the
glibc (egpu_setup/data/rocm.yaml). The first answer for most Radeon eGPUs is that the link cannot
run ROCm: RDNA 1-4 compute needs PCIe atomics on every bridge to the root port
(drivers/gpu/drm/amd/amdkfd/kfd_device.c, needs_pci_atomics; drivers/pci/pci.c
pci_enable_atomic_ops_to_root), which a Thunderbolt/USB4 tunnel's bridges do not route; AMD's
answer to a USB4 Radeon eGPU failing with "Pcie atomics not enabled, hostcall not supported" was
the same (https://github.com/ROCm/ROCm/issues/4198). The way out is OCuLink or a CPU-attached slot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from egpu_setup.compat.glibc import distro_glibc, glibc_key
from egpu_setup.compat.matrix import Matrix, TorchVersion
from egpu_setup.compat.rocm import AMD_VENDOR, AmdGpu, RocmData, RocmVariant, load_rocm
from egpu_setup.compat.versions import PythonVersion
from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.errors import MatrixError, UnsupportedHardware, UsageError
from egpu_setup.profile.types import Profile
from egpu_setup.resolve.constraints import Constraints, spec_filter
from egpu_setup.resolve.resolution import DriverPlan, Notes, ResolvedGpu, TorchPlan

TUNNELS = ("thunderbolt", "usb4")
_VARIANT = re.compile(r"rocm\d+\.\d+(?:\.\d+)?")


@dataclass(frozen=True)
class AmdTarget:
    model: AmdGpu
    fact: Gpu | None  # the detected device; None for `--gpu` what-ifs


@dataclass(frozen=True)
class RocmAnswer:
    gpu: ResolvedGpu
    driver: DriverPlan
    torch: TorchPlan


def parse_rocm_variant(text: str) -> str:
    """`--rocm rocm7.2` or `--rocm 7.2` -> "rocm7.2"; UsageError otherwise."""
    raw = text.strip().lower()
    name = raw if raw.startswith("rocm") else f"rocm{raw}"
    if not _VARIANT.fullmatch(name):
        raise UsageError(f"--rocm {text}: not a ROCm variant", "use e.g. --rocm rocm7.2")
    return name


def amd_gpu_asked(text: str) -> AmdGpu | None:
    """The AMD card `--gpu` names (1002:744c, or a name such as 'RX 7900 XTX'), else None;
    UsageError for an AMD id the table does not know."""
    data = load_rocm()
    m = re.fullmatch(r"1002:([0-9a-fA-F]{4})", text.strip())
    if m:
        model = data.gpu(m.group(1))
        if model is None:
            raise UsageError(
                f"--gpu {text.strip()}: AMD device {m.group(1).lower()} is not in egpu-setup's "
                "ROCm table (egpu_setup/data/rocm.yaml)",
                "name a card the table knows (e.g. --gpu 'RX 7900 XTX'), or update egpu-setup",
            )
        return model
    return data.gpu_named(text)


def amd_target(
    facts: HostFacts | None, c: Constraints, profile: Profile | None = None, n: Notes | None = None
) -> AmdTarget | None:
    """The AMD GPU to plan for: `--gpu` naming one, else the external AMD GPU detected (else the
    only AMD discrete GPU with --rocm), else an AMD profile's card when no AMD GPU is detected;
    None when there is none."""
    if c.gpu:
        model = amd_gpu_asked(c.gpu)
        return AmdTarget(model, None) if model is not None else None
    detected = _detected_amd(facts, c) if facts is not None else None
    if profile is not None and (problem := profile_gfx_problem(profile)) is not None:
        raise UsageError(
            f"{profile.path}: {problem}",
            "use the device ids and the gfx target rocminfo prints for the card (Name: gfxNNNN)",
        )
    if detected is not None or profile is None or profile.gpu.vendor != "amd":
        return detected
    # the profile was validated against the ROCm table: its first id is a card the table knows
    model = load_rocm().gpu(profile.gpu.device_ids[0]) if profile.gpu.device_ids else None
    if model is None:
        return None
    if n is not None:
        n.warnings.append(
            f"no AMD GPU detected: planning for the profile's GPU ({profile.gpu.name}, "
            f"1002:{model.device_id}, {model.gfx})"
        )
    return AmdTarget(model, None)


def profile_gfx_problem(profile: Profile) -> str | None:
    """Why an AMD profile's gfx target is not what the ROCm table gives its device ids, or None
    (the profile layer checks the profile's own shape; the table lives here)."""
    if profile.gpu.vendor != "amd":
        return None
    for device_id in profile.gpu.device_ids:
        model = load_rocm().gpu(device_id)
        if model is None:
            return f"gpu.device_ids: 1002:{device_id} is not in egpu_setup/data/rocm.yaml"
        if model.gfx != profile.gpu.gfx:
            return f"gpu.gfx: 1002:{device_id} is {model.gfx}, not {profile.gpu.gfx}"
    return None


def _detected_amd(facts: HostFacts, c: Constraints) -> AmdTarget | None:
    """The external AMD GPU detected (else the only known AMD GPU with --rocm), or None."""
    data = load_rocm()
    amd = [g for g in facts.gpus if (g.vendor_id or "").lower() == AMD_VENDOR and g.device_id]
    known = [(g, data.gpu(g.device_id or "")) for g in amd]
    external = [(g, m) for g, m in known if g.external]
    if not external and c.rocm is None:
        return None  # an AMD iGPU beside no eGPU: not what the plan is for
    pool = external or [(g, m) for g, m in known if m is not None]
    if not pool:
        return None
    g, model = pool[0]
    if model is None:
        raise MatrixError(
            f"the AMD GPU at {g.pci_address} (1002:{g.device_id}, {g.name or 'unnamed'}) is not "
            "in egpu-setup's ROCm table, so its gfx target is unknown",
            "pass --gpu with a card the table knows, or --cuda cpu for the CPU build",
        )
    return AmdTarget(model, g)


def resolve_rocm(
    t: AmdTarget,
    m: Matrix,
    c: Constraints,
    python: str,
    host_release: tuple[str | None, str | None],
    archive: tuple[str | None, str | None],
    n: Notes,
) -> RocmAnswer:
    """The torch ROCm wheel for this AMD GPU, with a reason per choice; UnsupportedHardware when
    the link cannot run ROCm, MatrixError when no wheel fits. `host_release` (id, version)
    decides the glibc, `archive` (a derivative's base) the firmware package."""
    data = load_rocm()
    g = t.model
    where = f" at {t.fact.pci_address}" if t.fact else ""
    n.reasons.append(
        f"AMD GPU{' (external)' if t.fact and t.fact.external else ''}{where}: {g.name} "
        f"[1002:{g.device_id}], {g.gfx} ({g.family.name}): planning ROCm, not CUDA"
    )
    _check_link(t, n)
    if g.official:
        n.reasons.append(f"AMD lists the {g.name} as supported on Linux ({g.source})")
    else:
        n.warnings.append(
            f"AMD does not list the {g.name} ({g.gfx}) as supported on Linux: its libraries may "
            f"still run on it, untested by AMD ({g.source})"
        )
    release, variant, override = _pick(data, m, c, g, python, *host_release, n)
    label = f"{release.version}+{variant.name}"
    why = f"torch {label}: the newest release"
    if c.torch_spec:
        why += f" matching --torch {c.torch_spec}"
    if override is None:
        n.reasons.append(f"{why} whose wheel has kernels for {g.gfx}")
    else:
        o = data.override(g.gfx)
        assert o is not None
        n.reasons.append(f"{why}; it has no {g.gfx} kernels, only {o.as_gfx}")
        n.warnings.append(
            f"{g.gfx} runs this wheel only with HSA_OVERRIDE_GFX_VERSION={o.value} (the runtime "
            f"then treats the GPU as {o.as_gfx}; not supported by AMD, page faults or wrong "
            f"results are possible: {o.source}); set it in the environment that runs torch"
        )
    driver = _driver(data, g, *archive, n)
    requirements = (f"torch=={label}",) + tuple(
        e for e in c.extras if e in ("torchvision", "torchaudio")
    )
    torch = TorchPlan(release.version, variant.name, data.index_url_for(variant.name), requirements)
    n.reasons.append(
        "the ROCm wheels carry ROCm's user-space libraries (or pull them from the same index): "
        "no ROCm install on the host; the user running torch needs the render and video groups "
        "(/dev/kfd is root:render)"
    )
    gpu = ResolvedGpu(g.name, f"1002:{g.device_id}", f"{g.family.name} ({g.gfx})", None)
    return RocmAnswer(gpu, driver, torch)


def _check_link(t: AmdTarget, n: Notes) -> None:
    g, fact = t.model, t.fact
    if not g.family.needs_atomics:
        return
    if fact is None or fact.connection == "unknown":
        n.warnings.append(
            f"{g.family.name} compute needs PCIe atomics on every bridge to the root port; "
            "whether this link has them is not known: behind Thunderbolt/USB4 it has not "
            "(run `egpu-setup doctor` on the machine: amd-pcie-atomics-missing)"
        )
        return
    if fact.connection in TUNNELS:
        via = fact.connection_generation or fact.connection
        evidence = "; ".join(fact.evidence[:2])
        raise UnsupportedHardware(
            f"this link cannot run ROCm: the {g.name} ({g.gfx}, {g.family.name}) at "
            f"{fact.pci_address} is behind a {via} tunnel, and {g.family.name} compute needs "
            "PCIe atomics on every bridge to the root port, which Thunderbolt/USB4 bridges do "
            f"not route, so the kernel's KFD skips the GPU ({g.family.source})"
            + (f"; link: {evidence}" if evidence else ""),
            "connect the card by OCuLink or in a CPU-attached PCIe slot, or pass --cuda cpu "
            "for the CPU build",
        )
    n.reasons.append(
        f"{g.family.name} needs PCIe atomics on its path; the {fact.connection} link is not a "
        "Thunderbolt/USB4 tunnel (verify checks the GPU runs)"
    )


def _pick(
    data: RocmData,
    m: Matrix,
    c: Constraints,
    g: AmdGpu,
    python: str,
    distro_id: str | None,
    distro_ver: str | None,
    n: Notes,
) -> tuple[TorchVersion, RocmVariant, str | None]:
    """(release, variant, the gfx it stands in for or None): native kernels first, then newest
    release, then newest ROCm."""
    matches_spec, spec_variant, _ = spec_filter(c.torch_spec)
    want = c.rocm or (spec_variant if spec_variant and spec_variant.startswith("rocm") else None)
    o = data.override(g.gfx)
    rows = [
        (t, v)
        for t in m.torch
        if (s := data.series(t.series)) is not None and matches_spec(t.version)
        for v in s.variants
        if want is None or v.name == want
    ]
    if not rows:
        what = f"--rocm {want}" if want else f"--torch {c.torch_spec}" if c.torch_spec else ""
        known = sorted({v.name for s in data.wheels for v in s.variants})
        raise MatrixError(
            f"no torch ROCm wheel matches {what or 'the request'}",
            f"ROCm variants egpu-setup knows: {', '.join(known)}",
        )
    cpu = {t.version: t.pythons(t.variant("cpu") or t.variants[0]) for t, _ in rows}
    with_py = [(t, v) for t, v in rows if python in cpu[t.version]]
    if not with_py:
        pys = sorted({p for t, _ in rows for p in cpu[t.version]}, key=PythonVersion.from_str)
        raise MatrixError(
            f"no torch ROCm wheel exists for Python {python}",
            f"the ROCm wheels cover Python {pys[0]} to {pys[-1]}; pass e.g. --python {pys[-1]}",
        )
    glibc = c.glibc or (found[0] if (found := distro_glibc(distro_id, distro_ver)) else None)
    have = glibc_key(glibc) if glibc else None
    loadable = [
        (t, v)
        for t, v in with_py
        if have is None or v.glibc is None or (k := glibc_key(v.glibc)) is None or k <= have
    ]
    if not loadable:
        raise MatrixError(
            f"no torch ROCm wheel for Python {python} loads on glibc {glibc}",
            "use a distribution with glibc >= 2.28, or run torch in a container that has one",
        )
    native = [(t, v) for t, v in loadable if g.gfx in v.gfx]
    stand_in = [(t, v) for t, v in loadable if o is not None and o.as_gfx in v.gfx]
    pool, how = (native, None) if native else (stand_in, g.gfx)
    if not pool:
        raise MatrixError(
            f"no torch ROCm wheel has kernels for {g.gfx} ({g.name}), and no "
            "HSA_OVERRIDE_GFX_VERSION stand-in is known for it",
            "pass --cuda cpu for the CPU build"
            + ("" if not c.torch_spec and not want else ", or drop --torch/--rocm"),
        )
    newest_native = max(
        (t for t, v in with_py if g.gfx in v.gfx), key=lambda t: t.key, default=None
    )
    best = max(
        pool,
        key=lambda tv: (tv[0].key, tuple(int(x) for x in tv[1].name[4:].split("."))),
    )
    if best[1].glibc is None and have is not None and have < (2, 28):
        n.warnings.append(
            f"which glibc torch {best[0].version}+{best[1].name}'s wheels need is not known; "
            f"glibc {glibc} loads only those built for 2.17 (pass --torch 2.5 for a known one)"
        )
    if newest_native is not None and not native:
        n.reasons.append(
            f"glibc {glibc}: torch {newest_native.version}'s ROCm wheels with {g.gfx} kernels "
            "do not load here"
        )
    return best[0], best[1], how


def _driver(
    data: RocmData, g: AmdGpu, distro_id: str | None, distro_ver: str | None, n: Notes
) -> DriverPlan:
    n.reasons.append(
        "driver: amdgpu is in the Linux kernel (its KFD part runs compute), so no driver branch "
        "is installed; only its firmware is needed"
    )
    fw = data.firmware_for(distro_id)
    if fw is None:
        n.warnings.append(
            f"the package with amdgpu's firmware is not known for {distro_id or 'this system'}: "
            f"install the one that carries /lib/firmware/amdgpu ({g.gfx})"
        )
        return DriverPlan(None, "in-kernel", None, None, None, (), "kernel")
    n.reasons.append(f"firmware: {fw.package} carries /lib/firmware/amdgpu ({fw.source})")
    gap = data.firmware_gap(distro_id, distro_ver, g.gfx)
    if gap is not None:
        n.warnings.append(
            f"{distro_id}-{distro_ver}'s {fw.package} has no firmware for {g.gfx}: install it "
            f"from {gap.fix} ({gap.source})"
        )
    components = (fw.component,) if fw.component else ()
    return DriverPlan(None, "in-kernel", None, None, None, (fw.package,), "kernel", components)
