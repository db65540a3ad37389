"""verify's CUDA branches, executed: the real child against recorded real GPUs, measured.

No GPU exists here, so the child runs against the CUDA stand-in (tests/helpers/cuda_standin.py):
recorded device properties, bus ids, arch lists, bandwidthTest GB/s and torch.matmul TFLOPS of
real cards (tests/data/real/cuda/values.yaml) replayed through the same child code, while the
training really computes on the CPU. A ROCm build is the same stand-in with torch.version.hip
set and a Radeon from a real rocminfo paste (tests/data/real/rocminfo/), its gcnArchName the
agent's gfx target: the scenarios oculink-rx7900xtx, rocm-wrong-gfx and rocm-verify. Each scenario below is one child run; the tests assert what
it reported, and the last test shows that together they execute every line of
egpu_setup/verify/_child.py except those listed in UNEXECUTED (none today), each with its reason.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from conftest import REPO
from egpu_setup.detect.facts import HostFacts
from egpu_setup.detect.probe import detect_host
from egpu_setup.host import process
from egpu_setup.host.machine import RecordedHost
from egpu_setup.profile.types import Profile
from egpu_setup.verify import _child as child
from egpu_setup.verify import session
from egpu_setup.verify.references import ThroughputReference
from egpu_setup.verify.runner import ChildOutcome, run_child
from egpu_setup.verify.session import VerifyOptions, build_config, run_verify
from helpers import child_faults
from helpers import cuda_recordings as rec
from helpers.venvs import make_venv, site_packages

pytest.importorskip("torch", reason="pip install torch==2.13.0 (CPU build)")
coverage = pytest.importorskip("coverage", reason="the test extra installs coverage")

HOSTS = REPO / "tests" / "fixtures" / "hosts"
CHILD = Path(child.__file__).resolve()
ERR = rec.errors()
# The smoke model a CPU computes in milliseconds per step (a GPU gets session.TRAIN_SHAPES).
SHAPE = {"batch": 32, "size": 16, "width": 8}
# Short budgets for the runs that only drive a failure path.
SHORT = {"bandwidth": 0.3, "matmul": 0.3, "amp": 3.0, "speedup": 1.0, "throughput": 1.0, "ddp": 60}

# Lines of _child.py no scenario executes, and why. The gate below fails when another line is
# missed, and also when one of these starts to run (then it belongs out of this list).
UNEXECUTED: dict[str, str] = {}


@dataclass
class Run:
    name: str
    outcome: ChildOutcome
    report: Any = None  # the VerifyReport, for runs through run_verify
    events: tuple[Any, ...] = ()

    @property
    def checks(self) -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in self.outcome.records if r.get("kind") == "check"}

    @property
    def device(self) -> dict[str, Any]:
        return next((r for r in self.outcome.records if r.get("kind") == "device"), {})


class Scenarios:
    """Runs each scenario once per module, on first use, with coverage measuring the child."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[str, Run] = {}
        self.cov_dir = root / "coverage"
        self.cov_dir.mkdir()
        self.rc = root / "coveragerc"
        self.rc.write_text(
            "[run]\n"
            f"data_file = {self.cov_dir / 'data'}\n"
            "parallel = True\n"
            f"include = {CHILD}\n"
            "branch = True\n"
            "sigterm = True\n"  # a child killed on timeout still saves what it ran
            # Lines for mypy only: TYPE_CHECKING is False when the child runs. Said here, not
            # left to the coverage version's defaults, which changed in 7.x.
            "[report]\n"
            "exclude_also =\n    if TYPE_CHECKING:\n"
        )
        self.venv = child_faults.plant(make_venv(root / "venv", with_torch=True))
        measure(self.venv, self.rc)
        self.python = str(self.venv / "bin" / "python")

    def get(self, name: str) -> Run:
        if name not in self.runs:
            self.runs[name] = SCENARIOS[name](self, self.root / name)
        return self.runs[name]

    def env(
        self, scenario: rec.Scenario | None, directory: Path, **faults: str | None
    ) -> dict[str, str]:
        """Arm the venv with the scenario and `faults` (the child inherits no variable of
        ours); the environment of the parent: a PATH whose nvidia-smi is the scenario's."""
        env = scenario.write(directory) if scenario else {}
        path = str(directory / "scenario.json") if scenario else None
        child_faults.arm(self.venv, scenario=path, **faults)
        return env

    def child(
        self,
        directory: Path,
        scenario: rec.Scenario | None,
        options: VerifyOptions,
        *,
        facts: HostFacts | None = None,
        host: RecordedHost | None = None,
        profile: Profile | None = None,
        overrides: dict[str, Any] | None = None,
        python: str | None = None,
        timeout: float = 240,
        visible_devices: str | None = None,
        hang: str | None = None,
        ddp_abort: str | None = None,
    ) -> Run:
        """The child alone, with the config the parent would write (plus `overrides`);
        `visible_devices` is the caller's CUDA_VISIBLE_DEVICES (which the child inherits),
        `hang` and `ddp_abort` are faults armed in the venv (tests/helpers/child_faults.py)."""
        env = self.env(scenario, directory, hang=hang, ddp_abort=ddp_abort)
        if visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices
        config = build_config(options, profile, facts, host)
        # the parent's own lookup, on the PATH the scenario wrote (its stand-in nvidia-smi)
        smi = directory / "bin" / "nvidia-smi"
        config["nvidia_smi"] = str(smi) if scenario and scenario.smi is not None else None
        # never this machine's own /sys: a bus id of a recorded GPU may exist here too
        config["sysfs_root"] = str(host.root.resolve()) if host else str(directory / "no-sysfs")
        if options.device != "cpu":
            config["train"] = dict(SHAPE)
        for key, value in (overrides or {}).items():
            base = config.get(key)
            config[key] = {**base, **value} if isinstance(base, dict) else value
        work = directory / "work"
        work.mkdir(parents=True, exist_ok=True)
        config.update(progress=str(directory / "progress.jsonl"), work_dir=str(work))
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            outcome = run_child(python or self.python, True, config, work, timeout)
        return Run(directory.name, outcome)

    def verify(
        self, directory: Path, scenario: rec.Scenario, options: VerifyOptions, **kw: Any
    ) -> Run:
        """The whole run_verify, the way the command runs it, events recorded."""
        events: list[tuple[str, Any]] = []
        env = self.env(scenario, directory)
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            # the parent looks nvidia-smi up where root looks for programs (SYSTEM_PATH), never
            # in PATH: the scenario's stand-in goes in front of those directories
            smi = [
                p for p in env.get("PATH", "").split(os.pathsep) if Path(p, "nvidia-smi").exists()
            ]
            if smi:
                mp.setattr(process, "SYSTEM_PATH", f"{smi[0]}:{process.SYSTEM_PATH}")
            for shape in list(session.TRAIN_SHAPES):
                if shape[0] == "cuda":
                    mp.setitem(session.TRAIN_SHAPES, shape, dict(SHAPE))
            report = run_verify(
                options, on_event=lambda kind, payload: events.append((kind, payload)), **kw
            )
        outcome = ChildOutcome(report.outcome, 0, None, (), "", report.seconds, 0)
        records = tuple({"kind": "check", **c.to_json()} for c in report.checks)
        outcome = ChildOutcome(outcome.outcome, 0, None, records, "", report.seconds, 0)
        return Run(directory.name, outcome, report, tuple(events))


