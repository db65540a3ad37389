"""One row per machine, from its newest reports, saying only what the reports prove.

- the device the verify ran on: a CPU verify proves torch trains on the CPU and nothing about
  a GPU, so it is its own state ("cpu only"), never an ok eGPU;
- the GPU, connection, link and driver from what verify and detect saw on the machine, never
  the GPU a profile or a resolution planned for;
- torch only when a verify imported it or an install's pip step ran, never the planned one;
- every failure with its one-line message; the time of the newest report and its age;
- measured against expected (fleet/expected.py): the link against its ceiling, host-to-device
  GB/s against that ceiling and the profile's floor, TFLOPS against the profile's rate;
- the enclosure the eGPU sat in (fleet/enclosures.py groups the rows by it), the term's health
  (peak temperature against the limit, time throttled, Xids) and the last kernels check
  (fleet/term.py): warnings below the row, never its status, which verify alone decides.
A verify older than an install that changed the machine proves nothing about it any more.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

from egpu_setup.errors import UsageError
from egpu_setup.fleet.enclosures import Enclosure, EnclosureRow, enclosure_of, group_by_enclosure
from egpu_setup.fleet.expected import (
    Link,
    Measure,
    h2d_measure,
    link_ceiling,
    number,
    tflops_measure,
)
from egpu_setup.fleet.identity import Machine, machines, unique_names
from egpu_setup.fleet.load import FileProblem, LoadedReport, dig, find_folders, load_folder
from egpu_setup.fleet.term import HealthTerm, KernelsState, health_term, kernels_state
from egpu_setup.log import get_logger
from egpu_setup.state.reports import OrderKey

log = get_logger("egpu_setup.report")

SCHEMA_REPORT = "egpu-setup/report/1"

# verify's check ids behind columns (egpu_setup/verify/_child.py)
H2D_CHECK = "h2d-bandwidth"
AMP_CHECK = "amp-training"
LINK_CHECK = "pcie-link"
IMPORT_CHECK = "torch-import"

# A row's state, worst first; `ok` is the only good one ("cpu only" is, with --cpu-ok).
STATUSES = ("failed", "suspect", "reboot required", "not verified", "cpu only", "ok")

_MESSAGE_MAX = 200
NOT_MEASURED = Measure(None)  # one line of a failures column, not a log


@dataclass(frozen=True)
class Problem:
    """One line of the failures column: where it comes from, which check or file, and why."""

    source: str  # "install" / "verify" / "claim" (a report from another machine) / "file"
    id: str
    message: str

    @property
    def label(self) -> str:
        return f"{self.source}:{self.id}"

    def text(self) -> str:
        return f"{self.label}: {self.message}" if self.message else self.label

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "id": self.id, "message": self.message}


@dataclass(frozen=True)
class MachineRow:
    """One line of the fleet table."""

    machine: str  # unique among the rows
    status: str  # one of STATUSES
    ok: bool
    folder: str
    hostname: str | None = None  # what its newest report claims
    machine_id: str | None = None
    inventory_hostname: str | None = None
    device: str | None = None  # "cuda" / "cpu": what the newest verify ran on
    gpu: str | None = None
    connection: str | None = None
    link: Link | None = None
    ceiling: Link | None = None
    h2d: Measure = NOT_MEASURED
    tflops: Measure = NOT_MEASURED
    driver: str | None = None
    torch: str | None = None
    amp: str | None = None  # "ok" / "failed" / "skipped" / None (never ran)
    install: str | None = None  # "ok" / "changed" / "reboot required" / "failed" / "planned"
    verify: str | None = None  # "ok" / "failed" / None
    failures: tuple[Problem, ...] = ()
    warnings: tuple[Problem, ...] = ()
    flags: tuple[Problem, ...] = ()  # reports set aside, files that could not be read
    notes: tuple[str, ...] = ()
    time: datetime | None = None  # of the newest report used
    sequence: int | None = None  # the newest report's place in its machine's order
    age_s: float | None = None
    profile: str | None = None
    enclosure: Enclosure | None = None
    health: HealthTerm | None = None
    kernels: KernelsState | None = None
    # a lab image's first boot: {"outcome", "mok"} (firstboot.json), None without one
    firstboot: dict[str, str | None] | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "hostname": self.hostname,
            "folder": self.folder,
            "machine_id_sha256": self.machine_id,
            "inventory_hostname": self.inventory_hostname,
            "status": self.status,
            "ok": self.ok,
            "device": self.device,
            "gpu": self.gpu,
            "connection": self.connection,
            "link": self.link.text() if self.link else None,
            "link_trained": self.link.to_json() if self.link else None,
            "link_ceiling": self.ceiling.text() if self.ceiling else None,
            "driver": self.driver,
            "torch": self.torch,
            "h2d_gbps": self.h2d.value,
            "h2d_min_gbps": self.h2d.expected,
            "h2d_ceiling_gbps": self.h2d.ceiling,
            "tflops": self.tflops.value,
            "tflops_expected": self.tflops.expected,
            "tflops_precision": self.tflops.label,
            "amp": self.amp,
            "install": self.install,
            "verify": self.verify,
            "failures": [p.label for p in self.failures],
            "problems": [p.to_json() for p in (*self.failures, *self.flags)],
            "warnings": [p.to_json() for p in self.warnings],
            "notes": list(self.notes),
            "time": self.time.isoformat(timespec="seconds") if self.time else None,
            "age_s": round(self.age_s) if self.age_s is not None else None,
            "sequence": self.sequence,
            "profile": self.profile,
            "enclosure": self.enclosure.to_json() if self.enclosure else None,
            "health": self.health.to_json() if self.health else None,
            "kernels": self.kernels.to_json() if self.kernels else None,
            "firstboot": self.firstboot,
            "sources": list(self.sources),
        }


@dataclass(frozen=True)
class FleetReport:
    """The merged table plus what was skipped and why."""

    rows: tuple[MachineRow, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (path, reason): files that are not ours
    cpu_ok: bool = False
    now: datetime | None = None
    since: date | None = None  # the term's first day (health), None: every day kept

    @property
    def enclosures(self) -> tuple[EnclosureRow, ...]:
        """The rows grouped by the enclosure their eGPU sat in (fleet/enclosures.py)."""
        return group_by_enclosure([(r.machine, r.enclosure, r.link, r.ceiling) for r in self.rows])

    @property
    def summary(self) -> dict[str, int]:
        count = {s: sum(r.status == s for r in self.rows) for s in STATUSES}
        return {
            "hosts": len(self.rows),
            "ok": sum(r.ok for r in self.rows),
            "failed": count["failed"],
            # not verified since the last change, a reboot pending or not
            "unverified": count["not verified"] + count["reboot required"],
            "cpu": count["cpu only"],
            "suspect": count["suspect"],
        }

    @property
    def not_ok(self) -> tuple[MachineRow, ...]:
        return tuple(r for r in self.rows if not r.ok)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_REPORT,
            "summary": self.summary,
            "cpu_ok": self.cpu_ok,
            "time": self.now.isoformat(timespec="seconds") if self.now else None,
            "since": self.since.isoformat() if self.since else None,
            "hosts": [r.to_json() for r in self.rows],
            "enclosures": [e.to_json() for e in self.enclosures],
            "skipped": [{"path": p, "reason": why} for p, why in self.skipped],
        }


# -- collecting ------------------------------------------------------------------------------------


def collect(
    paths: Sequence[str | os.PathLike[str]],
    *,
    cpu_ok: bool = False,
    now: datetime | None = None,
    since: date | None = None,
) -> FleetReport:
    """Load every report under `paths` into one row per machine (fleet/identity.py); the
    health of the days from `since` on."""
    now = now or datetime.now(timezone.utc)
    found: list[Machine] = []
    skipped: list[FileProblem] = []
    for folder, base, files in find_folders(paths):
        loaded = load_folder(folder, base, files)
        for problem in loaded.problems:
            log.warning("skipping %s: %s", problem.path, problem.reason)
            if not problem.ours:
                skipped.append(problem)
        found += [
            m
            for m in machines(loaded)
            if m.reports or m.disowned or m.problems or m.identity is not None
        ]
    if not any(m.reports or m.disowned or m.problems for m in found):
        where = ", ".join(str(p) for p in paths)
        raise UsageError(
            f"no egpu-setup reports found in {where}",
            "reports are saved by `egpu-setup verify` under /var/lib/egpu-setup/reports/; "
            "fetch them with the Ansible role or copy them here",
        )
    rows = [build_row(m, cpu_ok=cpu_ok, now=now, since=since) for m in unique_names(found)]
    rows.sort(key=lambda r: (r.machine.lower(), r.folder))
    return FleetReport(
        rows=tuple(rows),
        skipped=tuple((str(p.path), p.reason) for p in skipped),
        cpu_ok=cpu_ok,
        now=now,
        since=since,
    )


# -- one row ---------------------------------------------------------------------------------------


def build_row(
    machine: Machine, *, cpu_ok: bool, now: datetime, since: date | None = None
) -> MachineRow:
    """The row of one machine from its own reports (the newest of each kind)."""
    verify = _newest(machine.reports, "verify")
    install = _newest(machine.reports, "install")
    plan = _newest(machine.reports, "resolution")
    used = [r for r in (verify, install, plan) if r is not None]
    used.sort(key=_age_key, reverse=True)  # newest first: its facts win
    hosts = [r.data.get("host") for r in used]
    vdata = verify.data if verify else {}
    device = vdata.get("device")
    checks = [c for c in _list(vdata.get("checks")) if isinstance(c, dict)]
    by_id = {str(c.get("id")): c for c in reversed(checks)}  # the first of an id wins
    kind = _device_kind(vdata, device, by_id) if verify else None

    link_check = by_id.get(LINK_CHECK)
    link = Link.from_json(link_check.get("value") if link_check else None)
    link = link or next((lk for h in hosts if (lk := Link.from_json(dig(h, "link")))), None)
    connection = _first_str(
        *(dig(h, "connection") for h in hosts),
        dig(device, "connection"),
        dig(link_check, "expected", "connection"),
    )
    h2d_check = by_id.get(H2D_CHECK)
    h2d_value = number(h2d_check.get("value")) if h2d_check else None
    ceiling = link_ceiling(link, connection, h2d_value)
    h2d = h2d_measure(h2d_check, link, ceiling, connection)
    gpu = _first_str(
        dig(device, "name") if kind == "cuda" else None,
        *(dig(h, "gpu", "name") for h in hosts),
        *(dig(h, "gpu") for h in hosts),
    )
    driver = _first_str(
        *(dig(h, "driver") for h in hosts),
        *(dig(h, "driver", "version") for h in hosts),
        dig(device, "driver"),
    )

    stale = _stale(verify, install)
    failures: list[Problem] = []
    warnings: list[Problem] = []
    if verify is not None and not stale:
        failures, warnings = _verify_problems(vdata, checks)
    install_state = _install_state(install)
    if install_state == "failed" and install is not None:
        failures.insert(0, _install_problem(install.data))
    flags = [Problem("claim", d.report.path.name, d.reason) for d in machine.disowned]
    flags += [Problem("file", p.path.name, p.reason) for p in machine.problems]
    notes = []
    if stale and verify is not None and install is not None:
        notes.append(
            f"the verify of {_iso(verify.time)} predates the install of {_iso(install.time)}, "
            "which changed the machine"
        )
    if verify is not None and not stale and kind is None:
        notes.append(f"the verify of {_iso(verify.time)} does not say which device it ran on")
    if (clock := _clock_went_back(machine.reports)) is not None:
        notes.append(clock)
    if machine.identity is not None and machine.identity.root:
        notes.append(f"an image root ({machine.identity.root}): verified on its first boot")
    health_doc = _newest(machine.reports, "health")
    health = health_term(health_doc.data, since) if health_doc else None
    kernels_doc = _newest(machine.reports, "kernels")
    kernels = kernels_state(kernels_doc.data) if kernels_doc else None
    warnings += _term_warnings(health, kernels)
    firstboot_doc = _newest(machine.reports, "firstboot")
    firstboot = _firstboot(firstboot_doc.data) if firstboot_doc else None
    warnings += _waits_for_a_person(firstboot)

    verify_state = None
    if verify is not None:
        verify_state = "ok" if vdata.get("ok") is True and not failures else "failed"
    status = _status(failures, flags, install_state, verify, stale, kind)
    newest = used[0].time if used and used[0].time else None
    amp_check = by_id.get(AMP_CHECK)
    return MachineRow(
        machine=machine.name,
        status=status,
        ok=status == "ok" or (status == "cpu only" and cpu_ok),
        folder=str(machine.folder),
        hostname=machine.hostname,
        machine_id=machine.machine_id,
        inventory_hostname=machine.identity.inventory_hostname if machine.identity else None,
        device=kind,
        gpu=gpu,
        connection=connection,
        link=link,
        ceiling=ceiling,
        h2d=h2d,
        tflops=tflops_measure(checks),
        driver=driver,
        torch=_torch(verify, by_id, machine.reports),
        amp=_amp(amp_check) if amp_check else None,
        install=install_state or ("planned" if plan else None),
        verify=verify_state,
        failures=tuple(failures),
        warnings=tuple(warnings),
        flags=tuple(flags),
        notes=tuple(notes),
        time=newest,
        sequence=used[0].sequence if used else None,
        age_s=(now - newest).total_seconds() if newest else None,
        profile=_first_str(*(r.data.get("profile") for r in used)),
        enclosure=enclosure_of(hosts),
        health=health,
        kernels=kernels,
        firstboot=firstboot,
        sources=tuple(str(r.path) for r in used),
    )


# firstboot.json's values that mean a person must go to the laptop (docs/design.md, firstboot)
_FIRSTBOOT_OUTCOMES = ("no-egpu", "not-enrolled", "no-gpu-after-enrol", "ready", "passed", "failed")
_MOK_STATES = ("mok-needed", "mok-enrolled")


def _firstboot(data: Mapping[str, Any]) -> dict[str, str | None]:
    """The first boot's outcome and MOK state, each only when it is one firstboot writes."""
    outcome, mok = data.get("outcome"), data.get("mok")
    return {
        "outcome": outcome if outcome in _FIRSTBOOT_OUTCOMES else None,
        "mok": mok if mok in _MOK_STATES else None,
    }


