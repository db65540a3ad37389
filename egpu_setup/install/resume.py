"""`egpu-setup resume-check`: the eGPU after a suspend, checked where the kernel says it.

Before the sleep (`--before-sleep`, egpu-setup-sleep.service, ordered before sleep.target) the
eGPU's PCI address, its enclosure and the CUDA processes holding it are kept in
/run/egpu-setup/sleep.json: after a bad resume the GPU may be gone, and detection could no
longer say which one it was. After the resume (egpu-setup-resume.service, pulled in by and
ordered after suspend.target and hibernate.target: systemd.special(7), the targets are reached
once the system is up again) sysfs is read: the enclosure's `authorized`, the GPU's device under
/sys/bus/pci/devices and its driver link. A GPU gone or unbound gets one PCI rescan (write 1 to
/sys/bus/pci/rescan, Linux Documentation/ABI/testing/sysfs-bus-pci) and is read again. When a
CUDA process was using the eGPU before the sleep, `verify --quick` proves it still computes.
The result is <state>/resume.json, with findings doctor's catalog names.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.doctor.findings import Finding
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.resume")

SCHEMA_RESUME = "egpu-setup/resume/1"
SLEEP_RECORD = "/run/egpu-setup/sleep.json"
RESUME_FILE = "resume.json"
RESCAN = "/sys/bus/pci/rescan"
# CUDA's unified-memory node: every CUDA context opens it, a display server alone does not.
CUDA_NODE = "/dev/nvidia-uvm"

_PCI_FN = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_TB_NAME = re.compile(r"\d+-[0-9a-f.:-]+\Z")


@dataclass(frozen=True)
class SleepRecord:
    """What was true just before the sleep."""

    gpu: str | None  # "0000:0a:00.0"
    enclosure: str | None  # its Thunderbolt device, "0-1"; None off Thunderbolt or untied
    cuda: tuple[str, ...]  # "pid 4242 (python3): /dev/nvidia-uvm, /dev/nvidia0"

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "enclosure": self.enclosure, "cuda": list(self.cuda)}

    @classmethod
    def from_json(cls, data: object) -> SleepRecord:
        """The record read back: input, so every field is checked (UsageError otherwise)."""
        bad = UsageError(
            f"{SLEEP_RECORD} is not a record egpu-setup wrote",
            f"remove it (sudo rm {SLEEP_RECORD}); the next sleep writes a new one",
        )
        if not isinstance(data, dict):
            raise bad
        gpu, enclosure, cuda = data.get("gpu"), data.get("enclosure"), data.get("cuda")
        if gpu is not None and not (isinstance(gpu, str) and _PCI_FN.match(gpu)):
            raise bad
        if enclosure is not None and not (isinstance(enclosure, str) and _TB_NAME.match(enclosure)):
            raise bad
        if not isinstance(cuda, list) or not all(isinstance(c, str) for c in cuda):
            raise bad
        return cls(gpu, enclosure, tuple(c[:512] for c in cuda[:64]))


@dataclass(frozen=True)
class PathState:
    """The eGPU's path as sysfs shows it."""

    present: bool  # /sys/bus/pci/devices/<gpu> exists
    driver: str | None  # the driver bound to it ("nvidia"), None when unbound
    authorized: bool | None  # the enclosure's `authorized`; None: no enclosure to check

    @property
    def ok(self) -> bool:
        return self.present and self.driver is not None and self.authorized is not False


@dataclass(frozen=True)
class ResumeCheck:
    record: SleepRecord
    before_rescan: PathState
    rescanned: bool
    state: PathState  # after the rescan, when there was one
    verify_ok: bool | None  # None: not run (no CUDA process was using the eGPU)
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return self.state.ok and self.verify_ok is not False

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_RESUME,
            "ok": self.ok,
            "gpu": self.record.gpu,
            "enclosure": self.record.enclosure,
            "cuda_before_sleep": list(self.record.cuda),
            "present": self.state.present,
            "driver": self.state.driver,
            "authorized": self.state.authorized,
            "rescanned": self.rescanned,
            "verify_ok": self.verify_ok,
            "findings": [f.to_json() for f in self.findings],
        }


# -- before the sleep ---------------------------------------------------------------------------


def probe_sleep_record(host: Host) -> SleepRecord:
    """The eGPU, its enclosure and the CUDA processes on it, as detection and /proc say now."""
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.execute.eject import card_functions, enclosure_of, gpu_minor, gpu_users

    facts = detect_host(host)
    gpu = facts.egpu
    if gpu is None:
        return SleepRecord(None, None, ())
    enclosure, _why = enclosure_of(host, facts, gpu)
    only_gpu = len(facts.nvidia_gpus) == 1
    users = gpu_users(
        host, card_functions(host, gpu.pci_address), gpu_minor(host, gpu.pci_address), only_gpu
    )
    cuda = tuple(u for u in users if CUDA_NODE in u.split(": ", 1)[-1].split(", "))
    return SleepRecord(gpu.pci_address, enclosure.sysfs_name if enclosure else None, cuda)


