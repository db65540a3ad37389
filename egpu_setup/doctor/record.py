"""`egpu-setup record DIR`: a redacted bundle of what detection and doctor read.

The bundle is the `--from` format (docs/design.md): DIR/meta.json, DIR/root/... (a partial
filesystem, sysfs kept as directories and relative symlinks so bridge chains survive) and
DIR/commands/<name>.txt. Reads go through the Host; writes go only into DIR. With a venv,
DIR/commands/torch.json holds its torch build (what `doctor --from DIR` checks; the same probe as
`doctor --venv`, egpu_setup/doctor/torchcheck.py).

Redaction: Thunderbolt unique_ids, GPU UUIDs and serial numbers are replaced by stable
stand-ins (the same id maps to the same stand-in in sysfs and in boltctl text, so detection's
cross-references still work); MAC addresses in the kernel log are masked. `--no-redact` keeps all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from egpu_setup import __version__
from egpu_setup.detect.dpkg_status import HOLD_PIN, HOLD_UNATTENDED
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host
from egpu_setup.state.output import OutputTree

PCI_ATTRS = (
    "class",
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "revision",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "removable",
    "boot_vga",
    "power/control",
    "power/runtime_status",
    "enable",
    "numa_node",  # detect/numa.py: the node the GPU is attached to
)
TB_ATTRS = (
    "security",
    "iommu_dma_protection",
    "authorized",
    "device_name",
    "vendor_name",
    "device",
    "vendor",
    "unique_id",
    "generation",
    "rx_speed",
    "rx_lanes",
    "tx_speed",
    "tx_lanes",
    "boot",
    "deauthorization",
)  # never `key`: it is the enclosure's secret
FILES = (
    "/etc/os-release",
    "/sys/devices/system/node/online",  # the NUMA nodes (detect/numa.py)
    "/proc/cmdline",
    "/proc/modules",
    "/proc/version",
    "/proc/sys/kernel/osrelease",
    "/proc/driver/nvidia/version",
    "/sys/module/nvidia/version",
    "/sys/module/nvidia/initstate",
    "/sys/module/nouveau/initstate",
    "/sys/module/nvidia_drm/parameters/modeset",
    "/sys/class/dmi/id/chassis_type",
    "/sys/class/dmi/id/sys_vendor",
    "/sys/class/dmi/id/product_name",
)
# doctor's driver-hold checks (doctor/hold.py): dpkg's database and the hold's two drop-ins, so
# `doctor --from` says driver-held and driver-library-mismatch as on the machine
DPKG_STATUS = "/var/lib/dpkg/status"
HOLD_FILES = (HOLD_PIN, HOLD_UNATTENDED)
# a Debian 12 desktop's status file is about 3 MiB for 2,500 packages; a longer one is cut at the
# last whole stanza before this, and meta.json says so
DPKG_STATUS_LIMIT = 16 * 1024 * 1024
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
COMMANDS = {
    "lspci": ["lspci", "-Dnnk"],
    "lspci-vv": ["lspci", "-Dvvnn"],
    "nvidia-smi": ["nvidia-smi", "-q"],
    "boltctl": ["boltctl", "list", "--all"],
    "dmesg": ["dmesg"],
    "mokutil": ["mokutil", "--sb-state"],
    # AMD's tools where installed, with the argv detect/rocm.py's probes run, so a recording
    # replays what they read (rocm-smi: the older tool amd-smi replaced)
    "rocminfo": ["rocminfo"],
    "amd-smi": ["amd-smi", "static"],
    "rocm-smi": ["rocm-smi"],
    # their live readings (temperatures, the PCIe link as trained, VRAM in use), which doctor
    # judges (doctor/amd.py)
    "amd-smi-metric": ["amd-smi", "metric"],
    "rocm-smi-metrics": ["rocm-smi", "--showmetrics"],
}
# root-only inputs: the kernel log (dmesg_restrict, Documentation/admin-guide/sysctl/kernel.rst)
# stays readable by the bundle's owner alone
PRIVATE_COMMANDS = frozenset({"dmesg"})
ENV_KEYS = ("XDG_SESSION_TYPE", "XDG_CURRENT_DESKTOP", "WAYLAND_DISPLAY", "DISPLAY", "SUDO_USER")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_MAC = re.compile(r"\b(?:[0-9a-f]{2}:){5}[0-9a-f]{2}\b", re.IGNORECASE)
_SERIAL = re.compile(r"^(\s*Serial Number\s*:\s*)(\S.*)$", re.MULTILINE)


class Redactor:
    """Maps each identifier to a stable stand-in; `None` mode keeps text as is."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.seen: set[str] = set()

    def uuid(self, m: re.Match[str]) -> str:
        digest = hashlib.sha256(m.group(0).lower().encode()).hexdigest()
        self.seen.add("uuid")
        # Keep the UUID shape (version-4 variant bits) so strict UUID validators still pass.
        return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"

    def __call__(self, text: str) -> str:
        if not self.enabled:
            return text
        out = _UUID.sub(self.uuid, text)
        if _MAC.search(out):
            self.seen.add("mac")
            out = _MAC.sub("xx:xx:xx:xx:xx:xx", out)
        if _SERIAL.search(out):
            self.seen.add("serial")
            out = _SERIAL.sub(r"\1[redacted]", out)
        return out


