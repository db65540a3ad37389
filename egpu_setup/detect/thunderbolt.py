"""Thunderbolt/USB4 domains and devices from /sys/bus/thunderbolt, boltctl text as fallback.

sysfs ABI: the kernel's Documentation/ABI/testing/sysfs-bus-thunderbolt.
The stored bolt policy exists only in boltd's database, so it comes from `boltctl list`.
"""

from __future__ import annotations

import re

from egpu_setup.detect.facts import TbDevice, TbDomain, ThunderboltFacts
from egpu_setup.detect.sysfs import parse_bool01, parse_gbps, parse_hex_id, parse_int
from egpu_setup.host.machine import Host

TYPE_CHECKING = False  # typing costs 2 ms of every start; these names are for mypy only
if TYPE_CHECKING:  # parsed only when boltctl answered (1.6 ms of every detect otherwise)
    from egpu_setup.detect.boltctl import BoltDevice

TB_DEVICES = "/sys/bus/thunderbolt/devices"
_DOMAIN = re.compile(r"^domain\d+\Z")
# Routers are "<domain>-<route>"; route 0 is the host router. Other entries (retimers
# "0-0:1.1", XDomain services "0-1.1", usb4_portN) are not devices a user authorizes.
_ROUTER = re.compile(r"^(\d+)-([0-9a-f]+)\Z")


def probe_thunderbolt(host: Host) -> ThunderboltFacts:
    names = host.listdir(TB_DEVICES)
    bolt = _boltctl(host)
    policy_by_uuid = {d.uuid: d.policy for d in bolt if d.uuid}
    domains = []
    devices = []
    for name in names:
        base = f"{TB_DEVICES}/{name}"
        if _DOMAIN.match(name):
            domains.append(
                TbDomain(
                    name=name,
                    security=host.read_attr(f"{base}/security"),
                    iommu_dma_protection=parse_bool01(
                        host.read_attr(f"{base}/iommu_dma_protection")
                    ),
                )
            )
            continue
        m = _ROUTER.match(name)
        if not m or m.group(2) == "0":
            continue
        uid = host.read_attr(f"{base}/unique_id")
        devices.append(
            TbDevice(
                name=host.read_attr(f"{base}/device_name"),
                vendor=host.read_attr(f"{base}/vendor_name"),
                unique_id=uid,
                authorized=parse_bool01(host.read_attr(f"{base}/authorized")),
                generation=parse_int(host.read_attr(f"{base}/generation")),
                policy=policy_by_uuid.get(uid) if uid else None,
                sysfs_name=name,
                domain=f"domain{m.group(1)}",
                rx_speed_gbps=parse_gbps(host.read_attr(f"{base}/rx_speed")),
                rx_lanes=parse_int(host.read_attr(f"{base}/rx_lanes")),
                tx_speed_gbps=parse_gbps(host.read_attr(f"{base}/tx_speed")),
                tx_lanes=parse_int(host.read_attr(f"{base}/tx_lanes")),
                vendor_id=parse_hex_id(host.read_attr(f"{base}/vendor")),
                device_id=parse_hex_id(host.read_attr(f"{base}/device")),
            )
        )
    if not domains and not devices and bolt:
        # No sysfs (a pasted report): boltctl is all we have. Host routers are not devices.
        devices = [
            TbDevice(
                name=d.name,
                vendor=d.vendor,
                unique_id=d.uuid,
                authorized=d.authorized,
                generation=d.generation,
                policy=d.policy,
                domain=d.domain,
                rx_speed_gbps=_per_lane(d.rx_speed_gbps, d.rx_lanes),
                rx_lanes=d.rx_lanes,
                tx_speed_gbps=_per_lane(d.tx_speed_gbps, d.tx_lanes),
                tx_lanes=d.tx_lanes,
            )
            for d in bolt
            if (d.type or "peripheral") != "host"
        ]
    return ThunderboltFacts(domains=tuple(domains), devices=tuple(devices))


def _boltctl(host: Host) -> tuple[BoltDevice, ...]:
    text = host.command("boltctl", ["boltctl", "list", "--all"])
    if not text:
        return ()
    from egpu_setup.detect.boltctl import parse_boltctl_list

    return parse_boltctl_list(text)


def _per_lane(total: float | None, lanes: int | None) -> float | None:
    """bolt prints a link's total ("40 Gb/s = 2 lanes * 20 Gb/s"); sysfs, and TbDevice, the
    speed of one lane. Without the lane count the lane's speed is not known."""
    return total / lanes if total is not None and lanes else None
