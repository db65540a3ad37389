"""Scenarios for the CUDA stand-in, built from recorded real values of real GPUs.

The values come from tests/data/real/cuda/values.yaml (each with its source there), or from a
verify report of a real GPU run (docs/reports/verify-*.json, `from_report`); error texts from
tests/helpers/cuda_errors.yaml. A Scenario is written as the JSON the stand-in replays
(tests/helpers/cuda_standin.py), the spec of the nvidia-smi replay and its wrapper on PATH.

Where no recording of a value exists, the scenario says so instead of guessing: a card without a
recorded bandwidthTest moves data at the theoretical rate of the link it sits on
(`modelled_bandwidth`), and a precision without a recorded TFLOPS has none (its matmul fails).
No CUDA bandwidthTest of a GPU over Thunderbolt, USB4 or OCuLink was found (values.yaml), so an
eGPU scenario is judged against its link's rate only.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from egpu_setup.verify._child import pcie_rate_gbs, tunnel_cap

HELPERS = Path(__file__).resolve().parent
REAL = HELPERS.parent / "data" / "real" / "cuda"
STANDIN = HELPERS / "cuda_standin.py"
SMI_REPLAY = HELPERS / "nvidia_smi_replay.py"


@lru_cache(maxsize=1)
def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REAL / "values.yaml").read_text())
    return loaded


@lru_cache(maxsize=1)
def errors() -> dict[str, str]:
    data = yaml.safe_load((HELPERS / "cuda_errors.yaml").read_text())
    return {key: entry["text"] for key, entry in data.items()}


def arch_list(torch_build: str) -> list[str]:
    """torch.cuda.get_arch_list() of a real wheel (values.yaml `arch_lists`)."""
    return next(a["arch_list"] for a in values()["arch_lists"] if a["torch"] == torch_build)


def pci_of(address: str) -> dict[str, int]:
    """ "0000:0a:00.0" -> torch's pci_domain_id / pci_bus_id / pci_device_id."""
    dom, bus, rest = address.split(":")
    return {"domain": int(dom, 16), "bus": int(bus, 16), "device": int(rest.split(".")[0], 16)}


def gpu(key: str, *, address: str | None = None, pci: bool = True) -> dict[str, Any]:
    """One GPU as torch.cuda reports it, from the recorded card `key` (deviceQuery values);
    `address` puts it at another bus address (the slot of a recorded host); pci=False: no bus."""
    v = values()["gpus"][key]
    where = pci_of(address) if address else v.get("torch_pci")
    return {
        "name": v["name"],
        "major": v["major"],
        "minor": v["minor"],
        "multi_processor_count": v["multi_processor_count"],
        "total_memory": v["total_memory_bytes"],
        "pci": where if pci else None,
        "source": v["source"],
    }


def radeon(paste: str, *, address: str, memory_gib: int) -> dict[str, Any]:
    """The GPU agent of a real rocminfo paste (tests/data/real/rocminfo/, read by the real
    parser) as a ROCm torch reports it: gcnArchName the agent's gfx target, major.minor its
    GC version (gfx1100 -> 11.0, as HIP's hipDeviceProp_t gives them), the compute units, the
    memory its card has, placed at `address` (the eGPU slot of a recorded host)."""
    from egpu_setup.detect.rocm import parse_rocminfo

    path = Path(__file__).parents[1] / "data" / "real" / "rocminfo" / paste
    text = path.read_text()
    (agent,) = parse_rocminfo(text).gpus
    gc = agent.name.removeprefix("gfx")
    return {
        "name": agent.marketing_name,
        "major": int(gc[:-2]),
        "minor": int(gc[-2], 16),
        "multi_processor_count": agent.compute_units,
        "total_memory": memory_gib << 30,
        "pci": pci_of(address),
        "gcn_arch": agent.name,
        "source": text.splitlines()[0],
    }


def tflops(key: str) -> dict[str, dict[str, float]]:
    """The recorded torch.matmul TFLOPS of card `key` by size (the child uses 4096 with --quick,
    8192 without), and the best over sizes as `max`."""
    t = values()["gpus"][key]["tflops"] or {}
    rows = {"4096": t.get("at_4096"), "8192": t.get("at_8192"), "max": t.get("max")}
    return {size: {k: v for k, v in row.items() if v} for size, row in rows.items() if row}


def sample(key: str, load: str | None = None) -> dict[str, Any]:
    """A recorded nvidia-smi sample of card `key` (idle), or its `load` entry (a sample under
    load, e.g. `as_egpu_over_thunderbolt3`)."""
    v = values()["gpus"][key]
    if load is None:
        return {
            "temperature_c": v.get("temperature_c"),
            "power_w": v.get("power_w"),
            "reasons_active": v.get("clocks_event_reasons_active"),
        }
    # "index, util, mem used, mem total, power, temp" rows; the card is the one whose memory
    # total matches its recorded nvidia-smi total
    total = v["nvidia_smi_fb_mib"]["total"]
    for row in v[load]["load_gpu_state_rows"]:
        cells = [c.strip() for c in row.split(",")]
        if cells[3] == f"{total} MiB":
            return {
                "temperature_c": int(cells[5]),
                "power_w": float(cells[4].split()[0]),
                "reasons_active": None,  # not printed in that thread
            }
    raise KeyError(f"{key}: no load row for {total} MiB")