def record(
    host: Host,
    out: Path,
    *,
    redact: bool = True,
    clock: Callable[[], float] = time.time,
    venv: Path | None = None,
) -> Path:
    """Write the bundle into `out` (which must be empty or absent); return it.

    `venv`: also store that venv's torch build as commands/torch.json."""
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise UsageError(
            f"{out} exists and is not empty" if not out.is_symlink() else f"{out} is a link",
            "give a new directory for the bundle",
        )
    # the one writer, from here on: DIR's parent is the anchor, no link below it is followed,
    # and a DIR a user owns gets files that user owns (state/output.py)
    tree = OutputTree.open(out, what="record")
    out = tree.path
    torch_info = None
    if venv is not None:
        from egpu_setup.doctor.torchcheck import probe_venv_torch

        # Before anything is written: a venv without torch leaves no half bundle behind.
        torch_info = probe_venv_torch(host, venv)
    red = Redactor(redact)
    root = tree.mkdir(out / "root")
    writer = _Writer(host, tree, root, red)
    for path in (*FILES, *HOLD_FILES):
        writer.copy(path)
    status_cut = writer.copy_stanzas(DPKG_STATUS, DPKG_STATUS_LIMIT)
    writer.copy_bytes(SECURE_BOOT_VAR)
    # Directories whose mere presence is a fact: sysfs mounted (so an absent module is not
    # loaded), EFI firmware (else legacy BIOS, so no Secure Boot).
    for directory in ("/sys/module", "/sys/firmware", "/sys/firmware/efi"):
        if host.is_dir(directory):
            writer.mark(directory)
    writer.copy_tree_links("/sys/bus/pci/devices", PCI_ATTRS, driver=True)
    writer.copy_tree_links("/sys/bus/thunderbolt/devices", TB_ATTRS, driver=False)
    for slot in host.listdir("/sys/bus/pci/slots"):
        writer.copy(f"/sys/bus/pci/slots/{slot}/address")
    writer.python()
    tree.mkdir(out / "commands")
    for name, argv in COMMANDS.items():
        text = host.command(name, argv, timeout=30.0)
        if text:
            mode = 0o600 if name in PRIVATE_COMMANDS else 0o644
            tree.write(out / "commands" / f"{name}.txt", red(text).encode(), mode)
    if torch_info is not None:
        data = json.dumps(torch_info.to_json(), indent=2) + "\n"
        tree.write(out / "commands" / "torch.json", data.encode())
    release, machine = host.uname()
    meta = {
        "tool": "egpu-setup",
        "version": __version__,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock())),
        "uname": {"release": release, "machine": machine},
        "env": {k: v for k in ENV_KEYS if (v := host.getenv(k))},
        "redacted": sorted(red.seen) if redact else [],
        "truncated": [DPKG_STATUS] if status_cut else [],
    }
    tree.write(out / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
    return out


class _Writer:
    def __init__(self, host: Host, tree: OutputTree, root: Path, red: Redactor):
        self.host, self.tree, self.root, self.red = host, tree, root, red

    def _dest(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def _text(self, path: str, text: str) -> None:
        self.tree.write(self._dest(path), text.encode())

    def copy(self, path: str) -> None:
        real = self.host.resolve(path) or path
        text = self.host.read(real, 1024 * 1024)
        if text is not None:
            self._text(real, self.red(text))
            if real != path and not (self.root / path.lstrip("/")).exists():
                link = self._dest(path)
                self.tree.link(link, os.path.relpath(self.root / real.lstrip("/"), link.parent))

    def copy_stanzas(self, path: str, limit: int) -> bool:
        """A deb822 file (dpkg's status) up to `limit` bytes, cut after its last whole stanza
        when longer; True when it was cut."""
        data = self.host.read_bytes(path, limit + 1)
        if data is None or b"\0" in data:
            return False
        cut = len(data) > limit
        if cut:
            data = data[: data.rfind(b"\n\n", 0, limit) + 1]
        self.tree.write(self._dest(path), self.red(data.decode("utf-8", "replace")).encode())
        return cut

    def mark(self, directory: str) -> None:
        self._text(f"{directory}/.recorded", "")

    def copy_bytes(self, path: str) -> None:
        data = self.host.read_bytes(path, 4096)
        if data is not None:
            self.tree.write(self._dest(path), data)

    def copy_tree_links(self, bus_dir: str, attrs: tuple[str, ...], *, driver: bool) -> None:
        """Each entry of a /sys/bus/*/devices directory: the link as the kernel made it, the
        device directory it points to (and so every parent bridge), and the listed attributes."""
        for name in self.host.listdir(bus_dir):
            link_target = self.host.readlink(f"{bus_dir}/{name}")
            canonical = self.host.resolve(f"{bus_dir}/{name}")
            if not link_target or not canonical:
                continue
            link = self._dest(f"{bus_dir}/{name}")
            if not link.is_symlink():
                self.tree.link(link, link_target)
            for attr in attrs:
                self.copy(f"{canonical}/{attr}")
            self._text(f"{canonical}/.recorded", "")
            if driver:
                target = self.host.readlink(f"{canonical}/driver")
                if target:
                    drv = self._dest(f"{canonical}/driver")
                    if not drv.is_symlink():
                        self.tree.link(drv, target)
                    drv_dir = Path(os.path.normpath(drv.parent / target))
                    self.tree.write(drv_dir / ".recorded", b"")

    def python(self) -> None:
        target = self.host.readlink("/usr/bin/python3")
        real = self.host.resolve("/usr/bin/python3")
        if not target or not real:
            return
        self.tree.link(self._dest("/usr/bin/python3"), target)
        self._text(real, "")  # a placeholder: the bundle never carries binaries
        m = re.search(r"python(3\.\d+)$", real)
        if m:
            marker = f"/usr/lib/python{m.group(1)}/EXTERNALLY-MANAGED"
            self.copy(marker)
