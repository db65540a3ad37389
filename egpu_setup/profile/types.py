"""The profile as frozen values: what a loaded, validated, fully resolved profile holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_ID = "egpu-setup/profile/1"


@dataclass(frozen=True)
class GpuSpec:
    device_ids: tuple[
        str, ...
    ]  # 4-hex lowercase, vendor 10de (1002 for AMD); empty = any NVIDIA GPU
    name: str
    architecture: str  # "Ada Lovelace"; "any" for a generic profile
    compute_capability: str | None
    memory_gib: float | None
    vendor: str = "nvidia"  # "nvidia" / "amd"
    gfx: str | None = None  # AMD's gfx target ("gfx1100"); None for NVIDIA

    def matches(self, device_id: str | None) -> bool:
        """True when this spec covers a PCI device id (a generic spec covers every id)."""
        if not self.device_ids:
            return True
        return device_id is not None and device_id.lower() in self.device_ids


@dataclass(frozen=True)
class Expectations:
    fp32_tflops: float | None
    fp16_tflops: float | None
    min_link_gen: int | None
    min_link_width: int | None
    h2d_gbps: dict[str, float]  # keys: thunderbolt, usb4, oculink, pcie
    amp_steps: int
    amp_loss_drop: float  # final loss <= amp_loss_drop * first loss
    max_temp_c: float
    max_power_w: float | None


@dataclass(frozen=True)
class PowerAdvice:
    psu_watts: int | None
    note: str | None


@dataclass(frozen=True)
class DriverConstraints:
    min_branch: int | None
    preferred_branch: int | None
    max_branch: int | None
    flavour: str  # "open" / "proprietary" / "auto"
    pin: str | None = None  # exactly this driver version ("580.95.05"): a lab's fixed choice
    hold: bool = False  # pin the installed driver packages for the term (plan/hold.py)


@dataclass(frozen=True)
class TorchConstraints:
    spec: str | None
    cuda: str | None
    extras: tuple[str, ...]  # "torchvision", "torchaudio"
    pin: str | None = None  # exactly this release and variant ("2.9.1+cu128"): a lab's choice


@dataclass(frozen=True)
class HotplugOptions:
    thunderbolt_policy: str  # "iommu" / "auto" / "manual"
    runtime_pm_off: bool
    persistenced: bool
    enclosure_unique_id: str | None
    accept_no_iommu: bool
    connection: str  # "thunderbolt" / "usb4" / "oculink" / "any"
    enclosure_unique_ids: tuple[str, ...] = ()  # a lab's enclosures (any one of them)
    first_boot_enrol_model: str | None = None  # opt-in, risky: the first device of this model
    # opt-in, risky (hotplug.first_boot_enrol): "first-seen", or the first device of one of these
    # (vendor_id, device_id) models, ids as TbDevice holds them ("0008", "0036")
    first_boot_first_seen: bool = False
    first_boot_enrol_ids: tuple[tuple[str, str], ...] = ()
    # while CUDA holds the eGPU: "block" / "delay" / "off" (install/sleep_guard.py)
    sleep_inhibit: str = "block"

    @property
    def first_boot_enrol(self) -> str | list[str] | None:
        """hotplug.first_boot_enrol as the profile writes it: "first-seen", ["0x8:0x36"], None."""
        if self.first_boot_first_seen:
            return "first-seen"
        ids = [f"0x{int(v, 16):x}:0x{int(d, 16):x}" for v, d in self.first_boot_enrol_ids]
        return ids or None

    @property
    def unpinned_enrol(self) -> bool:
        """The profile lets first boot enrol a device it does not pin (a stated risk)."""
        return bool(
            self.first_boot_enrol_model or self.first_boot_first_seen or self.first_boot_enrol_ids
        )

    @property
    def pinned_enclosures(self) -> tuple[str, ...]:
        """Every enclosure UUID the profile pins, the single one first."""
        one = (self.enclosure_unique_id,) if self.enclosure_unique_id else ()
        return tuple(dict.fromkeys((*one, *self.enclosure_unique_ids)))


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    path: str
    gpu: GpuSpec
    expect: Expectations
    power: PowerAdvice
    driver: DriverConstraints
    torch: TorchConstraints
    mode: str  # "compute" / "display"
    hotplug: HotplugOptions
    extends: str | None = None
    origin: str = "file"  # package / system / user / custom (EGPU_SETUP_PROFILE_PATH) / file
    chain: tuple[str, ...] = field(default=())  # files merged, most general first

    def to_json(self) -> dict[str, Any]:
        """The resolved profile as plain data (the shape of the YAML, every default filled in)."""
        return {
            "schema": SCHEMA_ID,
            "name": self.name,
            "description": self.description,
            "extends": self.extends,
            "mode": self.mode,
            "gpu": {
                "vendor": self.gpu.vendor,
                "name": self.gpu.name,
                "architecture": self.gpu.architecture,
                "compute_capability": self.gpu.compute_capability,
                "device_ids": list(self.gpu.device_ids),
                "memory_gib": self.gpu.memory_gib,
                "gfx": self.gpu.gfx,
            },
            "expect": {
                "fp32_tflops": self.expect.fp32_tflops,
                "fp16_tflops": self.expect.fp16_tflops,
                "min_link_gen": self.expect.min_link_gen,
                "min_link_width": self.expect.min_link_width,
                "h2d_gbps": dict(self.expect.h2d_gbps),
                "amp_steps": self.expect.amp_steps,
                "amp_loss_drop": self.expect.amp_loss_drop,
                "max_temp_c": self.expect.max_temp_c,
                "max_power_w": self.expect.max_power_w,
            },
            "power": {"psu_watts": self.power.psu_watts, "note": self.power.note},
            "driver": {
                "min_branch": self.driver.min_branch,
                "preferred_branch": self.driver.preferred_branch,
                "max_branch": self.driver.max_branch,
                "flavour": self.driver.flavour,
                "pin": self.driver.pin,
                "hold": self.driver.hold,
            },
            "torch": {
                "spec": self.torch.spec,
                "cuda": self.torch.cuda,
                "extras": list(self.torch.extras),
                "pin": self.torch.pin,
            },
            "hotplug": {
                "thunderbolt_policy": self.hotplug.thunderbolt_policy,
                "runtime_pm_off": self.hotplug.runtime_pm_off,
                "persistenced": self.hotplug.persistenced,
                "enclosure_unique_id": self.hotplug.enclosure_unique_id,
                "accept_no_iommu": self.hotplug.accept_no_iommu,
                "connection": self.hotplug.connection,
                "enclosure_unique_ids": list(self.hotplug.enclosure_unique_ids),
                "first_boot_enrol_model": self.hotplug.first_boot_enrol_model,
                "first_boot_enrol": self.hotplug.first_boot_enrol,
                "sleep_inhibit": self.hotplug.sleep_inhibit,
            },
            "origin": self.origin,
            "path": self.path,
            "chain": list(self.chain),
        }
