"""Loading a profile: find it, read it, resolve `extends:`, check what crosses fields, build it.

Loading is strict because a profile feeds templates that end up in udev rules, modprobe options and
shell helpers, where a stray quote or newline would become code. Every failure is a UsageError
(exit 2) reading `file:line:column: key.path: problem` with a hint.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError
from egpu_setup.profile.document import read_document
from egpu_setup.profile.extends import merge, resolve_extends
from egpu_setup.profile.problems import KeyPath, Marks, Problem
from egpu_setup.profile.schema import defaults, load_schema
from egpu_setup.profile.search import ProfileEntry, available, locate
from egpu_setup.profile.types import (
    DriverConstraints,
    Expectations,
    GpuSpec,
    HotplugOptions,
    PowerAdvice,
    Profile,
    TorchConstraints,
)

# Architectures whose GPUs the open kernel modules cannot drive (NVIDIA README, "Open Linux
# Kernel Modules": Turing and newer; Maxwell/Pascal/Volta need the proprietary flavour).
_PRE_TURING = {"Maxwell", "Pascal", "Volta"}


def cross_checks(data: dict[str, Any], marks: Marks) -> None:
    driver = data.get("driver", {})
    low, pref, high = (
        driver.get("min_branch"),
        driver.get("preferred_branch"),
        driver.get("max_branch"),
    )
    pairs = [("preferred_branch", low, pref), ("max_branch", low, high), ("max_branch", pref, high)]
    for key, a, b in pairs:
        if a is not None and b is not None and a > b:
            raise Problem(
                marks.value(("driver", key)),
                ("driver", key),
                f"{b} is below {a}",
                "driver branches must satisfy min_branch <= preferred_branch <= max_branch",
            ).error()
    pin_checks(data, marks)
    vendor_checks(data, marks)
    arch = data.get("gpu", {}).get("architecture")
    if driver.get("flavour") == "open" and arch in _PRE_TURING:
        raise Problem(
            marks.value(("driver", "flavour")),
            ("driver", "flavour"),
            f"open kernel modules do not support {arch} GPUs",
            "use flavour: proprietary (NVIDIA: open modules need Turing or newer)",
        ).error()


_AMD_FAMILIES = {"RDNA 2", "RDNA 3", "RDNA 3.5", "RDNA 4", "CDNA"}


def _refuse(marks: Marks, path: KeyPath, message: str, hint: str) -> UsageError:
    return Problem(marks.value(path), path, message, hint).error()


def vendor_checks(data: dict[str, Any], marks: Marks) -> None:
    """What gpu.vendor implies: an AMD card has a gfx target (that the ROCm table gives its ids
    is checked where the table is read, resolve/rocm.py profile_gfx_problem), an AMD family, no
    compute capability, no NVIDIA driver keys and no CUDA variant (amdgpu is in the kernel; torch
    comes from the ROCm index); an NVIDIA card has none of the AMD keys."""
    gpu = data.get("gpu", {})
    vendor = gpu.get("vendor", "nvidia")
    arch = gpu.get("architecture")
    if vendor == "nvidia":
        if gpu.get("gfx") is not None:
            raise _refuse(
                marks,
                ("gpu", "gfx"),
                "a gfx target is AMD's",
                "drop gpu.gfx, or set gpu.vendor: amd",
            )
        if arch in _AMD_FAMILIES:
            raise _refuse(
                marks, ("gpu", "architecture"), f"{arch} is an AMD family", "set gpu.vendor: amd"
            )
        return
    if arch is not None and arch not in _AMD_FAMILIES | {"any"}:
        raise _refuse(
            marks,
            ("gpu", "architecture"),
            f"{arch} is not an AMD family",
            f"use one of {', '.join(sorted(_AMD_FAMILIES))}",
        )
    if gpu.get("compute_capability") is not None:
        raise _refuse(
            marks,
            ("gpu", "compute_capability"),
            "an AMD GPU has no CUDA compute capability",
            "drop gpu.compute_capability (gpu.gfx names the target)",
        )
    gfx = gpu.get("gfx")
    if gfx is None:
        raise _refuse(
            marks, ("gpu", "gfx"), "an AMD profile needs its gfx target", "add e.g. gfx: gfx1100"
        )
    driver = data.get("driver", {})
    for key in ("min_branch", "preferred_branch", "max_branch", "pin"):
        if driver.get(key) is not None:
            raise _refuse(
                marks,
                ("driver", key),
                "amdgpu is part of the kernel: there is no driver branch to choose",
                f"drop driver.{key} from an AMD profile",
            )
    if driver.get("flavour", "auto") != "auto":
        raise _refuse(
            marks,
            ("driver", "flavour"),
            "open/proprietary are NVIDIA's kernel module flavours",
            "drop driver.flavour from an AMD profile",
        )
    if data.get("hotplug", {}).get("persistenced"):
        raise _refuse(
            marks,
            ("hotplug", "persistenced"),
            "nvidia-persistenced is NVIDIA's daemon",
            "set hotplug.persistenced: false in an AMD profile",
        )
    torch = data.get("torch", {})
    for key in ("cuda", "pin"):
        value = torch.get(key)
        if value is not None and not str(value).endswith("cpu"):
            raise _refuse(
                marks,
                ("torch", key),
                f"{value} is a CUDA build; an AMD GPU runs torch's ROCm wheels",
                f"drop torch.{key} (the resolver picks the ROCm wheel for {gfx}), or use cpu",
            )


def pin_checks(data: dict[str, Any], marks: Marks) -> None:
    """A pin is exact: torch.pin fixes the release and the variant, so a spec or a variant beside
    it could only disagree; driver.pin must lie inside the profile's own branch range."""
    torch = data.get("torch", {})
    if torch.get("pin") is not None:
        for key in ("spec", "cuda"):
            if torch.get(key) is not None:
                raise Problem(
                    marks.value(("torch", key)),
                    ("torch", key),
                    f"torch.pin {torch['pin']} already fixes the release and variant",
                    f"drop torch.{key} (or drop torch.pin)",
                ).error()
    driver = data.get("driver", {})
    pin = driver.get("pin")
    if pin is None:
        return
    branch = int(str(pin).split(".")[0])
    for key, outside in (("min_branch", operator.lt), ("max_branch", operator.gt)):
        limit = driver.get(key)
        if limit is not None and outside(branch, limit):
            raise Problem(
                marks.value(("driver", "pin")),
                ("driver", "pin"),
                f"driver {pin} is outside {key} {limit}",
                "pin a driver inside the profile's branch range, or widen the range",
            ).error()


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (search path) or by path, fully resolved; UsageError on bad input."""
    path, origin = locate(name_or_path)
    return load_file(path, origin)


def load_file(path: Path, origin: str = "file") -> Profile:
    """A profile from one file (its `extends:` found by name)."""
    doc = read_document(path, origin)
    data, marks, chain = resolve_extends(doc, ())
    cross_checks(data, marks)
    schema = load_schema()
    full = merge(defaults(schema, schema), data)
    return to_profile(full, str(path), origin, chain)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def to_profile(d: dict[str, Any], path: str, origin: str, chain: tuple[str, ...]) -> Profile:
    g, e, p, dr, t, h = (d[k] for k in ("gpu", "expect", "power", "driver", "torch", "hotplug"))
    uid = h["enclosure_unique_id"]
    return Profile(
        name=d["name"],
        description=d["description"],
        path=path,
        gpu=GpuSpec(
            device_ids=tuple(g["device_ids"]),
            name=g["name"],
            architecture=g["architecture"],
            compute_capability=g["compute_capability"],
            memory_gib=_float(g["memory_gib"]),
            vendor=g["vendor"],
            gfx=g["gfx"],
        ),
        expect=Expectations(
            fp32_tflops=_float(e["fp32_tflops"]),
            fp16_tflops=_float(e["fp16_tflops"]),
            min_link_gen=_int(e["min_link_gen"]),
            min_link_width=_int(e["min_link_width"]),
            h2d_gbps={k: float(v) for k, v in e["h2d_gbps"].items()},
            amp_steps=int(e["amp_steps"]),
            amp_loss_drop=float(e["amp_loss_drop"]),
            max_temp_c=float(e["max_temp_c"]),
            max_power_w=_float(e["max_power_w"]),
        ),
        power=PowerAdvice(psu_watts=_int(p["psu_watts"]), note=p["note"]),
        driver=DriverConstraints(
            min_branch=_int(dr["min_branch"]),
            preferred_branch=_int(dr["preferred_branch"]),
            max_branch=_int(dr["max_branch"]),
            flavour=dr["flavour"],
            pin=dr["pin"],
            hold=bool(dr["hold"]),
        ),
        torch=TorchConstraints(
            spec=t["spec"], cuda=t["cuda"], extras=tuple(t["extras"]), pin=t["pin"]
        ),
        mode=d["mode"],
        hotplug=HotplugOptions(
            thunderbolt_policy=h["thunderbolt_policy"],
            runtime_pm_off=bool(h["runtime_pm_off"]),
            persistenced=bool(h["persistenced"]),
            enclosure_unique_id=uid.lower() if uid else None,
            accept_no_iommu=bool(h["accept_no_iommu"]),
            connection=h["connection"],
            enclosure_unique_ids=tuple(u.lower() for u in h["enclosure_unique_ids"]),
            first_boot_enrol_model=h["first_boot_enrol_model"],
            first_boot_first_seen=h["first_boot_enrol"] == "first-seen",
            first_boot_enrol_ids=enrol_ids(h["first_boot_enrol"]),
            sleep_inhibit=h["sleep_inhibit"],
        ),
        extends=d.get("extends"),
        origin=origin,
        chain=chain,
    )


def iter_profiles() -> Iterator[tuple[ProfileEntry, Profile | UsageError]]:
    """Every profile in the search path, loaded, or the error that stopped it."""
    for _, entry in sorted(available().items()):
        try:
            yield entry, load_file(entry.path, entry.origin)
        except UsageError as exc:
            yield entry, exc


def enrol_ids(value: str | list[str] | None) -> tuple[tuple[str, str], ...]:
    """hotplug.first_boot_enrol's list (checked by the schema: "0x8:0x36") as the (vendor_id,
    device_id) pairs TbDevice holds ("0008", "0036"); () for "first-seen" or null."""
    if not isinstance(value, list):
        return ()
    pairs = (item.split(":") for item in value)
    return tuple((f"{int(v, 16):04x}", f"{int(d, 16):04x}") for v, d in pairs)