def _waits_for_a_person(firstboot: dict[str, str | None] | None) -> list[Problem]:
    """Which laptops of an imaged lab wait for someone at their console, and why."""
    if firstboot is None:
        return []
    out = []
    if firstboot["mok"] == "mok-needed":
        out.append(
            Problem(
                "firstboot",
                "mok-needed",
                "waits for a person: Secure Boot loads the NVIDIA module only after its signing "
                "key is enrolled (confirm it in MokManager at the next boot)",
            )
        )
    if firstboot["outcome"] == "not-enrolled":
        out.append(
            Problem(
                "firstboot",
                "not-enrolled",
                "waits for a person: no enclosure was enrolled (pin it in the profile's "
                "hotplug.enclosure_unique_ids, or authorize it at the laptop)",
            )
        )
    return out


def _term_warnings(health: HealthTerm | None, kernels: KernelsState | None) -> list[Problem]:
    """What the term's health and the kernels check say is wrong, one line each."""
    out = []
    if health is not None and health.too_hot:
        out.append(
            Problem(
                "health",
                "temperature",
                f"peaked at {health.peak_c:g} C, the profile's limit is {health.limit_c:g} C",
            )
        )
    if health is not None and health.xids:
        codes = ", ".join(f"{code} x{n}" for code, n in health.xids)
        out.append(Problem("health", "xid", f"Xid events over the term: {codes}"))
    if kernels is not None and not kernels.ok:
        running = " (the running one among them)" if kernels.running_missing else ""
        out.append(
            Problem(
                "kernels",
                "nvidia-module-missing-for-kernel",
                f"no NVIDIA module for {', '.join(kernels.missing)}{running}",
            )
        )
    return out


