"""Boot an image directory under QEMU, headless, through UEFI with Secure Boot enforcing, and
run one job inside the booted machine.

The disk is what a laptop has: GPT, an EFI system partition and the root partition. The ESP is
a FAT image made with mkfs.vfat and filled with mtools (no loop mount): EFI/BOOT/BOOTX64.EFI is
the image's Microsoft-signed shim, next to it the Debian-signed GRUB that shim trusts and
MokManager, and a grub.cfg that loads the image's own kernel and initramfs from the root
partition, console on the first serial port. The root partition is an ext4 file system made in
place (`mkfs.ext4 -E offset= -d`, e2fsprogs >= 1.43), and the job's runner is written onto that
disk only (`debugfs -w`, the partition opened as `DISK?offset=N`): the image directory itself
is not changed by booting it. The firmware is Debian's OVMF (package ovmf) built with Secure
Boot and SMM (OVMF_CODE_4M.secboot.fd, which aborts without SMM), its variable store a copy of
OVMF_VARS_4M.ms.fd: "distribution-specific PK and KEK1 keys, and the default Microsoft keys in
KEK/DB", Secure Boot already on (the ovmf package's README.Debian). No network, no display.

The job: a second disk (label `egpujob`) holds an executable `run` and any files it needs. The
runner unit starts after multi-user.target, mounts that disk, runs `run` in its `out/`
directory, keeps the exit status in `out/rc` and the output in `out/log` (also streamed to the
second serial port), then powers the machine off through systemd (SuccessAction=/
FailureAction=poweroff, systemd.unit(5)); a hard timeout kills QEMU if it never gets there.
After QEMU exits, `out/` is read back from the disk image with `debugfs rdump`.

Accelerator: KVM when this machine has hardware virtualisation (kvm_intel or kvm_amd loaded).
A /dev/kvm backed only by kvm_pvm (a paravirtual KVM for nested clouds) runs a stock kernel
through instruction emulation: the Debian kernel printed nothing in 3 min there, while QEMU's
own TCG reaches multi-user.target in about a minute. EGPU_SETUP_TEST_ACCEL=kvm|tcg overrides.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from helpers import tiers
from helpers.image import ROOT_LABEL

JOB_LABEL = "egpujob"
JOB_MOUNT = "/run/egpu-test-job"
RUNNER_UNIT = "egpu-test-job.service"
RUNNER = "/usr/local/sbin/egpu-test-job"
RUNNER_SCRIPT = f"""#!/bin/sh
# egpu-setup tests: run the job on the second disk, keep its output and status there.
set -u
mkdir -p {JOB_MOUNT}
mount /dev/vdb {JOB_MOUNT} || exit 1
mkdir -p {JOB_MOUNT}/out
cd {JOB_MOUNT}/out || exit 1
echo "EGPU-TEST-JOB start after multi-user.target uptime=$(cut -d' ' -f1 /proc/uptime)" > /dev/ttyS0
{{ {JOB_MOUNT}/run; echo $? > {JOB_MOUNT}/out/rc; }} 2>&1 | tee {JOB_MOUNT}/out/log
echo "EGPU-TEST-JOB end rc=$(cat {JOB_MOUNT}/out/rc)" > /dev/ttyS0
cd /
sync
umount {JOB_MOUNT}
"""


def runner_unit(timeout_s: int) -> str:
    return f"""[Unit]
Description=egpu-setup tests: run the job from the second disk, then power off
After=multi-user.target
SuccessAction=poweroff
FailureAction=poweroff

[Service]
# exec, not oneshot: the boot finishes once the job has started, so inside it
# `systemctl is-system-running --wait` and `systemd-analyze` see the finished boot
Type=exec
ExecStart={RUNNER}
RuntimeMaxSec={timeout_s}
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS1

[Install]
WantedBy=multi-user.target
"""


class VmUnavailable(Exception):
    """QEMU or e2fsprogs is missing: tests skip with this reason."""


@dataclass(frozen=True)
class Boot:
    """What a boot left: the console, the job's status, output and files, and how long."""

    console: str
    rc: int | None  # the job's exit status; None when it never finished
    log: str
    out: Path  # the job's out/ directory, copied back from its disk
    seconds: float  # QEMU's wall time, start to exit
    qemu_rc: int | None  # None: killed at the hard timeout
    accel: str

    @property
    def text(self) -> str:
        """The console without colour codes and cursor movements."""
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", self.console)

    @property
    def reached_multi_user(self) -> bool:
        """systemd's own status line, and the job unit (After=multi-user.target) started."""
        return "Reached target multi-user.target" in self.text and self.job_started_at is not None

    @property
    def powered_off(self) -> bool:
        """Shut down by systemd and QEMU exited by itself (the kernel prints "Power down")."""
        return self.qemu_rc == 0 and "reboot: Power down" in self.text

    @property
    def job_started_at(self) -> float | None:
        """Seconds since the kernel started when the job began: boot to multi-user and then."""
        m = re.search(r"EGPU-TEST-JOB start after multi-user.target uptime=([0-9.]+)", self.text)
        return float(m.group(1)) if m else None


