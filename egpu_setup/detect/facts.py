"""HostFacts: everything detection learned, as frozen values. Unknown is None, never a guess.

`HostFacts.to_json()` is the `detect --json` contract (docs/design.md): keys may be added, never
renamed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

TYPE_CHECKING = False  # typing costs 2 ms of every start; these names are for mypy only
if TYPE_CHECKING:
    from typing import Any

SCHEMA_HOST = "egpu-setup/host/1"


@dataclass(frozen=True)
class OsFacts:
    """The operating system: /etc/os-release, the kernel, WSL, Secure Boot, the session."""

    id: str | None = None
    version_id: str | None = None
    kernel: str | None = None
    arch: str | None = None
    wsl: bool | None = None
    secure_boot: bool | None = None
    session_type: str | None = None
    id_like: tuple[str, ...] = ()
    codename: str | None = None
    pretty_name: str | None = None


@dataclass(frozen=True)
class PythonFacts:
    """The python3 detect saw: its version and path, and whether it is externally managed."""

    version: str | None = None
    externally_managed: bool | None = None
    executable: str | None = None


@dataclass(frozen=True)
class Link:
    """A PCIe link: what it runs at now and the most it can (sysfs current_/max_link_*)."""

    speed_gts: float | None = None
    width: int | None = None
    max_speed_gts: float | None = None
    max_width: int | None = None


@dataclass(frozen=True)
class Gpu:
    """One display controller on the PCI bus, and how it reaches the CPU."""

    pci_address: str  # full form with domain: "0000:3c:00.0"
    vendor: str | None = None  # "nvidia" / "amd" / "intel" / other name / None
    vendor_id: str | None = None  # "10de"
    device_id: str | None = None  # "2684"
    name: str | None = None
    architecture: str | None = None  # "Ada Lovelace"
    compute_capability: str | None = None  # "8.9"
    driver: str | None = None  # bound kernel driver: "nvidia", "nouveau", "amdgpu", None
    external: bool | None = None
    connection: str = "unknown"  # thunderbolt / usb4 / oculink / pcie / unknown
    link: Link = field(default_factory=Link)
    subsystem_vendor_id: str | None = None
    subsystem_device_id: str | None = None
    class_id: str | None = None  # "030000"
    revision: str | None = None
    removable: str | None = None  # sysfs: removable / fixed / unknown
    boot_vga: bool | None = None
    bridges: tuple[str, ...] = ()  # upstream PCI addresses, root port first
    evidence: tuple[str, ...] = ()  # why `external`/`connection` were decided
    codename: str | None = None  # the chip as pci.ids names it: "AD102", "TU117M"
    # "TB3" / "TB4" / "TB5" / "USB4" when connection is thunderbolt or usb4 and it is known
    connection_generation: str | None = None
    # the NUMA node the device is attached to (sysfs numa_node); None for -1 ("unknown", what
    # every device of a one-node laptop reports) or where it was not read
    numa_node: int | None = None
    # the product as egpu-setup's GPU table names it, beside `name` as the source printed it
    # ("H100 SXM5 80GB" beside nvidia-smi's "NVIDIA H100 80GB HBM3"); None where the table has
    # no entry
    table_name: str | None = None


@dataclass(frozen=True)
class TimedOutTool:
    """A diagnostic tool detection ran that did not answer within its deadline and was ended."""

    name: str  # "nvidia-smi"
    timeout_s: float


@dataclass(frozen=True)
class ListedGpu:
    """A GPU a tool lists without a PCI address to tie it to (an `nvidia-smi --query-gpu` CSV
    without `pci.bus_id`): counted and kept as the tool printed it, never one of `gpus`, whose
    placement and link come from the PCI device."""

    source: str  # "nvidia-smi"
    index: int | None = None
    name: str | None = None  # as printed
    uuid: str | None = None
    memory_total_mib: int | None = None
    compute_capability: str | None = None  # as printed, else from egpu-setup's GPU table
    architecture: str | None = None  # from egpu-setup's GPU table, by name or device id
    pci_bus: str | None = None  # the bus number alone ("0x01"), when that is what was printed
    pci_device_id: str | None = None  # "0x1DF010DE" as printed


@dataclass(frozen=True)
class NvidiaFacts:
    """NVIDIA's kernel module and driver: loaded or not, which flavour, which version."""

    driver_version: str | None = None
    cuda_version: str | None = None
    module_loaded: bool | None = None
    module_flavour: str | None = None  # "open" / "proprietary"
    nouveau_loaded: bool | None = None
    smi_error: str | None = None  # e.g. "couldn't communicate with the NVIDIA driver"


