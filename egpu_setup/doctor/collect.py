"""The one part of doctor that touches the host: every source read through its methods.

Soft: a missing or unreadable source is None or empty, and shown as such with the findings.
"""

from __future__ import annotations

import itertools
from typing import Any

from egpu_setup.detect import nvidia
from egpu_setup.detect.dpkg_status import HOLD_PIN
from egpu_setup.detect.facts import HostFacts
from egpu_setup.detect.kernels import probe_kernels
from egpu_setup.detect.rocm import ROCM_TOOL_TIMEOUT_S
from egpu_setup.doctor.dmesg import DmesgScan, scan_lines
from egpu_setup.doctor.findings import DoctorInput
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.doctor")

UDEV_DIRS = ("/etc/udev/rules.d", "/run/udev/rules.d", "/usr/lib/udev/rules.d", "/lib/udev/rules.d")


XORG_FILES = ("/etc/X11/xorg.conf",)


XORG_DIRS = ("/etc/X11/xorg.conf.d", "/usr/share/X11/xorg.conf.d")


def _rule_files(host: Host, directory: str, suffix: str) -> list[tuple[str, str]]:
    out = []
    for path in host.glob(directory, f"*{suffix}"):
        text = host.read(path, limit=1024 * 1024)
        if text is not None:
            out.append((path, text))
    return out


def probe_manager_files(host: Host) -> dict[str, str | None]:
    """The marker files of other GPU managers that exist, with their text (None: a directory)."""
    from egpu_setup.doctor.managers import marker_paths

    managers: dict[str, str | None] = {}
    for path in marker_paths():
        if not host.exists(path):
            continue
        managers[path] = None if host.is_dir(path) else host.read(path, limit=65536)
    return managers


def scan_kernel_log(host: Host) -> DmesgScan | None:
    """The kernel log's signatures, scanned as it is read: memory stays flat for any length. Over
    the read limit only its newest part is scanned, and a note on stderr says so. None when
    there is no log to read (not installed, not recorded, or not readable without root)."""
    lines = host.command_lines("dmesg", ["dmesg"])
    if lines is None or lines.size == 0:
        return None
    it = iter(lines)
    head: list[str] = []
    chars = 0
    for line in it:  # the first 300 characters: where dmesg says it was refused
        head.append(line)
        chars += len(line)
        if chars >= 300:
            break
    if "read kernel buffer failed" in "".join(head)[:300]:
        # kernel.dmesg_restrict=1 (Debian/Ubuntu default): only root reads the kernel log.
        log.warning("cannot read the kernel log without root: run `sudo egpu-setup doctor`")
        return None
    if lines.skipped:
        log.warning(
            "the kernel log is %s: doctor read its newest %s; the oldest %s (the start of the "
            "log) were not read",
            _size(lines.size),
            _size(lines.size - lines.skipped),
            _size(lines.skipped),
        )
    return scan_lines(itertools.chain(head, it))


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def collect(host: Host, facts: HostFacts) -> DoctorInput:
    """Read every source doctor uses through the Host (soft: missing is None or empty)."""
    udev = [f for d in UDEV_DIRS for f in _rule_files(host, d, ".rules")]
    xorg = [(p, t) for p in XORG_FILES if (t := host.read(p)) is not None]
    xorg += [f for d in XORG_DIRS for f in _rule_files(host, d, ".conf")]
    managers = probe_manager_files(host)
    # Runtime PM of the eGPU and every bridge above it (the whole path must stay powered).
    power: dict[str, str] = {}
    nv_power: dict[str, str] = {}
    for gpu in facts.nvidia_gpus:
        if gpu.external is False:
            continue
        for address in (*gpu.bridges, gpu.pci_address):
            value = host.read_attr(f"/sys/bus/pci/devices/{address}/power/control")
            if value:
                power[address] = value
        text = host.read(f"/proc/driver/nvidia/gpus/{gpu.pci_address}/power", limit=4096)
        if text:
            nv_power[gpu.pci_address] = text
    report, report_path = latest_verify_report(host)
    return DoctorInput(
        dmesg_scan=scan_kernel_log(host),
        lspci=host.command("lspci", ["lspci", "-vvnn"]),
        nvidia_smi=host.command("nvidia-smi", ["nvidia-smi"], timeout=nvidia.NVIDIA_SMI_TIMEOUT_S),
        boltctl=host.command("boltctl", ["boltctl", "list", "--all"]),
        mokutil=host.command("mokutil", ["mokutil", "--sb-state"]),
        cmdline=host.read_attr("/proc/cmdline"),
        udev_rules=tuple(udev),
        xorg=tuple(xorg),
        managers=managers,
        power_control=power,
        nvidia_power=nv_power,
        verify_report=report,
        verify_report_path=report_path,
        kernels=probe_kernels(host),
        dpkg_status=host.read("/var/lib/dpkg/status"),
        driver_pin=host.read(HOLD_PIN, limit=1024 * 1024),
        hold_recorded=hold_recorded(host),
        rocminfo=host.command("rocminfo", ["rocminfo"], timeout=ROCM_TOOL_TIMEOUT_S),
        amd_smi=_outputs(host, "amd-smi", "amd-smi-metric"),
        rocm_smi=_outputs(host, "rocm-smi", "rocm-smi-metrics"),
        timed_out=tuple(host.timed_out),  # detection's and the commands' above
    )