UNIT_PROPERTIES = (
    "Id",
    "ActiveState",
    "SubState",
    "Result",
    "ExecMainStatus",
    "ExecMainStartTimestampMonotonic",
    "ExecMainExitTimestampMonotonic",
    "TimeoutStartUSec",
    "ConditionResult",
)


def show_units(units: list[str], out: str = "units.txt") -> str:
    """A job line that keeps `systemctl show` of the units in out/<out> (read by `units`)."""
    props = ",".join(UNIT_PROPERTIES)
    return f"systemctl show -p {props} {' '.join(units)} > {out}\n"


def units(out: Path, name: str = "units.txt") -> dict[str, dict[str, str]]:
    """The `systemctl show` blocks a job kept, by unit id."""
    found: dict[str, dict[str, str]] = {}
    for block in (out / name).read_text().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in props:
            found[props["Id"]] = props
    return found


def timespan_s(value: str) -> float:
    """A systemd time span ("1min 30s", "infinity") in seconds (systemd.time(7))."""
    if value == "infinity":
        return float("inf")
    scale = {"ms": 1e-3, "us": 1e-6, "s": 1, "min": 60, "h": 3600, "d": 86400}
    return sum(float(n) * scale[u] for n, u in re.findall(r"([0-9.]+)\s*(ms|us|min|s|h|d)", value))


def accelerator() -> str:
    chosen = os.environ.get("EGPU_SETUP_TEST_ACCEL")
    if chosen in ("kvm", "tcg"):
        return chosen
    hardware = Path("/sys/module/kvm_intel").exists() or Path("/sys/module/kvm_amd").exists()
    return "kvm" if hardware and os.access("/dev/kvm", os.R_OK | os.W_OK) else "tcg"


# Debian's ovmf package (bookworm: 2022.11): the firmware built with Secure Boot and SMM, and
# the variable store with the keys enrolled; each boot gets its own copy of the store
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
# What the ESP holds, from the image's own packages: shim-signed, shim-helpers-amd64-signed
# (MokManager, which shim starts when an enrolment waits) and grub-efi-amd64-signed. Shim run as
# the removable-media path EFI/BOOT/BOOTX64.EFI starts fbx64.efi when it is next to it, else
# grubx64.efi from its own directory (should_use_fallback in shim.c,
# https://github.com/rhboot/shim/blob/main/shim.c): no fbx64.efi here, so no boot entries are
# written and the one boot goes straight to GRUB.
ESP_FILES = {
    "EFI/BOOT/BOOTX64.EFI": "usr/lib/shim/shimx64.efi.signed",
    "EFI/BOOT/mmx64.efi": "usr/lib/shim/mmx64.efi.signed",
    "EFI/BOOT/grubx64.efi": "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed",
}
ESP_MB = 64
SECTOR = 512
ALIGN = 1 << 20  # partitions on 1 MiB boundaries, and room for the GPT at both ends
# GPT partition types (UEFI 2.10, 5.3.3; the Discoverable Partitions Specification)
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
ROOT_X86_64_TYPE = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
KERNEL_ARGS = (
    # no login prompt on the console: a getty there ends systemd's status lines on it
    f"root=LABEL={ROOT_LABEL} rw console=ttyS0 panic=-1 systemd.mask=serial-getty@ttyS0.service"
)


def require_tools() -> None:
    tools = ("qemu-system-x86_64", "mkfs.ext4", "debugfs", "mkfs.vfat", "mcopy", "mmd", "sfdisk")
    for tool in tools:
        if shutil.which(tool) is None:
            raise VmUnavailable(f"{tool} is not installed (see .ci/run)")
    for firmware in (OVMF_CODE, OVMF_VARS):
        if not firmware.is_file():
            raise VmUnavailable(f"{firmware} is missing: the ovmf package (see .ci/run)")


