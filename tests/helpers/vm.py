"""Boot an image directory under QEMU, headless, and run one job inside the booted machine.

The image becomes a raw ext4 disk without loop mounts (`mkfs.ext4 -d`, e2fsprogs >= 1.43), and
the job's runner is written onto that disk only (`debugfs -w`): the image directory itself is
not changed by booting it. QEMU boots the image's own kernel and initramfs directly
(`-kernel`/`-initrd`), console on the first serial port, no network, no display.

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


def require_tools() -> None:
    for tool in ("qemu-system-x86_64", "mkfs.ext4", "debugfs"):
        if shutil.which(tool) is None:
            raise VmUnavailable(f"{tool} is not installed (see .ci/run)")


def _du_bytes(path: Path) -> int:
    out = subprocess.run(
        ["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[0])


def ext4_from_dir(src: Path, disk: Path, *, label: str, spare_mb: int = 512) -> Path:
    """A raw ext4 image holding src's tree (owners, modes, links, device nodes), no loop mount."""
    size = _du_bytes(src) * 5 // 4 + spare_mb * 1024 * 1024
    disk.unlink(missing_ok=True)
    with open(disk, "wb") as f:
        f.truncate(size)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", label, "-d", str(src), str(disk)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return disk


def debugfs_write(
    disk: Path, files: Mapping[str, tuple[str, int]], links: Mapping[str, str]
) -> None:
    """Add files {path: (text, mode)} and symlinks {path: target} to an ext4 image, owned by
    root, through debugfs (e2fsprogs): the source directory stays as it was."""
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
            ["debugfs", "-w", "-f", str(script), str(disk)], capture_output=True, text=True
        )
        # debugfs exits 0 even when a command fails; it names the failure on stderr
        bad = [ln for ln in proc.stderr.splitlines() if ln and not ln.startswith("debugfs ")]
        bad = [ln for ln in bad if "directory already exists" not in ln]  # mkdir of one there
        if proc.returncode or bad:
            raise RuntimeError(f"debugfs on {disk}: {proc.stderr[-2000:]}")


def root_disk(image_root: Path, disk: Path, *, job_timeout_s: int) -> Path:
    """The image as a bootable disk, with the job runner added to the disk only."""
    ext4_from_dir(image_root, disk, label="egpuroot")
    debugfs_write(
        disk,
        {
            RUNNER: (RUNNER_SCRIPT, 0o755),
            f"/etc/systemd/system/{RUNNER_UNIT}": (runner_unit(job_timeout_s), 0o644),
        },
        {f"/etc/systemd/system/multi-user.target.wants/{RUNNER_UNIT}": f"../{RUNNER_UNIT}"},
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
    kernel: Path,
    initrd: Path,
    disk: Path,
    job: Path,
    workdir: Path,
    *,
    timeout_s: float = 600,
    memory: str = "2G",
    cpus: int = 2,
    append: str = "",
) -> Boot:
    """Boot the disk with the job disk attached; wait for QEMU to exit (or kill it at timeout_s)."""
    tiers.require("qemu")
    require_tools()
    accel = accelerator()
    console, job_log = workdir / "console.log", workdir / "job-serial.log"
    argv = [
        "qemu-system-x86_64",
        "-nodefaults",
        "-no-user-config",
        "-machine",
        f"q35,accel={accel}",
        "-cpu",
        "host" if accel == "kvm" else "max",
        "-smp",
        str(cpus),
        "-m",
        memory,
        "-display",
        "none",
        "-no-reboot",  # a reboot or a panic (panic=-1) ends QEMU instead of looping
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        # no login prompt on the console: a getty there ends systemd's status lines on it
        f"root=/dev/vda rw console=ttyS0 panic=-1 systemd.mask=serial-getty@ttyS0.service {append}",
        "-drive",
        f"file={disk},format=raw,if=virtio,cache=unsafe",
        "-drive",
        f"file={job},format=raw,if=virtio",
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