def _status(
    failures: Sequence[Problem],
    flags: Sequence[Problem],
    install: str | None,
    verify: LoadedReport | None,
    stale: bool,
    device: str | None,
) -> str:
    if failures:
        return "failed"
    if flags:
        return "suspect"
    if verify is None or stale:
        return "reboot required" if install == "reboot required" else "not verified"
    if device == "cuda":
        return "ok"
    # a CPU verify proves torch, not a GPU; a verify that does not say what it ran on proves
    # neither: only a run on CUDA is an ok eGPU
    return "cpu only" if device == "cpu" else "not verified"


def _newest(reports: Sequence[LoadedReport], kind: str) -> LoadedReport | None:
    mine = [r for r in reports if r.kind == kind]
    return max(mine, key=_age_key) if mine else None


def _age_key(rep: LoadedReport) -> OrderKey:
    return rep.age


def _stale(verify: LoadedReport | None, install: LoadedReport | None) -> bool:
    """The verify ran before an install that changed the machine (or wants a reboot): in the
    order the machine saved them (their sequence), and by their clocks only for reports from
    before sequences."""
    if verify is None or install is None:
        return False
    if verify.sequence is None or install.sequence is None:
        if verify.time is None or install.time is None or install.time <= verify.time:
            return False
    elif install.age <= verify.age:
        return False
    state = _install_state(install)
    return state in ("changed", "reboot required")