@dataclass(frozen=True)
class TbDomain:
    """A Thunderbolt/USB4 domain (one controller) and its security level."""

    name: str
    security: str | None = None
    iommu_dma_protection: bool | None = None


@dataclass(frozen=True)
class TbDevice:
    """A Thunderbolt/USB4 device the kernel enumerated, authorized or waiting."""

    name: str | None = None
    vendor: str | None = None
    unique_id: str | None = None
    authorized: bool | None = None
    generation: int | None = None
    policy: str | None = None
    sysfs_name: str | None = None  # "0-1"
    domain: str | None = None  # "domain0"
    # per lane, as sysfs says it (bolt's "40 Gb/s = 2 lanes * 20 Gb/s" is the link's total)
    rx_speed_gbps: float | None = None
    rx_lanes: int | None = None
    tx_speed_gbps: float | None = None
    tx_lanes: int | None = None
    # the DROM's ids, as the sysfs `vendor` and `device` attributes print them ("0x8" ->
    # "0008", Documentation/ABI/testing/sysfs-bus-thunderbolt): what a lab's
    # hotplug.first_boot_enrol list names an enclosure model by. Some routers have neither
    # attribute (https://github.com/intel/thunderbolt-utils/issues/3): None, never matched
    vendor_id: str | None = None
    device_id: str | None = None


@dataclass(frozen=True)
class ThunderboltFacts:
    """Every Thunderbolt/USB4 domain and device."""

    domains: tuple[TbDomain, ...] = ()
    devices: tuple[TbDevice, ...] = ()


@dataclass(frozen=True)
class HostFacts:
    """Everything detection learned about one machine (the `detect --json` contract)."""

    os: OsFacts = field(default_factory=OsFacts)
    python: PythonFacts = field(default_factory=PythonFacts)
    gpus: tuple[Gpu, ...] = ()
    nvidia: NvidiaFacts = field(default_factory=NvidiaFacts)
    thunderbolt: ThunderboltFacts = field(default_factory=ThunderboltFacts)
    source: str = "live"  # live / recorded / root
    numa_nodes: tuple[int, ...] = ()  # /sys/devices/system/node/online; () when not known
    listed_gpus: tuple[ListedGpu, ...] = ()  # GPUs a tool names with no PCI address
    timed_out: tuple[TimedOutTool, ...] = ()  # tools that hung while detection ran them

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {"schema": SCHEMA_HOST, **data}

    @property
    def nvidia_gpus(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if g.vendor == "nvidia")

    def fleet_summary(
        self, gpu: Gpu | None, *, hostname: str | None, torch: str | None
    ) -> dict[str, Any]:
        """The `host` block of install and verify reports, as `egpu-setup report` reads it."""
        out: dict[str, Any] = {
            "hostname": hostname,
            "torch": torch,
            "driver": self.nvidia.driver_version,
        }
        if gpu is not None:
            out["gpu"] = {"name": gpu.name, "pci_address": gpu.pci_address}
            out["connection"] = gpu.connection
            out["link"] = asdict(gpu.link)
            box = self.enclosure_of(gpu)
            # the box (and its cable) this GPU sat in: `egpu-setup report` groups machines by it
            out["enclosure"] = (
                None
                if box is None
                else {
                    "unique_id": box.unique_id,
                    "vendor": box.vendor,
                    "name": box.name,
                    "generation": box.generation,
                    "rx_speed_gbps": box.rx_speed_gbps,
                    "rx_lanes": box.rx_lanes,
                }
            )
        return out

    @property
    def tb_peripherals(self) -> tuple[TbDevice, ...]:
        """The Thunderbolt/USB4 routers that are not a host router (route 0: "0-0", "1-0",
        Linux Documentation/ABI/testing/sysfs-bus-thunderbolt)."""
        return tuple(d for d in self.thunderbolt.devices if not (d.sysfs_name or "").endswith("-0"))

    def enclosure_of(self, gpu: Gpu | None) -> TbDevice | None:
        """The Thunderbolt device carrying `gpu`'s PCIe tunnel, when it can be told: the GPU is
        on a Thunderbolt/USB4 link and exactly one peripheral is (or may be) authorized. sysfs
        ties no router to the PCI functions behind it (render/thunderbolt.py says why), so a
        dock beside the enclosure makes two candidates and the answer None, never a guess."""
        if gpu is None or gpu.connection not in ("thunderbolt", "usb4"):
            return None
        candidates = [d for d in self.tb_peripherals if d.authorized is not False]
        return candidates[0] if len(candidates) == 1 else None

    @property
    def egpu(self) -> Gpu | None:
        """The external NVIDIA GPU when exactly one is external; else None."""
        ext = [g for g in self.nvidia_gpus if g.external]
        return ext[0] if len(ext) == 1 else None