def _outputs(host: Host, *slugs: str) -> tuple[str, ...]:
    """What an AMD SMI prints in the views record.COMMANDS names for it (its static one first);
    () when the first does not answer (the tool is not installed)."""
    from egpu_setup.doctor.record import COMMANDS

    out: list[str] = []
    for slug in slugs:
        text = host.command(slug, COMMANDS[slug], timeout=ROCM_TOOL_TIMEOUT_S)
        if not text and not out:
            return ()
        if text:
            out.append(text)
    return tuple(out)


def hold_recorded(host: Host) -> bool:
    """Does egpu-setup's manifest name the driver hold's pin (it held the driver)? False when
    it names none, or cannot be read (root's 0600 file, doctor run as a user)."""
    import json

    from egpu_setup.state.paths import STATE_DIR

    text = host.read(f"{STATE_DIR}/manifest.json")
    try:
        files = json.loads(text).get("files") if text else None
    except ValueError:
        return False
    return isinstance(files, dict) and HOLD_PIN in files


def latest_verify_report(host: Host) -> tuple[dict[str, Any] | None, str | None]:
    """The newest `egpu-setup verify` report the machine kept (<state>/reports/verify-*.json:
    root's, and this user's own on the running system; a recording's under its root), read
    through the host. (None, None) when there is none or it is not a verify report."""
    from pathlib import Path

    from egpu_setup.state.paths import STATE_DIR, StatePaths
    from egpu_setup.state.reports import report_time, saved_reports

    dirs = [f"{STATE_DIR}/reports"]
    if host.kind == "live":
        dirs.insert(0, str(StatePaths.for_root(Path("/")).state_dir / "reports"))
    # In each state directory the newest by the sequence it saved them in, never by the clock
    # (state/reports.py); root's and the user's directories count apart, so between their two
    # newest the later time wins.
    newest = [found[-1] for d in dirs if (found := saved_reports(host, [d]))]
    if not newest:
        return None, None
    return max(newest, key=lambda item: report_time(item[0], item[1].rsplit("/", 1)[1]))


def older_report_note(host: Host, path: str) -> str | None:
    """A note when the verify report at `path` is older than the newest one saved beside it (in
    the sequence its machine saved them, state/reports.py): doctor then judges an old verify."""
    import os

    from egpu_setup.state.reports import saved_reports, sequence_of

    folder, name = os.path.split(os.path.abspath(path))
    found = saved_reports(host, [folder])
    mine = [data for data, p in found if p.rsplit("/", 1)[1] == name]
    if not mine or not found or sequence_of(mine[0]) is None:
        return None
    newest, newest_path = found[-1]
    if (sequence_of(newest) or 0) <= (sequence_of(mine[0]) or 0):
        return None
    return (
        f"{path} (sequence {sequence_of(mine[0])}) is older than its machine's newest verify "
        f"report, {newest_path} (sequence {sequence_of(newest)})"
    )