def _clock_went_back(reports: Sequence[LoadedReport]) -> str | None:
    """Say so when the machine's clock disagrees with the order it saved its reports in: the
    newest report (by sequence) is older by its clock than one saved before it. The row is
    built from the newest by sequence; the times shown are the machine's clock."""
    numbered = sorted((r for r in reports if r.sequence is not None), key=_age_key)
    newest_time = numbered[-1].time if numbered else None
    if newest_time is None:
        return None
    newest = numbered[-1]
    later = [(r.time, r) for r in numbered[:-1] if r.time is not None and newest_time < r.time]
    if not later:
        return None
    other = max(later, key=lambda pair: pair[0])[1]
    return (
        f"the clock went back: {newest.path.name} (sequence {newest.sequence}, "
        f"{_iso(newest.time)}) is the newest report, saved after {other.path.name} "
        f"(sequence {other.sequence}, {_iso(other.time)}); rows follow the sequence"
    )


def _device_kind(
    data: Mapping[str, Any], device: Any, by_id: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """What the verify ran on: its `device_kind`, else the device's type; a report from before
    either field says "cuda" through a passing cuda-available check, "cpu" by its device name."""
    for value in (data.get("device_kind"), dig(device, "type"), dig(data, "options", "device")):
        if value in ("cpu", "cuda"):
            return str(value)
    cuda = by_id.get("cuda-available")
    if cuda is not None and (cuda.get("status") == "pass" or cuda.get("ok") is True):
        return "cuda"
    if dig(device, "name") == "cpu":
        return "cpu"
    return None


def _verify_problems(
    data: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]
) -> tuple[list[Problem], list[Problem]]:
    """(failures, warnings): failed checks with their detail; `info` checks are no verdict."""
    failures: list[Problem] = []
    warnings: list[Problem] = []
    for check in checks:
        status = check.get("status")
        cid = _one_line(check.get("id")) or "?"
        detail = _one_line(check.get("detail"))
        if status == "fail" or (status is None and check.get("ok") is False):
            failures.append(Problem("verify", cid, detail))
        elif status == "warn":
            warnings.append(Problem("verify", cid, detail))
    if data.get("ok") is not True and not failures:
        outcome = _one_line(data.get("outcome"))
        failures.append(Problem("verify", "verify", f"not ok (outcome {outcome or 'unknown'})"))
    return failures, warnings