def measure(venv: Path, rc: Path) -> None:
    """Coverage in every Python of `venv` (the child, its DDP ranks): the child inherits no
    COVERAGE_PROCESS_START, so the .pth names the config itself (coverage's subprocess
    measurement: https://coverage.readthedocs.io/en/latest/subprocess.html)."""
    (site_packages(venv) / "zz_coverage.pth").write_text(
        f"import os; os.environ['COVERAGE_PROCESS_START'] = {str(rc)!r}; "
        "import coverage; coverage.process_startup()\n"
    )


# -- the recorded machines --------------------------------------------------------------------


def recorded(host: str) -> tuple[RecordedHost, HostFacts]:
    h = RecordedHost(HOSTS / host)
    return h, detect_host(h, run_smi=True)


def in_enclosure(
    host_name: str, card: str, driver_cuda: int, branch: int, samples: list[Any]
) -> tuple[RecordedHost, HostFacts, rec.Scenario]:
    """A recorded card in the eGPU slot of a recorded laptop: (host, facts, scenario). No CUDA
    bandwidthTest over Thunderbolt/USB4 exists, so data moves at the tunnel's link rate."""
    host, facts = recorded(host_name)
    egpu = facts.egpu
    assert egpu is not None
    tb_gen = min((d.generation for d in facts.thunderbolt.devices if d.generation), default=None)
    rate = rec.link_rate(egpu.connection, tb_gen, egpu.link.speed_gts, egpu.link.width)
    sc = rec.Scenario(
        title=f"{card} in {host_name}",
        gpus=[rec.gpu(card, address=egpu.pci_address)],
        driver_cuda=driver_cuda,
        h2d_gbps=rate,
        d2h_gbps=rate,
        modelled_bandwidth=f"no CUDA bandwidthTest over {egpu.connection}: the link's rate",
        tflops=rec.tflops(card),
        smi={"buses": [egpu.pci_address], "driver_branch": branch, "samples": samples},
    )
    return host, facts, sc


def tb4_rtx4090(ctx: Scenarios, d: Path) -> Run:
    """An RTX 4090 (deviceQuery, torch.matmul TFLOPS at 8192) in the recorded TB4 laptop."""
    host, facts, sc = in_enclosure(
        "tb4-rtx4090-ubuntu2404", "rtx4090", 12040, 550, [rec.sample("rtx4090")]
    )
    options = VerifyOptions(venv=str(ctx.venv), profile="rtx4090", burn_in_minutes=0.05)
    return ctx.verify(d, sc, options, host=host, facts=facts)


def server_rtx5090(ctx: Scenarios, d: Path) -> Run:
    """An RTX 5090 of an 8-GPU server (deviceQuery; nvbandwidth GB/s; TFLOPS at 4096), no
    recorded link, nvidia-smi absent; its link in sysfs is a symlink out of the tree."""
    v = rec.values()["gpus"]["rtx5090"]
    sysfs = d / "sysfs"
    (sysfs / "sys/bus/pci/devices").mkdir(parents=True)
    (sysfs / "sys/bus/pci/devices/0000:01:00.0").symlink_to("/sys/devices")
    sc = rec.Scenario(
        title="RTX 5090 in a server slot",
        gpus=[rec.gpu("rtx5090", address="0000:01:00.0")],
        driver_cuda=12080,
        h2d_gbps=v["h2d_gbps"],
        d2h_gbps=v["d2h_gbps"],
        tflops=rec.tflops("rtx5090"),
    )
    return ctx.child(
        d, sc, VerifyOptions(quick=True), overrides={"sysfs_root": str(sysfs), "budgets": SHORT}
    )


def usb4_rtx5090(ctx: Scenarios, d: Path) -> Run:
    """The same card in the recorded USB4 dock, against the server run as its reference."""
    ref_run = ctx.get("server-rtx5090")
    host, facts, sc = in_enclosure("usb4-rtx5090-fedora", "rtx5090", 12080, 570, [])
    reference = ThroughputReference(
        name="NVIDIA GeForce RTX 5090",
        pci_ids=("2b85",),
        slot="a server slot (scenario server-rtx5090)",
        steps_per_s={"quick": ref_run.checks["train-throughput"]["value"]["steps_per_s"]},
        torch="2.13.0",
        source="tests/test_verify_cuda.py::server_rtx5090",
    )
    options = VerifyOptions(venv=str(ctx.venv), quick=True, profile="rtx5090")
    return ctx.verify(d, sc, options, host=host, facts=facts, references=(reference,))