def _du_bytes(path: Path) -> int:
    out = subprocess.run(
        ["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[0])


def ext4_from_dir(
    src: Path, disk: Path, *, label: str, spare_mb: int = 512, offset: int = 0, size: int = 0
) -> Path:
    """A raw ext4 file system holding src's tree (owners, modes, links, device nodes), no loop
    mount: the whole of `disk`, or `size` bytes of it from `offset` (a partition)."""
    if not offset:
        size = _du_bytes(src) * 5 // 4 + spare_mb * 1024 * 1024
        disk.unlink(missing_ok=True)
        with open(disk, "wb") as f:
            f.truncate(size)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", label, "-E", f"offset={offset}", "-d", str(src),
         str(disk), f"{size // 1024}k"],
        check=True,
        capture_output=True,
        timeout=900,
    )  # fmt: skip
    return disk


def debugfs_write(
    disk: Path, files: Mapping[str, tuple[str, int]], links: Mapping[str, str], *, offset: int = 0
) -> None:
    """Add files {path: (text, mode)} and symlinks {path: target} to an ext4 image (the file
    system at `offset` of it), owned by root, through debugfs (e2fsprogs): the source directory
    stays as it was."""
    with tempfile.TemporaryDirectory() as tmp:
        cmds = []
        for i, (path, (text, mode)) in enumerate(sorted(files.items())):
            local = Path(tmp) / str(i)
            local.write_text(text)
            parent, name = path.rsplit("/", 1)
            cmds += [f"cd {parent or '/'}", f"write {local} {name}"]
            cmds += [
                f"sif {path} mode 0{0o100000 | mode:o}",
                f"sif {path} uid 0",
                f"sif {path} gid 0",
            ]
        for path, target in sorted(links.items()):
            parent, name = path.rsplit("/", 1)
            cmds += [f"mkdir {parent}", f"cd {parent}", f"symlink {name} {target}"]
        script = Path(tmp) / "cmds"
        script.write_text("\n".join(cmds) + "\n")
        proc = subprocess.run(
            # DISK?offset=N: e2fsprogs' unix I/O manager opens the file system at N
            ["debugfs", "-w", "-f", str(script), f"{disk}?offset={offset}"],
            capture_output=True,
            text=True,
        )
        # debugfs exits 0 even when a command fails; it names the failure on stderr
        bad = [ln for ln in proc.stderr.splitlines() if ln and not ln.startswith("debugfs ")]
        bad = [ln for ln in bad if "directory already exists" not in ln]  # mkdir of one there
        if proc.returncode or bad:
            raise RuntimeError(f"debugfs on {disk}: {proc.stderr[-2000:]}")


def grub_cfg(kver: str) -> str:
    """GRUB's configuration on the ESP: the image's kernel and initramfs from the root partition,
    found by its label, at once. Debian's signed GRUB is one image with its modules built in
    (search, ext2, part_gpt, linux) and reads grub.cfg from the directory it was started from
    when its prefix (/EFI/debian) has none (grub2 debian/build-efi-images)."""
    return f"""set timeout=0
search --no-floppy --label {ROOT_LABEL} --set=root
linux /boot/vmlinuz-{kver} {KERNEL_ARGS}
initrd /boot/initrd.img-{kver}
boot
"""


def _tool(argv: list[str], stdin: str | None = None) -> None:
    subprocess.run(argv, input=stdin, text=True, check=True, capture_output=True, timeout=120)


def esp_image(image_root: Path, kver: str, esp: Path) -> Path:
    """A FAT EFI system partition holding shim, MokManager, GRUB and its grub.cfg (mtools)."""
    esp.unlink(missing_ok=True)
    _tool(["mkfs.vfat", "-F", "32", "-n", "EFI", "-C", str(esp), str(ESP_MB * 1024)])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "grub.cfg"
        cfg.write_text(grub_cfg(kver))
        copies = {**{dest: image_root / src for dest, src in ESP_FILES.items()},
                  "EFI/BOOT/grub.cfg": cfg}  # fmt: skip
        _tool(["mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT"])
        for dest, src in copies.items():
            _tool(["mcopy", "-i", str(esp), str(src), f"::/{dest}"])
    return esp