def _install_state(install: LoadedReport | None) -> str | None:
    if install is None:
        return None
    data = install.data
    result = data.get("result")
    if isinstance(result, dict):  # the `install --json` output itself
        steps = [st for st in _list(result.get("steps")) if isinstance(st, dict)]
        if result.get("reboot_required"):
            return "reboot required"
        if any(st.get("status") == "failed" for st in steps):
            return "failed"
        return "changed" if any(st.get("status") == "done" for st in steps) else "ok"
    code = data.get("exit_code")
    if code == 3 or data.get("reboot_required") is True:
        return "reboot required"
    if data.get("ok") is False or (isinstance(code, int) and code not in (0, 3)):
        return "failed"
    if data.get("ok") is True or code == 0:
        changed = data.get("changed")
        return "changed" if changed not in (None, False, 0, [], "0") else "ok"
    return None


def _install_problem(data: Mapping[str, Any]) -> Problem:
    """The failed install: its step and the error's one line (the role's install-ansible.json
    keeps the tool's last stderr lines; the tool's own report its message)."""
    steps = _list(dig(data, "result", "steps")) or _list(data.get("steps"))
    failed = [st for st in steps if isinstance(st, dict) and st.get("status") == "failed"]
    step = _first_str(
        dig(failed[0], "kind") if failed else None,
        dig(data, "failed_step", "kind"),
        dig(data, "failed_step", "id"),
        data.get("failed_step"),
    )
    error = data.get("error")
    message = _one_line(dig(error, "message"))
    if not message and isinstance(error, list):
        lines = [_one_line(x) for x in error if isinstance(x, str)]
        errs = [x for x in lines if x.startswith("error:")]
        message = errs[-1][len("error:") :].strip() if errs else (lines[-1] if lines else "")
    if not message and failed:
        message = _one_line(failed[0].get("detail")) or _one_line(failed[0].get("description"))
    code = data.get("exit_code")
    if not message and isinstance(code, int) and not isinstance(code, bool):
        message = f"exit status {code}"
    return Problem("install", step or "install", message)