def server_rtx4090_ddp(ctx: Scenarios, d: Path) -> Run:
    """Two of the eight RTX 4090 of the recorded server (CUDA_VISIBLE_DEVICES=0,1): NCCL DDP,
    the second card as the target, its idle link from nvidia-smi -q."""
    buses = ["0000:01:00.0", "0000:25:00.0", "0000:41:00.0", "0000:61:00.0"]
    buses += ["0000:81:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    link = rec.values()["gpus"]["rtx4090"]["link"]
    speeds = child._SPEED_BY_GEN
    sysfs = rec.write_sysfs(
        d / "sysfs",
        buses[1],
        {
            "current_link_speed": speeds[link["gen_current_idle"]],
            "current_link_width": link["width_current_idle"],
            "max_link_speed": speeds[link["gen_max"]],
            "max_link_width": link["width_max"],
        },
    )
    rate = rec.link_rate(None, None, speeds[link["gen_current_idle"]], link["width_current_idle"])
    sc = rec.Scenario(
        title="RTX 4090 x8 server",
        gpus=[rec.gpu("rtx4090", address=b) for b in buses],
        driver_cuda=12040,
        h2d_gbps=rate,
        d2h_gbps=rate,
        modelled_bandwidth="no bandwidthTest of this card: the recorded (idle) link's rate",
        tflops=rec.tflops("rtx4090"),
        smi={"buses": buses, "driver_branch": 550, "samples": [rec.sample("rtx4090")]},
    )
    target = {"pci_address": buses[1], "connection": "pcie", "external": False}
    return ctx.child(
        d,
        sc,
        VerifyOptions(quick=True),
        overrides={
            "target": target,
            "sysfs_root": str(sysfs),
            "expect": {"min_link_gen": 4, "h2d_gbps": {}},
            "budgets": {**SHORT, "ddp": 90},
        },
        visible_devices="0,1",
    )


def t4_vm(ctx: Scenarios, d: Path) -> Run:
    """A Tesla T4 (cc 7.5) of a cloud VM: bandwidthTest GB/s, TFLOPS (max row), driver 525
    (nvidia-smi before R535 names the reasons field differently), no recorded sensor values."""
    v = rec.values()["gpus"]["t4"]
    bus = "0000:00:1e.0"  # tests/data/real/nvidia-smi/q-525-tesla-t4-aws.txt
    sc = rec.Scenario(
        title="Tesla T4 VM",
        gpus=[rec.gpu("t4", address=bus)],
        driver_cuda=12000,
        h2d_gbps=v["h2d_gbps"],
        d2h_gbps=v["d2h_gbps"],
        tflops=rec.tflops("t4"),
        smi={"buses": [bus], "driver_branch": 525, "samples": []},
    )
    target = {"pci_address": bus, "connection": "pcie", "external": None}
    return ctx.child(
        d, sc, VerifyOptions(quick=True), overrides={"target": target, "budgets": SHORT}
    )


def strix_x1(ctx: Scenarios, d: Path) -> Run:
    """An RTX 3090 behind the AMD Strix Halo USB4 bridge that trained at 2.5 GT/s x1 (the
    real lspci LnkSta in tests/data/real/connection), nvidia-smi that cannot start."""
    bus = "0000:c4:00.0"
    sysfs = rec.write_sysfs(
        d / "sysfs",
        bus,
        {"current_link_speed": 2.5, "current_link_width": 1},
    )
    sc = rec.Scenario(
        title="RTX 3090 on a x1 USB4 link",
        gpus=[rec.gpu("rtx3090", address=bus)],
        h2d_gbps=rec.link_rate("usb4", None, 2.5, 1),
        d2h_gbps=rec.link_rate("usb4", None, 2.5, 1),
        modelled_bandwidth="the x1 link's rate",
        smi={"buses": [bus], "interpreter": "/nonexistent/python3"},
    )
    target = {"pci_address": bus, "connection": "usb4", "external": True}
    return ctx.child(
        d,
        sc,
        VerifyOptions(quick=True, skip=("matmul", "amp")),
        overrides={
            "target": target,
            "sysfs_root": str(sysfs),
            "budgets": SHORT,
            "expect": {"min_link_width": 4},
        },
    )


def unavailable(ctx: Scenarios, d: Path) -> Run:
    """CUDA does not initialise: torch's real warning and init error."""
    sc = rec.Scenario(
        title="CUDA unknown error",
        gpus=[rec.gpu("rtx3090")],
        available={
            "warning": ERR["cuda_unknown_error_warning"],
            "init_error": ERR["cuda_unknown_error_init"],
        },
    )
    return ctx.child(d, sc, VerifyOptions())


def failing(
    ctx: Scenarios,
    d: Path,
    title: str,
    faults: dict[str, Any],
    options: VerifyOptions,
    **overrides: Any,
) -> Run:
    """The recorded RTX 3090 (two of them for DDP) with scripted faults; its link moves a round
    10 GB/s, a rate none of these runs judges."""
    gpus = [rec.gpu("rtx3090")]
    if faults.get("ddp"):
        gpus.append(rec.gpu("rtx3090", address="0000:42:00.0"))
    sc = rec.Scenario(title=title, gpus=gpus, h2d_gbps=10.0, d2h_gbps=10.0, faults=faults)
    return ctx.child(d, sc, options, overrides={"budgets": SHORT, **overrides})


TRAINING_ONLY = ("bandwidth", "matmul")
DDP_ONLY = ("allocation", "bandwidth", "matmul", "amp")


def faults(ctx: Scenarios, d: Path) -> Run:
    """An allocation, a device-to-host copy and every matmul fail with real CUDA errors."""
    launch = {"error": ERR["unspecified_launch_failure"]}
    spec = {"alloc": {"error": ERR["out_of_memory_4090"]}, "copy_d2h": launch, "matmul": launch}
    options = VerifyOptions(quick=True, skip=("amp",))
    return failing(ctx, d, "failing RTX 3090", spec, options, driver_cuda=None)


def garbage(ctx: Scenarios, d: Path) -> Run:
    """A GPU computing garbage (the loss cannot fall), then slowing down in the burn-in."""
    spec = {
        "conv2d": {"runs": [1], "result": "garbage"},
        "linear": {"runs": [2], "sleep_per_call_s": 0.005},
    }
    options = VerifyOptions(quick=True, burn_in_minutes=0.05, skip=TRAINING_ONLY)
    return failing(ctx, d, "garbage", spec, options, expect={"amp_steps": 40})


def nan(ctx: Scenarios, d: Path) -> Run:
    """NaN from the second convolution on, in the smoke and in the burn-in."""
    spec = {"conv2d": {"after": 1, "result": "nan"}}
    options = VerifyOptions(quick=True, burn_in_minutes=0.02, skip=TRAINING_ONLY)
    return failing(ctx, d, "NaN", spec, options)


def no_autocast(ctx: Scenarios, d: Path) -> Run:
    """autocast has no effect (the logits stay float32): the smoke and the burn-in raise."""
    options = VerifyOptions(quick=True, burn_in_minutes=0.02, skip=TRAINING_ONLY)
    return failing(ctx, d, "autocast broken", {"autocast": "ignored"}, options)


def late_errors(ctx: Scenarios, d: Path) -> Run:
    """The smoke passes; the AMP/FP32 timing run and the throughput runs hit a launch failure."""
    spec = {"conv2d": {"runs": [2, 3], "error": ERR["unspecified_launch_failure"]}}
    return failing(ctx, d, "late errors", spec, VerifyOptions(quick=True, skip=TRAINING_ONLY))


def ddp_error(ctx: Scenarios, d: Path) -> Run:
    spec = {"ddp": {"rank": 1, "error": ERR["unspecified_launch_failure"]}}
    return failing(ctx, d, "rank 1 fails", spec, VerifyOptions(quick=True, skip=DDP_ONLY))


def ddp_hang(ctx: Scenarios, d: Path) -> Run:
    spec = {"ddp": {"rank": "all", "hang": True}}  # every rank: no collective times out
    options = VerifyOptions(quick=True, skip=DDP_ONLY)
    return failing(ctx, d, "both ranks hang", spec, options, budgets={**SHORT, "ddp": 20})


def no_such_index(ctx: Scenarios, d: Path) -> Run:
    sc = rec.Scenario(title="cuda:5 of two", gpus=[rec.gpu("rtx3090"), rec.gpu("rtx4090")])
    return ctx.child(d, sc, VerifyOptions(device="cuda:5"))


def egpu_missing(ctx: Scenarios, d: Path) -> Run:
    """Detection found the eGPU at 0000:0a:00.0; torch sees only the recorded 0000:41:00.0."""
    sc = rec.Scenario(title="the eGPU is not torch's", gpus=[rec.gpu("rtx3090")])
    target = {"pci_address": "0000:0a:00.0", "connection": "thunderbolt", "external": True}
    return ctx.child(d, sc, VerifyOptions(), overrides={"target": target})


def egpu_elsewhere(ctx: Scenarios, d: Path) -> Run:
    """--device cuda: the same mismatch only warns, and the run goes on."""
    sc = rec.Scenario(
        title="--device cuda, other GPU", gpus=[rec.gpu("rtx3090")], h2d_gbps=10.0, d2h_gbps=10.0
    )
    target = {"pci_address": "0000:0a:00.0", "connection": "thunderbolt", "external": True}
    skip = ("allocation", "bandwidth", "matmul", "amp", "ddp")
    return ctx.child(d, sc, VerifyOptions(device="cuda:0", skip=skip), overrides={"target": target})


def no_bus_ids(ctx: Scenarios, d: Path) -> Run:
    """A torch that reports no PCI bus ids (values without the deviceQuery PCI line)."""
    sc = rec.Scenario(
        title="no bus ids",
        gpus=[rec.gpu("t4", pci=False)],
        h2d_gbps=9.7,
        d2h_gbps=11.1,
        smi={"buses": [], "samples": []},
    )
    target = {"pci_address": "0000:00:1e.0", "connection": "pcie", "external": None}
    skip = ("allocation", "bandwidth", "matmul", "amp", "ddp")
    return ctx.child(d, sc, VerifyOptions(quick=True, skip=skip), overrides={"target": target})


def laptop_gpu(ctx: Scenarios, d: Path) -> Run:
    """The target is the laptop's own GPU (detection found no eGPU, only a "Laptop GPU")."""
    sc = rec.Scenario(
        title="a laptop's GPU", gpus=[rec.gpu("rtx3090")], h2d_gbps=10.0, d2h_gbps=10.0
    )
    target = {"pci_address": "0000:41:00.0", "external": False, "laptop_gpu": True}
    skip = ("allocation", "bandwidth", "matmul", "amp", "ddp")
    return ctx.child(d, sc, VerifyOptions(skip=skip), overrides={"target": target})


def cpu_no_bf16(ctx: Scenarios, d: Path) -> Run:
    """The CPU path on a CPU whose torch probes say no native bf16."""
    sc = rec.Scenario(title="CPU without bf16", gpus=[], cpu={"native_bf16": False})
    return ctx.child(d, sc, VerifyOptions(device="cpu", quick=True))


def cpu_full(ctx: Scenarios, d: Path) -> Run:
    """The full CPU path (gloo DDP), with torch's CPU probes failing (the fallbacks)."""
    sc = rec.Scenario(title="CPU, probes fail", gpus=[], cpu={"probes": "raise"})
    return ctx.child(d, sc, VerifyOptions(device="cpu", skip=("matmul",)))


def ddp_abort(at: str) -> Any:
    """The CPU's gloo DDP with rank 1 aborting `at` before or after it has its result."""

    def run(ctx: Scenarios, d: Path) -> Run:
        sc = rec.Scenario(title=f"CPU, rank 1 aborts {at}", gpus=[])
        options = VerifyOptions(device="cpu", skip=("matmul", "amp"))
        return ctx.child(d, sc, options, ddp_abort=at)

    return run


def cpu_only_build(ctx: Scenarios, d: Path) -> Run:
    """No stand-in: this machine's real CPU-only torch, asked for CUDA."""
    _, facts = recorded("tb3-rtx3090-ubuntu2204")
    return ctx.child(d, None, VerifyOptions(), facts=facts)


def no_torch(ctx: Scenarios, d: Path) -> Run:
    """A venv without torch (coverage linked in by hand, so it can still measure)."""
    venv = make_venv(d / "venv", with_torch=False)
    package = Path(coverage.__file__).parent
    (site_packages(venv) / "coverage").symlink_to(package)
    measure(venv, ctx.rc)
    return ctx.child(d, None, VerifyOptions(device="cpu"), python=str(venv / "bin" / "python"))


def hung(ctx: Scenarios, d: Path) -> Run:
    """A step that never returns: killed at the timeout (coverage saves on SIGTERM)."""
    sc = rec.Scenario(title="hang", gpus=[rec.gpu("rtx3090")], h2d_gbps=10.0, d2h_gbps=10.0)
    return ctx.child(
        d,
        sc,
        VerifyOptions(quick=True),
        timeout=12,
        hang="allocation",
    )


def _radeon_scenario(
    title: str, arch_list: list[str]
) -> tuple[RecordedHost, HostFacts, rec.Scenario]:
    """(host, facts, scenario) of the RX 7900 XTX in the recorded OCuLink laptop."""
    host, facts = recorded("oculink-rx7900xtx-debian12")
    (egpu,) = [g for g in facts.gpus if g.vendor == "amd" and g.external]  # facts.egpu: NVIDIA's
    rate = rec.link_rate(egpu.connection, None, egpu.link.speed_gts, egpu.link.width)
    sc = rec.Scenario(
        title=title,
        gpus=[
            rec.radeon("ollama-3158-rx7900xtx-agent.txt", address=egpu.pci_address, memory_gib=24)
        ],
        torch_cuda=None,
        torch_hip="6.4.43482",
        arch_list=arch_list,
        h2d_gbps=rate,
        d2h_gbps=rate,
        modelled_bandwidth="no ROCm bandwidth test recorded over OCuLink: the link's rate",
    )
    return host, facts, sc


def rocm_verify(ctx: Scenarios, d: Path) -> Run:
    """The whole run_verify on the Radeon, as `egpu-setup verify` runs it: its report is what
    the fleet table reads."""
    host, facts, sc = _radeon_scenario("RX 7900 XTX, verify", _rocm_archs("2.8", "rocm6.4"))
    options = VerifyOptions(
        venv=str(ctx.venv), quick=True, skip=("matmul",), profile="rx7900xtx", burn_in_minutes=0.02
    )
    return ctx.verify(d, sc, options, host=host, facts=facts)


def _oculink_radeon(ctx: Scenarios, d: Path, title: str, arch_list: list[str]) -> Run:
    """The RX 7900 XTX of a real rocminfo paste (gfx1100) in the recorded OCuLink laptop's eGPU
    slot, under a ROCm torch (torch.version.hip set, .cuda None) whose wheel lists
    `arch_list`. Bandwidth is the OCuLink link's rate (no recorded ROCm bandwidth test over it);
    no Radeon matmul TFLOPS are recorded, so matmul is skipped, with its reason."""
    host, facts, sc = _radeon_scenario(title, arch_list)
    options = VerifyOptions(quick=True, skip=("matmul",), profile="rx7900xtx")
    return ctx.child(d, sc, options, facts=facts, host=host, overrides={"budgets": SHORT})


def oculink_rx7900xtx(ctx: Scenarios, d: Path) -> Run:
    """torch 2.8.0+rocm6.4, whose wheel has gfx1100 (egpu_setup/data/rocm.yaml)."""
    return _oculink_radeon(
        ctx, d, "RX 7900 XTX over OCuLink, ROCm 6.4", _rocm_archs("2.8", "rocm6.4")
    )


def rocm_wrong_gfx(ctx: Scenarios, d: Path) -> Run:
    """The same card under a wheel built without gfx1100: the arch list a build for CDNA only
    (MI210/MI300X: gfx90a, gfx942) has."""
    return _oculink_radeon(ctx, d, "RX 7900 XTX, a CDNA-only ROCm build", ["gfx90a", "gfx942"])


def _rocm_archs(series: str, variant: str) -> list[str]:
    from egpu_setup.compat.rocm import load_rocm

    row = load_rocm().series(series)
    assert row is not None
    return list(next(v.gfx for v in row.variants if v.name == variant))


SCENARIOS = {
    "oculink-rx7900xtx": oculink_rx7900xtx,
    "rocm-verify": rocm_verify,
    "rocm-wrong-gfx": rocm_wrong_gfx,
    "tb4-rtx4090": tb4_rtx4090,
    "server-rtx5090": server_rtx5090,
    "usb4-rtx5090": usb4_rtx5090,
    "server-rtx4090-ddp": server_rtx4090_ddp,
    "t4-vm": t4_vm,
    "strix-x1": strix_x1,
    "unavailable": unavailable,
    "faults": faults,
    "garbage": garbage,
    "nan": nan,
    "no-autocast": no_autocast,
    "late-errors": late_errors,
    "ddp-error": ddp_error,
    "ddp-hang": ddp_hang,
    "no-such-index": no_such_index,
    "egpu-missing": egpu_missing,
    "egpu-elsewhere": egpu_elsewhere,
    "no-bus-ids": no_bus_ids,
    "laptop-gpu": laptop_gpu,
    "cpu-no-bf16": cpu_no_bf16,
    "cpu-full": cpu_full,
    "ddp-abort-after": ddp_abort("after"),
    "ddp-abort-before": ddp_abort("before"),
    "cpu-only-build": cpu_only_build,
    "no-torch": no_torch,
    "hung": hung,
}


# Every test that asks for `runs` is marked slow: its scenarios are real verify children, torch
# imported and trained in each, DDP ranks in some (about 4 minutes in all on 2 cores).
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    return Scenarios(tmp_path_factory.mktemp("cuda-standin"))


def recorded_tflops(key: str, size: str) -> dict[str, float]:
    return rec.tflops(key)[size]


# -- what the recorded GPUs report through the child -------------------------------------------


@pytest.mark.slow
def test_tb4_rtx4090_reports_the_recorded_card(runs: Scenarios) -> None:
    r = runs.get("tb4-rtx4090")
    report, checks = r.report, r.checks
    assert report.ok, [c.to_json() for c in report.failures]
    card = rec.values()["gpus"]["rtx4090"]
    dev = report.device
    assert (dev["name"], dev["compute_capability"], dev["total_memory"]) == (
        card["name"],
        "8.9",
        card["total_memory_bytes"],
    )
    assert dev["multiprocessors"] == card["multi_processor_count"]
    assert (dev["pci_bus_id"], dev["external"], dev["connection"]) == (
        "0000:0a:00.0",
        True,
        "thunderbolt",
    )
    # the child's own arithmetic (flops / event time) gives the recorded TFLOPS at 8192
    for precision, value in recorded_tflops("rtx4090", "8192").items():
        assert checks[f"matmul-{precision}"]["value"] == pytest.approx(value, rel=1e-3)
        assert checks[f"matmul-{precision}"]["status"] == "pass"
    # over TB4 the tunnel is PCIe 3.0 x4: judged against that link's rate only
    assert checks["pcie-link"]["status"] == "pass"
    assert "thunderbolt carries at most 8 GT/s x4" in checks["pcie-link"]["detail"]
    assert checks["h2d-bandwidth"]["value"] == pytest.approx(3.938, abs=0.002)
    assert "100% of the link's 3.94 GB/s (floor 2 GB/s)" in checks["h2d-bandwidth"]["detail"]
    amp = checks["amp-training"]
    assert amp["status"] == "pass"
    assert "float16 autocast, GradScaler" in amp["detail"]
    assert amp["value"]["loss_last"] <= 0.5 * amp["value"]["loss_first"]  # it really trained
    assert checks["large-allocation"]["status"] == "pass"
    assert checks["gpu-temperature"]["value"] == card["temperature_c"]
    assert checks["gpu-power"]["value"] == card["power_w"]
    assert checks["gpu-throttle"]["status"] == "pass"  # "Idle" is not a slowdown
    assert checks["train-throughput"]["status"] == "info"
    assert "no internal-slot reference" in checks["train-throughput"]["detail"]
    assert {checks["cudnn-benchmark"]["status"], checks["h2d-pinned"]["status"]} == {"info"}
    assert checks["burn-in"]["status"] in ("pass", "warn")
    assert checks["ddp"]["status"] == "skip"
    # the host side came from the recorded laptop: driver, nvidia-smi, the eGPU
    assert checks["driver-loaded"]["status"] == "pass"
    assert checks["device-is-egpu"]["detail"] == (
        "cuda:0 NVIDIA GeForce RTX 4090 is the eGPU at 0000:0a:00.0"
    )


@pytest.mark.slow
def test_a_radeon_under_rocm_is_the_egpu_and_its_gfx_target_is_in_the_wheel(
    runs: Scenarios,
) -> None:
    run = runs.get("oculink-rx7900xtx")
    checks = run.checks
    assert checks["device-is-egpu"]["status"] == "pass", checks["device-is-egpu"]
    assert checks["torch-cuda-build"]["status"] == "pass"
    assert checks["torch-cuda-build"]["detail"] == "built for ROCm (HIP 6.4.43482)"
    assert checks["torch-driver-cuda"]["status"] == "skip"
    assert checks["arch-list"]["status"] == "pass" and checks["arch-list"]["expected"] == "gfx1100"
    assert run.device["name"] == "Radeon RX 7900 XTX"


def test_the_fleet_table_shows_a_rocm_machine_as_a_machine(runs: Scenarios, tmp_path: Path) -> None:
    """`egpu-setup report` on the verify report a ROCm run writes: an ok GPU row with the
    Radeon and its link, never "cpu only"."""
    run = runs.get("rocm-verify")
    data = run.report.to_json()
    assert data["device_kind"] == "cuda"  # torch's device type on ROCm builds too
    folder = tmp_path / "reports" / "lab-amd-01"
    folder.mkdir(parents=True)
    (folder / "verify.json").write_text(json.dumps(data))
    from conftest import run_cli

    done = run_cli("report", "--json", str(tmp_path / "reports"))
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["hosts"]
    # an ok machine: its verify passed the host checks (amdgpu, not "no NVIDIA GPU") too
    assert (row["status"], row["device"], row["failures"]) == ("ok", "cuda", []), row
    assert row["gpu"] == "Radeon RX 7900 XTX", row
    table = run_cli("report", str(tmp_path / "reports"))
    assert "cpu only" not in table.stdout and "Radeon RX 7900 XTX" in table.stdout, table.stdout


def test_a_rocm_wheel_without_the_gfx_target_fails_arch_list(runs: Scenarios) -> None:
    check = runs.get("rocm-wrong-gfx").checks["arch-list"]
    assert check["status"] == "fail"
    assert check["detail"] == "gfx1100 is not among the build's targets (gfx90a, gfx942)"
    assert check["hint"] == (
        "install the torch ROCm build for this gfx target (`egpu-setup resolve` picks one)"
    )


def test_checks_are_streamed_in_report_order(runs: Scenarios) -> None:
    r = runs.get("tb4-rtx4090")
    streamed = [p.id for kind, p in r.events if kind == "check"]
    assert streamed == [c.id for c in r.report.checks]
    steps = [p for kind, p in r.events if kind == "step"]
    assert steps[:4] == ["import", "cuda-init", "identity", "allocation"]
    assert steps[-1] == "done"
    # the device record arrives before the first GPU check, so a table can name the GPU
    order = [p.id if kind == "check" else kind for kind, p in r.events]
    assert order.index("torch-import") < order.index("device") < order.index("arch-list")


@pytest.mark.slow
def test_server_rtx5090_replays_nvbandwidth(runs: Scenarios) -> None:
    checks = runs.get("server-rtx5090").checks
    card = rec.values()["gpus"]["rtx5090"]
    assert checks["h2d-bandwidth"]["value"] == pytest.approx(card["h2d_gbps"], rel=1e-3)
    assert checks["d2h-bandwidth"]["value"] == pytest.approx(card["d2h_gbps"], rel=1e-3)
    for precision, value in recorded_tflops("rtx5090", "4096").items():
        assert checks[f"matmul-{precision}"]["value"] == pytest.approx(value, rel=1e-3)
    # sysfs pointing out of the given tree is not followed; without a link there is no share
    assert checks["pcie-link"]["status"] == "skip"
    assert checks["h2d-bandwidth"]["detail"] == f"{card['h2d_gbps']:.2f} GB/s pinned"
    assert checks["device-is-egpu"]["status"] == "warn"  # no target: which GPU is unknown
    assert checks["gpu-temperature"]["detail"] == "not sampled: nvidia-smi not found"


@pytest.mark.slow
def test_usb4_throughput_is_a_share_of_the_internal_slot(runs: Scenarios) -> None:
    r = runs.get("usb4-rtx5090")
    ref = runs.get("server-rtx5090").checks["train-throughput"]["value"]["steps_per_s"]
    tp = r.checks["train-throughput"]
    assert tp["status"] in ("pass", "warn")
    assert tp["value"]["share"] == pytest.approx(tp["value"]["steps_per_s"] / ref, rel=1e-2)
    assert "(tests/test_verify_cuda.py::server_rtx5090)" in tp["detail"]
    assert tp["expected"]["steps_per_s"] == ref
    assert "usb4 carries at most 8 GT/s x4" in r.checks["pcie-link"]["detail"]
    assert r.report.device["device_id"] == "2b85"
    # no sensor values of this card were recorded: nothing is sampled
    assert r.checks["gpu-temperature"]["detail"].startswith("not sampled: nvidia-smi")


@pytest.mark.slow
def test_two_gpus_run_nccl_ddp_as_gloo(runs: Scenarios) -> None:
    r = runs.get("server-rtx4090-ddp")
    checks = r.checks
    assert checks["ddp"]["status"] == "pass", checks["ddp"]
    assert checks["ddp"]["detail"] == "2 ranks, nccl: all-reduce correct, DDP step ran"
    assert "nccl runs as gloo" in r.outcome.output_tail
    ident = checks["device-is-egpu"]
    assert ident["status"] == "pass"
    assert ident["value"]["index"] == 1
    assert "(a pcie slot, not an eGPU)" in ident["detail"]
    assert "under CUDA_DEVICE_ORDER=PCI_BUS_ID it is cuda:1" in ident["detail"]
    link = checks["pcie-link"]
    assert link["status"] == "warn"  # the recorded idle link is gen 1 of a gen 4 slot
    assert "below the GPU's max 16 GT/s x16" in link["detail"]
    assert "profile expects gen 4+" in link["detail"]
    assert checks["h2d-bandwidth"]["status"] == "pass"  # 100% of that link, no floor
    assert r.device["device_count"] == 2


@pytest.mark.slow
def test_t4_skips_what_turing_lacks(runs: Scenarios) -> None:
    checks = runs.get("t4-vm").checks
    assert checks["matmul-tf32"]["status"] == checks["matmul-bf16"]["status"] == "skip"
    assert checks["matmul-fp32"]["value"] == pytest.approx(4.17, rel=1e-3)  # the `max` row
    assert checks["matmul-fp16"]["value"] == pytest.approx(41.91, rel=1e-3)
    assert checks["h2d-bandwidth"]["value"] == pytest.approx(9.7, rel=1e-3)
    assert checks["d2h-bandwidth"]["value"] == pytest.approx(11.1, rel=1e-3)
    assert checks["torch-driver-cuda"]["status"] == "warn"  # cu128 wheel on a CUDA 12.0 driver
    assert checks["arch-list"]["detail"] == "sm_75 is compiled in"
    # driver 525 rejects clocks_event_reasons; the sampler asks again by the old name
    assert checks["gpu-throttle"]["detail"].startswith("not sampled: nvidia-smi: ")


@pytest.mark.slow
def test_a_x1_link_warns(runs: Scenarios) -> None:
    checks = runs.get("strix-x1").checks
    link = checks["pcie-link"]
    assert link["status"] == "warn"
    assert link["detail"].startswith("PCIe 2.5 GT/s (gen 1) x1")
    assert "profile expects x4+" in link["detail"]
    assert checks["h2d-bandwidth"]["value"] == pytest.approx(0.25, rel=1e-3)
    assert checks["h2d-bandwidth"]["status"] == "fail"  # under half the usb4 floor of 2 GB/s
    assert checks["gpu-temperature"]["detail"].startswith("not sampled: nvidia-smi: ")


# -- failure paths, driven by recorded error texts ---------------------------------------------


@pytest.mark.slow
def test_cuda_that_does_not_initialise(runs: Scenarios) -> None:
    r = runs.get("unavailable")
    fail = r.checks["cuda-available"]
    assert fail["status"] == "fail"
    assert fail["detail"] == (
        "torch.cuda.is_available() is False: " + ERR["cuda_unknown_error_init"]
    )
    assert "device-is-egpu" not in r.checks and r.outcome.finished


@pytest.mark.slow
def test_failing_allocation_copy_and_matmul(runs: Scenarios) -> None:
    checks = runs.get("faults").checks
    assert checks["large-allocation"]["status"] == "fail"
    assert ERR["out_of_memory_4090"] in checks["large-allocation"]["detail"]
    assert checks["h2d-bandwidth"]["status"] == "pass"
    assert checks["d2h-bandwidth"]["detail"].startswith(
        "pinned copy failed: RuntimeError: CUDA error: unspecified launch failure"
    )
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        assert checks[f"matmul-{precision}"]["status"] == "fail"
    # no driver version from detection nor from the driver API: not judged
    assert checks["torch-driver-cuda"]["status"] == "skip"


@pytest.mark.slow
def test_garbage_results_and_a_slowing_gpu(runs: Scenarios) -> None:
    checks = runs.get("garbage").checks
    amp = checks["amp-training"]
    assert amp["status"] == "fail"
    assert amp["hint"] == "the loss did not fall: the GPU computes wrong results or AMP is broken"
    assert "train-throughput" not in checks  # nothing is timed when training is broken
    burn = checks["burn-in"]
    assert burn["status"] == "warn", burn
    assert burn["value"]["slowdown"] > 1.3


@pytest.mark.slow
def test_nan_losses(runs: Scenarios) -> None:
    checks = runs.get("nan").checks
    assert checks["amp-training"]["status"] == "fail"
    assert "inf/NaN losses" in checks["amp-training"]["detail"]
    assert "steps skipped by the scaler" in checks["amp-training"]["detail"]
    assert checks["burn-in"]["status"] == "fail"
    assert checks["burn-in"]["hint"] == "inf/NaN losses under sustained load: the GPU is unstable"


@pytest.mark.slow
def test_autocast_that_does_nothing(runs: Scenarios) -> None:
    checks = runs.get("no-autocast").checks
    assert checks["amp-training"]["detail"] == (
        "AMP training raised RuntimeError: autocast did not run in torch.float16 "
        "(logits are torch.float32)"
    )
    assert checks["burn-in"]["status"] == "fail"


@pytest.mark.slow
def test_errors_after_the_smoke(runs: Scenarios) -> None:
    checks = runs.get("late-errors").checks
    assert checks["amp-training"]["status"] == "pass"
    assert checks["amp-speedup"]["status"] == "fail"
    assert checks["train-throughput"]["status"] == "fail"
    assert "unspecified launch failure" in checks["train-throughput"]["detail"]


@pytest.mark.slow
def test_ddp_rank_failure_and_hang(runs: Scenarios) -> None:
    err = runs.get("ddp-error").checks["ddp"]
    assert err["status"] == "fail"
    assert "unspecified launch failure" in err["detail"]
    hang = runs.get("ddp-hang")
    assert hang.checks["ddp"]["detail"].endswith("the ranks did not finish within 20 s")
    assert hang.outcome.finished  # the child itself ended the ranks and went on


@pytest.mark.slow
def test_a_rank_aborted_in_teardown_passes_one_aborted_before_its_result_fails(
    runs: Scenarios,
) -> None:
    after = runs.get("ddp-abort-after").checks["ddp"]
    assert after["status"] == "pass" and "while the group was torn down" in after["detail"]
    before = runs.get("ddp-abort-before").checks["ddp"]
    assert before["status"] == "fail" and "SIGABRT" in before["detail"]


@pytest.mark.slow
def test_identity_failures(runs: Scenarios) -> None:
    c = runs.get("no-such-index").checks["device-is-egpu"]
    assert (c["status"], c["detail"]) == ("fail", "cuda:5 does not exist (2 devices)")
    c = runs.get("egpu-missing").checks["device-is-egpu"]
    assert c["status"] == "fail"
    assert c["detail"] == "torch sees 0000:41:00.0 but not the eGPU at 0000:0a:00.0"
    r = runs.get("egpu-elsewhere")
    assert r.checks["device-is-egpu"]["status"] == "warn" and "arch-list" in r.checks
    c = runs.get("no-bus-ids").checks["device-is-egpu"]
    assert c["detail"] == (
        "this torch does not report PCI bus ids; cannot confirm cuda:0 is 0000:00:1e.0"
    )
    c = runs.get("laptop-gpu").checks["device-is-egpu"]
    assert c["status"] == "warn" and "(the laptop's own GPU, not an eGPU)" in c["detail"]


@pytest.mark.slow
def test_cpu_paths(runs: Scenarios) -> None:
    checks = runs.get("cpu-no-bf16").checks
    assert "float32 (no native bf16 on this CPU" in checks["amp-training"]["detail"]
    assert checks["amp-training"]["status"] == "pass"
    assert checks["amp-speedup"]["status"] == "info"
    assert "this CPU has no native bf16" in checks["amp-speedup"]["detail"]
    assert {checks["matmul-fp32"]["status"], checks["matmul-bf16"]["status"]} == {"info"}
    full = runs.get("cpu-full")
    assert full.checks["ddp"]["detail"] == "2 ranks, gloo: all-reduce correct, DDP step ran"
    assert full.device["cpu_capability"] is None  # the probe raised
    checks = runs.get("cpu-only-build").checks
    assert checks["torch-cuda-build"]["status"] == "fail"
    assert checks["torch-cuda-build"]["detail"].endswith(
        "is a CPU-only build while this machine has an NVIDIA GPU (0000:0a:00.0)"
    )
    imp = runs.get("no-torch").checks["torch-import"]
    assert imp["status"] == "fail" and "No module named 'torch'" in imp["detail"]


@pytest.mark.slow
def test_a_hung_step_is_killed(runs: Scenarios) -> None:
    r = runs.get("hung")
    assert r.outcome.outcome == "timeout"
    assert "arch-list" in r.checks  # what ran before the hang is kept


# -- the child's pure judges ---------------------------------------------------------------------


def test_pure_judges() -> None:
    """The judges' branches that no recorded GPU reaches (run in this process)."""
    out_text = io.StringIO()
    out = child.Out(None, stream=out_text)
    child.peak_check(out, "gpu-power", [], 450.0, "W", None, "hint", "the GPU reports no power")
    child.peak_check(out, "gpu-temperature", [91.0], 88.0, "°C", "samples", "cool it", "none")
    sampler = child.Sampler(None, 1.0, None)
    child.sampler_checks(out, sampler, {})
    lines = [json.loads(line) for line in out_text.getvalue().splitlines()]
    assert [(r["id"], r["status"]) for r in lines] == [
        ("gpu-power", "skip"),
        ("gpu-temperature", "warn"),
        ("gpu-temperature", "skip"),
        ("gpu-power", "skip"),
        ("gpu-throttle", "skip"),
    ]
    # a ROCm build (torch.version.hip set, torch.version.cuda None: the values of
    # https://github.com/ROCm/legacy-rocm-build/issues/5657's torch 2.9.1+rocm6.4 kind)
    assert child.torch_build(None, "6.4.43482") == "ROCm (HIP 6.4.43482)"
    assert child.torch_build("12.8", None) == "CUDA 12.8"
    assert child.torch_build(None, None) == "CPU-only build"
    gfx = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101"]
    assert child.gfx_covers(gfx, "gfx1100") == ("pass", "gfx1100 is compiled in")
    assert child.gfx_covers(gfx, "gfx90a:sramecc+:xnack-")[0] == "pass"
    assert child.gfx_covers(gfx, "gfx1201") == (
        "fail",
        "gfx1201 is not among the build's targets (" + ", ".join(gfx) + ")",
    )
    assert child.gfx_covers(gfx, None)[0] == "skip"
    # an RX 6700 XT (gfx1031) run as gfx1030 by the override: it works, and says on what
    status, detail = child.gfx_covers(gfx, "gfx1030", "10.3.0")
    assert status == "warn" and "HSA_OVERRIDE_GFX_VERSION=10.3.0 is set" in detail
    assert child.gfx_covers(gfx, "gfx1201", "12.0.1")[0] == "fail"
    assert child.judge_throttle([]) == (
        "skip",
        "the GPU reports no clocks event reasons",
        None,
        None,
    )
    assert child.judge_throttle([0x4])[0] == "pass"  # SW power cap under load is normal
    assert child.judge_throttle([0x4, 0x48])[:3] == (
        "warn",
        "clocks slowed: HW slowdown, HW thermal slowdown",
        ["HW slowdown", "HW thermal slowdown"],
    )
    assert child.parse_sample("71, [N/A], 0x0000000000000048") == {
        "temp": 71.0,
        "power": None,
        "reasons": 0x48,
    }
    assert child.parse_sample("[N/A], [N/A], [N/A]") is None
    assert (child.parse_sample("1, 2, 0xZZ") or {})["reasons"] is None
    assert child.parse_sample("") is None
    assert child.matmul_size_for(0.7e9, 0.1) == 320  # a CPU emulating bf16: a small product
    # the parent's progress log as the child reads it: a line that is not JSON (torn by a
    # power loss, or another run's) is passed over, not taken for the step
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "progress.jsonl"
        log.write_text('{"event": "step", "pid": 7, "se\n{"event": "step", "pid": 7, "seq": 1}\n')
        assert child.logged(str(log), 7, 1, 0.0) is True
        assert child.logged(str(log), 7, 2, 0.0) is False  # not there: no wait past wait_s
    assert child.matmul_size_for(1e15, 1.0) == 1024
    assert (
        child.judge_link({"speed_gts": 16.0, "width": 16}, None, None, {"min_link_width": 32})[0]
        == "warn"
    )
    assert child.compare_cuda("12.8", "x") == (
        "skip",
        "cannot compare CUDA '12.8' with driver CUDA 'x'",
    )
    assert child.compare_cuda("13.0", "12.8")[0] == "fail"
    assert child.arch_covers(["sm_80", "compute_80", "junk"], (9, 0))[0] == "warn"
    assert child.normalize_bus_id("not-a-bus") == "not-a-bus"
    assert child._median([3.0, 1.0]) == 2.0
    assert child.throttle_names(0x80) == ["HW power brake"]
    assert child.pcie_rate_gbs(None, 4) is None
    assert child.tunnel_cap("thunderbolt", 5) == (16.0, 4)  # TB5 tunnels PCIe 4.0 x4
    assert child.normalize_bus_id("00000000:3C:00.0") == "0000:3c:00.0"
    assert child.compare_cuda(None, "12.4")[0] == "fail"
    assert child.arch_covers(["sm_90a"], (9, 0))[0] == "pass"
    assert child.arch_covers(["sm_50"], (8, 9))[0] == "fail"
    assert child.arch_covers(["sm_90a", "compute_90"], (8, 9))[0] == "fail"  # neither runs 8.9
    child.Out(None, stream=out_text).step("import")  # no progress file: the record only
    assert json.loads(out_text.getvalue().splitlines()[-1]) == {
        "kind": "step", "step": "import", "pid": os.getpid(), "seq": 1,
    }  # fmt: skip
    assert child.judge_ratio(10.0, 82.6, 0.25, 0.5) == "fail"
    assert child.judge_ratio(40.0, 82.6, 0.25, 0.5) == "warn"
    assert child.read_link(None) == {}
    no_probes = cast("child.Torch", object())  # a torch without the probes: /proc/cpuinfo
    assert child.cpu_native_bf16(no_probes) in (True, False, None)


REPORTS = sorted((REPO / "docs" / "reports").glob("verify-*.json"))


@pytest.mark.slow
@pytest.mark.gpu  # the output of a real GPU: none here until one is committed
@pytest.mark.skipif(not REPORTS, reason="no verify report of a real GPU is committed yet")
@pytest.mark.parametrize("path", REPORTS, ids=[p.name for p in REPORTS])
def test_a_committed_report_replays(runs: Scenarios, path: Path) -> None:
    """Each report of a real GPU under docs/reports/ runs again through the child, on the
    stand-in: the child's arithmetic gives back the GB/s and TFLOPS that GPU measured."""
    report = json.loads(path.read_text())
    sc = rec.from_report(report, path.name)
    options = VerifyOptions(quick=report["options"]["quick"], skip=("amp", "ddp"))
    checks = runs.child(runs.root / path.stem, sc, options, overrides={"budgets": SHORT}).checks
    measured = {c["id"]: c for c in report["checks"]}
    for cid in ("h2d-bandwidth", "d2h-bandwidth", "matmul-fp32", "matmul-fp16", "matmul-bf16"):
        if measured.get(cid, {}).get("status") not in (None, "skip", "fail"):
            assert checks[cid]["value"] == pytest.approx(measured[cid]["value"], rel=1e-2), cid


def test_from_report_makes_a_scenario() -> None:
    """A verify report of a real GPU (a real run commits one) becomes a stand-in scenario."""
    report = {
        "device": {
            "name": "NVIDIA H200",
            "compute_capability": "9.0",
            "multiprocessors": 132,
            "total_memory": 150_000_000_000,
            "pci_bus_id": "0000:18:00.0",
            "torch_cuda": "12.8",
            "driver_cuda": "12.8",
            "arch_list": rec.arch_list("2.11.0+cu128"),
        },
        "options": {"quick": True},
        "checks": [
            {"id": "h2d-bandwidth", "status": "pass", "value": 50.0},
            {"id": "matmul-fp32", "status": "pass", "value": 51.0},
            {"id": "gpu-temperature", "status": "pass", "value": 40.0},
        ],
    }
    sc = rec.from_report(report, "shape")
    assert sc.gpus[0]["pci"] == {"domain": 0, "bus": 0x18, "device": 0}
    assert (sc.driver_cuda, sc.tflops) == (12080, {"4096": {"fp32": 51.0}})
    assert sc.smi is not None and sc.smi["samples"][0]["temperature_c"] == 40.0


# -- the gate ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_line_of_the_child_runs(runs: Scenarios, capsys: pytest.CaptureFixture[str]) -> None:
    """Every scenario together executes every line of _child.py but those in UNEXECUTED; a
    typo in a CUDA-only line therefore fails a test above, and an unexecuted new line fails
    here."""
    for name in SCENARIOS:
        runs.get(name)
    here = coverage.Coverage(config_file=str(runs.rc), data_suffix="pytest")
    here.start()
    try:
        test_pure_judges()
    finally:
        here.stop()
        here.save()
    cov = coverage.Coverage(config_file=str(runs.rc))
    cov.combine(data_paths=[str(runs.cov_dir)])
    _, statements, _, missing, _ = cov.analysis2(str(CHILD))
    report = io.StringIO()
    percent = cov.report(morfs=[str(CHILD)], file=report, show_missing=True)
    source = CHILD.read_text().splitlines()
    missed = sorted(source[n - 1].strip() for n in missing)
    with capsys.disabled():
        print(f"\n_child.py: {len(statements) - len(missing)}/{len(statements)} lines, "
              f"{percent:.1f}% with branches\n{report.getvalue()}")  # fmt: skip
    assert missed == sorted(UNEXECUTED), "\n".join(
        f"line {n}: {source[n - 1].strip()}" for n in missing
    )