def root_disk(image_root: Path, kver: str, disk: Path, *, job_timeout_s: int) -> Path:
    """The image as a laptop's disk: GPT, the ESP, the root partition (with the job runner added
    to the disk only)."""
    esp = esp_image(image_root, kver, disk.with_suffix(".esp"))
    esp_start, esp_size = ALIGN, esp.stat().st_size
    root_start = esp_start + -(-esp_size // ALIGN) * ALIGN
    root_size = (_du_bytes(image_root) * 5 // 4 + (512 << 20)) // ALIGN * ALIGN
    disk.unlink(missing_ok=True)
    with open(disk, "wb") as f:
        f.truncate(root_start + root_size + ALIGN)
    table = (
        "label: gpt\n"
        f"start={esp_start // SECTOR}, size={esp_size // SECTOR}, type={ESP_TYPE}, name=ESP\n"
        f"start={root_start // SECTOR}, size={root_size // SECTOR}, type={ROOT_X86_64_TYPE}, "
        f"name={ROOT_LABEL}\n"
    )
    _tool(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", str(disk)], table)
    _tool(["dd", f"if={esp}", f"of={disk}", "bs=1M", f"seek={esp_start // ALIGN}", "conv=notrunc"])
    esp.unlink()
    ext4_from_dir(image_root, disk, label=ROOT_LABEL, offset=root_start, size=root_size)
    debugfs_write(
        disk,
        {
            RUNNER: (RUNNER_SCRIPT, 0o755),
            f"/etc/systemd/system/{RUNNER_UNIT}": (runner_unit(job_timeout_s), 0o644),
        },
        {f"/etc/systemd/system/multi-user.target.wants/{RUNNER_UNIT}": f"../{RUNNER_UNIT}"},
        offset=root_start,
    )
    return disk


def job_disk(workdir: Path, script: str, files: Mapping[str, Path] | None = None) -> Path:
    """A disk holding the job: `run` (the script, executable) and copies of `files`."""
    tree = workdir / "job"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    (tree / "run").write_text(script)
    (tree / "run").chmod(0o755)
    for name, src in (files or {}).items():
        if src.is_dir():
            shutil.copytree(src, tree / name, symlinks=True)
        else:
            shutil.copy2(src, tree / name)
    return ext4_from_dir(tree, workdir / "job.raw", label=JOB_LABEL, spare_mb=256)


def boot(
    disk: Path,
    job: Path,
    workdir: Path,
    *,
    timeout_s: float = 600,
    memory: str = "2G",
    cpus: int = 2,
) -> Boot:
    """Boot the disk through OVMF with Secure Boot on, the job disk attached; wait for QEMU to
    exit (or kill it at timeout_s)."""
    tiers.require("qemu")
    require_tools()
    accel = accelerator()
    console, job_log = workdir / "console.log", workdir / "job-serial.log"
    variables = workdir / "OVMF_VARS.fd"  # the firmware writes its variables (MokNew) here
    shutil.copyfile(OVMF_VARS, variables)
    argv = [
        "qemu-system-x86_64",
        "-nodefaults",
        "-no-user-config",
        "-machine",
        # smm=on and secure flash: the variable store is writable from SMM only, so that code
        # outside the firmware cannot rewrite the Secure Boot keys; no S3 (nothing here suspends)
        f"q35,smm=on,accel={accel}",
        "-global",
        "driver=cfi.pflash01,property=secure,value=on",
        "-global",
        "ICH9-LPC.disable_s3=1",
        "-drive",
        f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive",
        f"if=pflash,format=raw,unit=1,file={variables}",
        "-cpu",
        "host" if accel == "kvm" else "max",
        "-smp",
        str(cpus),
        "-m",
        memory,
        "-display",
        "none",
        "-no-reboot",  # a reboot or a panic (panic=-1) ends QEMU instead of looping
        "-drive",
        f"file={disk},format=raw,if=none,id=root,cache=unsafe",
        "-device",
        "virtio-blk-pci,drive=root,bootindex=0",
        "-drive",
        f"file={job},format=raw,if=none,id=job",
        "-device",
        "virtio-blk-pci,drive=job",
        "-serial",
        f"file:{console}",
        "-serial",
        f"file:{job_log}",
    ]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
        )
        qemu_rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        qemu_rc = None  # subprocess.run killed it
    seconds = time.monotonic() - started
    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        ["debugfs", "-R", f"rdump /out {workdir}", str(job)], capture_output=True, check=False
    )
    rc_file = out / "rc"
    rc = int(rc_file.read_text().strip()) if rc_file.is_file() else None
    log = (out / "log").read_text(errors="replace") if (out / "log").is_file() else ""
    return Boot(
        console=console.read_text(errors="replace") if console.is_file() else "",
        rc=rc,
        log=log,
        out=out,
        seconds=seconds,
        qemu_rc=qemu_rc,
        accel=accel,
    )