def _torch(
    verify: LoadedReport | None,
    by_id: Mapping[str, Mapping[str, Any]],
    reports: Sequence[LoadedReport],
) -> str | None:
    """The torch really there: the newest of a verify that imported it and an install whose
    pip step ran. A torch that only a plan names was never installed."""
    evidence: list[tuple[LoadedReport, str]] = []
    if verify is not None:
        imported = by_id.get(IMPORT_CHECK)
        if imported is not None and imported.get("status", "pass") == "pass":
            version = _first_str(imported.get("value"), dig(verify.data, "device", "torch"))
            if version:
                evidence.append((verify, version))
    for rep in reports:
        if rep.kind == "install" and (version := _installed_torch(rep.data)):
            evidence.append((rep, version))
    if not evidence:
        return None
    return max(evidence, key=lambda e: _age_key(e[0]))[1]


def _installed_torch(data: Mapping[str, Any]) -> str | None:
    steps = _list(dig(data, "result", "steps")) or _list(data.get("steps"))
    if not any(
        isinstance(st, dict) and st.get("kind") == "pip-install" and st.get("status") == "done"
        for st in steps
    ):
        return None
    torch = dig(data, "resolution", "torch") or data.get("torch")
    version, variant = _first_str(dig(torch, "version")), _first_str(dig(torch, "variant"))
    if version:
        return f"{version}+{variant}" if variant and "+" not in version else version
    return _first_str(dig(data, "host", "torch"))


def _amp(check: Mapping[str, Any]) -> str:
    status = check.get("status")
    ok = check.get("ok")
    if status == "skip" or (status is None and ok is None):
        return "skipped"
    return "failed" if status == "fail" or ok is False else "ok"


def _iso(t: datetime | None) -> str:
    return t.isoformat(timespec="minutes") if t else "an unknown time"


def _one_line(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    line = " ".join(value.split())
    return line if len(line) <= _MESSAGE_MAX else line[: _MESSAGE_MAX - 1] + "…"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _first_str(*values: Any) -> str | None:
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                return f"{v:g}"
            except OverflowError:
                continue
        if isinstance(v, str) and v.strip():
            return _one_line(v)
    return None