def link_rate(
    connection: str | None, tb_generation: int | None, speed: float | None, width: int | None
) -> float:
    """The theoretical one-direction GB/s of the path: the slot's link, capped by a tunnel."""
    assert speed is not None and width is not None, "a recorded link has a speed and a width"
    cap = tunnel_cap(connection, tb_generation)
    if cap:
        speed, width = min(speed, cap[0]), min(width, cap[1])
    rate = pcie_rate_gbs(speed, width)
    assert rate is not None  # None only for an unknown speed or width
    return rate


@dataclass
class Scenario:
    title: str
    gpus: list[dict[str, Any]]
    torch_cuda: str | None = "12.8"
    torch_hip: str | None = None  # a ROCm build's torch.version.hip (torch_cuda None then)
    driver_cuda: int | None = None  # torch._C._cuda_getDriverVersion(), e.g. 12040
    arch_list: list[str] = field(default_factory=lambda: arch_list("2.11.0+cu128"))
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    modelled_bandwidth: str | None = None  # why the rate is the link's, when it is
    tflops: dict[str, dict[str, float]] = field(default_factory=dict)
    available: Any = True  # True, or {"warning", "init_error"}: CUDA does not initialise
    faults: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, Any] = field(default_factory=dict)  # CPU-side fakes (no native bf16 ...)
    smi: dict[str, Any] | None = None  # None: no nvidia-smi on PATH
    sources: list[str] = field(default_factory=list)

    def write(self, directory: Path) -> dict[str, str]:
        """Write the scenario (`directory`/scenario.json, for tests/helpers/child_faults.py to
        arm the target venv with), the nvidia-smi spec and wrapper; returns the parent's
        environment that selects them: a PATH whose nvidia-smi is the wrapper (the parent finds
        it there and hands the child its absolute path; the child inherits no PATH of ours)."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "scenario.json").write_text(json.dumps(asdict(self), indent=1))
        env: dict[str, str] = {}
        bin_dir = directory / "bin"
        bin_dir.mkdir(exist_ok=True)
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
        path = [p for p in path if not (Path(p) / "nvidia-smi").exists()]  # never a real one
        if self.smi is not None:
            spec = {"no_devices": errors()["no_devices_found"]}
            spec["invalid_field"] = errors()["invalid_field"]
            spec.update(self.smi)
            (directory / "smi.json").write_text(json.dumps(spec, indent=1))
            interpreter = spec.get("interpreter") or sys.executable
            wrapper = bin_dir / "nvidia-smi"
            wrapper.write_text(
                f"#!{interpreter}\nimport os, runpy\n"
                f"os.environ['EGPU_SETUP_TEST_SMI'] = {str(directory / 'smi.json')!r}\n"
                f'runpy.run_path("{SMI_REPLAY}", run_name="__main__")\n'
            )
            wrapper.chmod(0o755)
            env["EGPU_SETUP_TEST_SMI"] = str(directory / "smi.json")
            path.insert(0, str(bin_dir))
        env["PATH"] = os.pathsep.join(path)
        return env


def write_sysfs(root: Path, address: str, link: dict[str, Any]) -> Path:
    """A sysfs tree with the GPU's link attributes as the kernel words them ("16.0 GT/s PCIe",
    drivers/pci/pci-sysfs.c); returns `root`."""
    dev = root / "sys/bus/pci/devices" / address
    dev.mkdir(parents=True, exist_ok=True)
    for key, val in link.items():
        if val is not None:
            text = f"{val:.1f} GT/s PCIe" if key.endswith("speed") else str(val)
            (dev / key).write_text(text + "\n")
    return root


def from_report(report: dict[str, Any], title: str) -> Scenario:
    """The scenario a verify report of a real GPU gives: its device record, its measured
    bandwidth, TFLOPS and sensor peaks (a real H200 report drops in here)."""
    dev = report["device"]
    checks = {c["id"]: c for c in report["checks"]}
    major, minor = (int(x) for x in dev["compute_capability"].split("."))
    card = {
        "name": dev["name"],
        "major": major,
        "minor": minor,
        "multi_processor_count": dev["multiprocessors"],
        "total_memory": dev["total_memory"],
        "pci": pci_of(dev["pci_bus_id"]) if dev.get("pci_bus_id") else None,
        "mem_get_info": dev.get("mem_get_info"),
        "source": title,
    }
    size = "4096" if report["options"]["quick"] else "8192"
    rates = {
        cid.split("-")[1]: checks[cid]["value"]
        for cid in ("matmul-fp32", "matmul-tf32", "matmul-fp16", "matmul-bf16")
        if cid in checks and checks[cid]["status"] != "skip" and checks[cid]["value"]
    }

    def value(cid: str) -> Any:
        return (checks.get(cid) or {}).get("value")

    driver = dev.get("driver_cuda")
    return Scenario(
        title=title,
        gpus=[card],
        torch_cuda=dev["torch_cuda"],
        driver_cuda=int(driver.split(".")[0]) * 1000 + int(driver.split(".")[1]) * 10
        if driver
        else None,
        arch_list=dev["arch_list"],
        h2d_gbps=value("h2d-bandwidth"),
        d2h_gbps=value("d2h-bandwidth"),
        tflops={size: rates},
        smi={
            "buses": [dev["pci_bus_id"]],
            "samples": [
                {
                    "temperature_c": value("gpu-temperature"),
                    "power_w": value("gpu-power"),
                    "reasons_active": [],
                }
            ],
        },
        sources=[title],
    )