def save_sleep_record(host: Host, record: SleepRecord) -> Path:
    """Keep the record in /run (kept over suspend and hibernation, gone at the next boot)."""
    from egpu_setup.state.atomic import atomic_write, make_dirs

    path = host.location(SLEEP_RECORD)
    make_dirs(path.parent, anchor=host.root)
    data = (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode()
    atomic_write(path, data, 0o600, anchor=host.root)
    return path


def read_sleep_record(host: Host) -> SleepRecord | None:
    from egpu_setup.state.paths import read_state

    data = read_state(host.location(SLEEP_RECORD), limit=1024 * 1024)
    if data is None:
        return None
    try:
        return SleepRecord.from_json(json.loads(data))
    except ValueError:
        return SleepRecord.from_json(None)  # raises the UsageError


# -- after the resume ---------------------------------------------------------------------------


def probe_path_state(host: Host, gpu: str, enclosure: str | None) -> PathState:
    """sysfs now: the GPU present and bound, the enclosure authorized (thin probe)."""
    base = f"/sys/bus/pci/devices/{gpu}"
    present = host.exists(base)
    link = host.readlink(f"{base}/driver") if present else None
    driver = link.rstrip("/").rsplit("/", 1)[-1] if link else None
    authorized = None
    if enclosure is not None:
        value = host.read_attr(f"/sys/bus/thunderbolt/devices/{enclosure}/authorized")
        authorized = value is not None and value.strip() not in ("", "0")
    return PathState(present, driver, authorized)


def rescan_pci(host: Host) -> None:
    """Write 1 to /sys/bus/pci/rescan through a descriptor walked from the root (state/atomic.py:
    no link followed on the way); the attribute exists, nothing is created."""
    from egpu_setup.errors import ExecutionError
    from egpu_setup.state.atomic import open_file

    try:
        fd = open_file(host.location(RESCAN), os.O_WRONLY, anchor=host.root, create_dirs=False)
        try:
            os.write(fd, b"1\n")
        finally:
            os.close(fd)
    except OSError as exc:
        raise ExecutionError(
            f"cannot write 1 to {RESCAN}: {exc.strerror or exc}",
            "run as root; see `sudo dmesg` for what the kernel refused",
        ) from exc


def _findings(record: SleepRecord, state: PathState, rescanned: bool) -> list[Finding]:
    out: list[Finding] = []
    if state.authorized is False:
        out.append(
            Finding(
                "thunderbolt-not-authorized",
                "error",
                f"The enclosure ({record.enclosure}) is no longer authorized after the resume",
                (f"/sys/bus/thunderbolt/devices/{record.enclosure}/authorized: 0",),
                "Authorize it again (`boltctl authorize UUID`, or replug it: a stored bolt "
                "device is authorized on connect), then `sudo egpu-setup resume-check`.",
            )
        )
    if not state.present or state.driver is None:
        where = f"/sys/bus/pci/devices/{record.gpu}"
        seen = f"{where}: absent" if not state.present else f"{where}/driver: no driver bound"
        out.append(
            Finding(
                "gpu-lost-after-resume",
                "error",
                f"The eGPU at {record.gpu} did not come back from the suspend"
                + (" (a PCI rescan did not bring it back)" if rescanned else ""),
                (seen,),
                "Reboot to recover it, or replug the enclosure; `sudo egpu-setup doctor` reads "
                "the kernel log of the resume. Before the next sleep, end the CUDA jobs on the "
                "eGPU or run `egpu-setup eject`.",
            )
        )
    return out


def check_after_resume(host: Host, venv: str) -> ResumeCheck:
    """The eGPU's path after a resume, rescanned once when it is not whole; `verify --quick` in
    `venv` when a CUDA process was using it before the sleep and it is back."""
    record = read_sleep_record(host) or probe_sleep_record(host)
    if record.gpu is None:
        none = PathState(False, None, None)
        return ResumeCheck(record, none, False, none, None, ())
    before = probe_path_state(host, record.gpu, record.enclosure)
    state, rescanned = before, False
    if (not before.present or before.driver is None) and before.authorized is not False:
        # an unauthorized enclosure has no PCIe tunnel: a rescan could find nothing behind it
        log.warning("the eGPU %s is not back after the resume: rescanning the PCI bus", record.gpu)
        rescan_pci(host)
        rescanned = True
        state = probe_path_state(host, record.gpu, record.enclosure)
    verify_ok = None
    # under --root nothing runs: the image's GPU is not this machine's
    if record.cuda and state.ok and host.kind == "live":
        verify_ok = _verify_quick(venv)
    findings = _findings(record, state, rescanned)
    return ResumeCheck(record, before, rescanned, state, verify_ok, tuple(findings))


def _verify_quick(venv: str) -> bool:
    """`egpu-setup verify --quick` on the eGPU, its report saved like any verify's."""
    from egpu_setup.verify.session import VerifyOptions, run_verify, state_dir

    report = run_verify(VerifyOptions(venv=venv, quick=True))
    try:
        report.save(state_dir())
    except OSError as exc:
        log.warning("could not save the verify report: %s", exc)
    return bool(report.ok)


def save_check(state_dir: Path, anchor: Path, check: ResumeCheck) -> Path:
    """Keep the result in <state>/resume.json (the last resume's)."""
    from egpu_setup.state.atomic import atomic_write, make_dirs

    make_dirs(state_dir, anchor=anchor)
    path = state_dir / RESUME_FILE
    data = (json.dumps(check.to_json(), indent=2, sort_keys=True) + "\n").encode()
    atomic_write(path, data, 0o644, anchor=anchor)
    return path
