"""AMD's own tools, read: `rocminfo`, `rocm-smi` and `amd-smi`.

Pure `parse_*` functions over the text each tool prints (or a user pasted), and thin `probe_*`
functions that fetch that text through the host. Soft: what a paste does not show is None.

Formats, from the tools' documentation and what users pasted (tests/data/real/rocminfo,
rocm-smi, amd-smi):

- rocminfo (https://github.com/ROCm/rocminfo, docs/how-to/use-rocminfo.rst): "Agent N" blocks of
  `Key: value` lines; `Name: gfx1100` and `Device Type: GPU` for a GPU, `Chip ID: 29772(0x744c)`
  (the PCI device id), `BDFID: 2304` ((bus << 8) | (device << 3) | function, the KFD
  location_id). When /dev/kfd cannot be opened it prints `Unable to open /dev/kfd read-write:
  <strerror>` and stops.
- rocm-smi (https://github.com/ROCm/rocm_smi_lib, python_smi_tools/rocm_smi.py): the concise
  table (`GPU  Temp  AvgPwr ... VRAM%  GPU%`), `-a` / `--showallinfo` lines `GPU[0] : key:
  value`, and `--json` (`"cardN": {"Temperature (Sensor edge) (C)": "31.0", ...}`).
- amd-smi (https://github.com/ROCm/amdsmi, docs/how-to/amdsmi-cli-tool.md): `GPU: N` blocks of
  indented `KEY: value` lines (`static`, `list`, `metric`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from egpu_setup.host.machine import Host

# rocminfo and the SMIs are HSA / SMI library clients: a GPU that stopped answering can hang
# them as it hangs nvidia-smi, so they get the same deadline.
ROCM_TOOL_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class RocmAgent:
    """One HSA agent rocminfo lists (a CPU or a GPU)."""

    name: str  # "gfx1100" for a GPU, the CPU's name for a CPU
    marketing_name: str | None  # "Radeon RX 7900 XTX"
    device_type: str | None  # "GPU" / "CPU"
    node: int | None  # the KFD topology node
    device_id: str | None  # "744c" (Chip ID), None for a CPU (0)
    bdf: str | None  # "09:00.0" from BDFID (rocminfo prints no PCI domain)
    compute_units: int | None


@dataclass(frozen=True)
class RocminfoReport:
    kfd_loaded: bool | None  # "ROCk module is loaded"; None when the paste does not say
    kfd_error: str | None  # "Permission denied" from "Unable to open /dev/kfd read-write: ..."
    user: str | None  # "igor" from "igor is member of render group"
    agents: tuple[RocmAgent, ...]

    @property
    def gpus(self) -> tuple[RocmAgent, ...]:
        return tuple(a for a in self.agents if a.device_type == "GPU")


@dataclass(frozen=True)
class AmdGpuReading:
    """One GPU as rocm-smi or amd-smi printed it; what the output does not show is None."""

    index: int
    name: str | None = None  # "AMD Instinct MI350X", rocm-smi's "Device Name"
    device_id: str | None = None  # "75a0"
    pci_address: str | None = None  # "0000:05:00.0"
    gfx: str | None = None  # amd-smi TARGET_GRAPHICS_VERSION
    compute_units: int | None = None
    temperature_c: float | None = None  # the edge sensor
    power_w: float | None = None
    vram_percent: float | None = None
    gpu_percent: float | None = None
    temperature_junction_c: float | None = None  # "junction" (rocm-smi) / "hotspot" (amd-smi)
    temperature_memory_c: float | None = None  # the VRAM sensor: "mem" / "MEM"
    # the slowdown limits amd-smi static prints under LIMIT (the card's own, from its firmware)
    temperature_limit_c: float | None = None  # SLOWDOWN_EDGE_TEMPERATURE
    temperature_junction_limit_c: float | None = None  # SLOWDOWN_HOTSPOT_TEMPERATURE
    temperature_memory_limit_c: float | None = None  # SLOWDOWN_VRAM / _MEM_TEMPERATURE
    power_cap_w: float | None = None  # rocm-smi PwrCap; amd-smi LIMIT SOCKET_POWER
    link_width: int | None = None  # the PCIe link as trained now
    link_speed_gts: float | None = None
    max_link_width: int | None = None  # amd-smi static BUS MAX_PCIE_WIDTH / _SPEED
    max_link_speed_gts: float | None = None
    vram_total_mib: float | None = None
    vram_used_mib: float | None = None


_KV = re.compile(r"^\s*([^:]+?):\s*(.*?)\s*$")
_KFD_ERROR = re.compile(r"Unable to open /dev/kfd read-write: (?P<err>[^\n`]+?)\s*$", re.M)
_MEMBER = re.compile(r"^(?P<user>\S+) is member of \S+ group", re.M)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _int(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _number(text: str | None) -> float | None:
    """The first number in a cell ("24.0c", "3.0W", "20 W", "13.73%"); None for N/A."""
    m = _NUMBER.search(text or "")
    return float(m.group(0)) if m else None


def _device_id(text: str | None) -> str | None:
    """ "29772(0x744c)" or "0x744C" -> "744c"; None for 0 (a CPU) or nothing."""
    m = re.search(r"0x([0-9a-fA-F]{1,4})\b", text or "")
    if m:
        value = m.group(1).lower().rjust(4, "0")
        return None if value == "0000" else value
    return None


def bdf_of(bdfid: int) -> str:
    """rocminfo's BDFID ((bus << 8) | (device << 3) | function) -> "09:00.0"."""
    return f"{(bdfid >> 8) & 0xFF:02x}:{(bdfid >> 3) & 0x1F:02x}.{bdfid & 0x7}"


def parse_rocminfo(text: str) -> RocminfoReport:
    """Pure: rocminfo's agents, or the reason it could not open /dev/kfd."""
    loaded: bool | None = True if "ROCk module" in text and "is loaded" in text else None
    if "ROCk module is NOT loaded" in text:
        loaded = False
    err = _KFD_ERROR.search(text)
    member = _MEMBER.search(text)
    agents: list[RocmAgent] = []
    block: dict[str, str] | None = None
    for line in text.splitlines():
        if re.fullmatch(r"\s*Agent \d+\s*", line):
            if block is not None:
                agents.append(_agent(block))
            block = {}
            continue
        if block is None:
            continue
        m = _KV.match(line)
        # only the agent's own lines (two spaces in): pool and ISA sections repeat "Name:"
        if m and line.startswith("  ") and not line.startswith("   "):
            block.setdefault(m.group(1), m.group(2))
    if block is not None:
        agents.append(_agent(block))
    return RocminfoReport(
        loaded,
        err.group("err").strip() if err else None,
        member.group("user") if member else None,
        tuple(agents),
    )


def _agent(block: dict[str, str]) -> RocmAgent:
    bdfid = _int(block.get("BDFID"))
    kind = block.get("Device Type") or None
    return RocmAgent(
        name=block.get("Name", ""),
        marketing_name=block.get("Marketing Name") or None,
        device_type=kind,
        node=_int(block.get("Node")),
        device_id=_device_id(block.get("Chip ID")),
        bdf=bdf_of(bdfid) if bdfid and kind == "GPU" else None,
        compute_units=_int(block.get("Compute Unit")),
    )


# rocm-smi's concise table: header words -> field (older versions name the columns without the
# sensor, newer ones "Temp (DieEdge)"; the power column is AvgPwr or, from ROCm 6, "Power").
_TABLE_COLUMNS = {"AvgPwr": "power_w", "Power": "power_w", "VRAM%": "vram_percent"}
_TABLE_COLUMNS |= {"GPU%": "gpu_percent", "PwrCap": "power_cap_w"}
# `-a` / --showallinfo and --json keys -> field
_SMI_KEYS = {
    "Device Name": "name",
    "Card series": "name",
    "Card Series": "name",
    "GPU ID": "device_id",
    "Device ID": "device_id",
    "PCI Bus": "pci_address",
    "Temperature (Sensor edge) (C)": "temperature_c",
    "Average Graphics Package Power (W)": "power_w",
    "Current Socket Graphics Package Power (W)": "power_w",
    "GPU Memory Allocated (VRAM%)": "vram_percent",
    "GPU use (%)": "gpu_percent",
    "Temperature (Sensor junction) (C)": "temperature_junction_c",
    "Temperature (Sensor mem) (C)": "temperature_memory_c",
    "Max Graphics Package Power (W)": "power_cap_w",
    # --showmetrics (the GPU's metrics table, amdgpu's gpu_metrics): speed in units of 0.1 GT/s
    "temperature_edge (C)": "temperature_c",
    "temperature_hotspot (C)": "temperature_junction_c",
    "temperature_mem (C)": "temperature_memory_c",
    "average_socket_power (W)": "power_w",
    "pcie_link_width (Lanes)": "link_width",
    "pcie_link_speed (0.1 GT/s)": "link_speed_gts",
}


def parse_rocm_smi(text: str) -> tuple[AmdGpuReading, ...]:
    """Pure: the GPUs of rocm-smi's table, its `-a` lines or its --json (a cut JSON too)."""
    gpus: dict[int, AmdGpuReading] = {}
    _rocm_smi_table(text, gpus)
    for m in re.finditer(r"^\s*GPU\[(\d+)\]\s*:\s*([^:\n]+?):\s*(.*?)\s*$", text, re.M):
        _set(gpus, int(m.group(1)), m.group(2).strip(), m.group(3))
    index = None
    for line in text.splitlines():
        card = re.match(r'\s*"card(\d+)"\s*:\s*\{', line)
        if card:
            index = int(card.group(1))
            continue
        pair = re.match(r'\s*"([^"]+)"\s*:\s*"([^"]*)"', line)
        if pair and index is not None:
            _set(gpus, index, pair.group(1), pair.group(2))
    return tuple(gpus[i] for i in sorted(gpus))


def _rocm_smi_table(text: str, gpus: dict[int, AmdGpuReading]) -> None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        words = line.lstrip("> ").split()
        if words[:1] != ["GPU"] or not any(w.startswith("Temp") for w in words):
            continue
        # "Temp (DieEdge)" and "SCLK OD" are one column of two words each
        header: list[str] = []
        for w in words:
            if header and (w.startswith("(") or w == "OD"):
                header[-1] += f" {w}"
                continue
            header.append(w)
        for row in lines[i + 1 :]:
            cells = row.lstrip("> ").split()
            if not cells or not cells[0].isdigit():
                break
            values = _row_cells(header, cells)
            reading = gpus.get(int(cells[0]), AmdGpuReading(int(cells[0])))
            for column, value in values.items():
                field = "temperature_c" if column.startswith("Temp") else _TABLE_COLUMNS.get(column)
                if field:
                    reading = _with(reading, field, value)
            gpus[reading.index] = reading


def _row_cells(header: list[str], cells: list[str]) -> dict[str, str]:
    if len(cells) == len(header):
        return dict(zip(header, cells, strict=True))
    # more cells than columns: a cell with a space in it (an old PCLK cell, "5.0GB, x16"), so
    # GPU, Temp and AvgPwr are read from the left and the rest from the right
    n = len(header)
    out = {}
    for k in range(n):
        out[header[k]] = cells[k] if k < 3 else cells[len(cells) - (n - k)]
    return out


def _with(reading: AmdGpuReading, field: str, value: str, unit: str = "") -> AmdGpuReading:
    """`reading` with one field set from a cell's text (N/A: None); `unit` is the key's own
    ("0.1 GT/s" in rocm-smi's `pcie_link_speed (0.1 GT/s)`)."""
    clean = value.strip()
    parsed: str | int | float | None
    if clean in ("", "N/A"):
        parsed = None
    elif field in ("name", "gfx"):
        parsed = clean
    elif field == "pci_address":
        parsed = clean.lower()
    elif field == "device_id":
        parsed = _device_id(clean)
    elif field in ("compute_units", "link_width", "max_link_width"):
        parsed = _int(clean)
    else:
        parsed = _number(clean)
        if parsed is not None and "0.1 GT/s" in unit:
            parsed = parsed / 10
        elif parsed is not None and field.startswith("vram_") and re.search(r"\bGB\b", clean):
            parsed = parsed * 1024
    return replace(reading, **{field: parsed})  # type: ignore[arg-type]


def _set(gpus: dict[int, AmdGpuReading], index: int, key: str, value: str) -> None:
    field = _SMI_KEYS.get(key)
    if field is None:
        return
    reading = gpus.get(index, AmdGpuReading(index))
    gpus[index] = _with(reading, field, value, key)


# amd-smi: (section, key) -> field; a key read wherever it stands when the section is None.
_AMD_SMI_KEYS = {
    ("ASIC", "MARKET_NAME"): "name",
    ("ASIC", "DEVICE_ID"): "device_id",
    ("ASIC", "TARGET_GRAPHICS_VERSION"): "gfx",
    ("ASIC", "NUM_COMPUTE_UNITS"): "compute_units",
    (None, "BDF"): "pci_address",
    ("POWER", "SOCKET_POWER"): "power_w",
    ("TEMPERATURE", "EDGE"): "temperature_c",
    ("TEMPERATURE", "HOTSPOT"): "temperature_junction_c",
    ("TEMPERATURE", "MEM"): "temperature_memory_c",
    ("USAGE", "GFX_ACTIVITY"): "gpu_percent",
    ("BUS", "MAX_PCIE_WIDTH"): "max_link_width",
    ("BUS", "MAX_PCIE_SPEED"): "max_link_speed_gts",
    ("PCIE", "WIDTH"): "link_width",
    ("PCIE", "SPEED"): "link_speed_gts",
    ("LIMIT", "SOCKET_POWER"): "power_cap_w",
    ("LIMIT", "SLOWDOWN_EDGE_TEMPERATURE"): "temperature_limit_c",
    ("LIMIT", "SLOWDOWN_HOTSPOT_TEMPERATURE"): "temperature_junction_limit_c",
    ("LIMIT", "SLOWDOWN_VRAM_TEMPERATURE"): "temperature_memory_limit_c",
    ("LIMIT", "SLOWDOWN_MEM_TEMPERATURE"): "temperature_memory_limit_c",
    ("VRAM", "SIZE"): "vram_total_mib",
    ("MEM_USAGE", "TOTAL_VRAM"): "vram_total_mib",
    ("MEM_USAGE", "USED_VRAM"): "vram_used_mib",
}
# amd-smi with no subcommand: a box-drawn table, two lines per GPU (its BDF, name, temperature
# and power, then its index, activity and VRAM used/total), as https://github.com/ROCm/amdsmi
# prints it since 26.x (tests/data/real/amd-smi/).
_AMD_SMI_ROW1 = re.compile(
    r"^\|\s*(?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)\s+(?P<name>.*?)\s*\|"
    r"\s*\S+\s+(?P<temp>N/A|\d+(?:\.\d+)?\s*°C)\s+\S+\s+(?P<power>N/A|\d+(?:\.\d+)?\s*W)\s*\|"
)
_AMD_SMI_ROW2 = re.compile(r"^\|\s*(?P<index>\d+)\s.*\|.*?(?P<used>\d+)/(?P<total>\d+)\s*MB\s*\|")


def parse_amd_smi(text: str) -> tuple[AmdGpuReading, ...]:
    """Pure: the GPUs of `amd-smi static`, `list` or `metric` (their plain-text form)."""
    gpus: dict[int, AmdGpuReading] = {}
    _amd_smi_table(text, gpus)
    index: int | None = None
    sections: list[tuple[int, str]] = []  # (indent, name) of the open sections
    for line in text.splitlines():
        top = re.match(r"GPU: (\d+)\s*$", line)
        if top:
            index = int(top.group(1))
            gpus.setdefault(index, AmdGpuReading(index))
            sections = []
            continue
        m = _KV.match(line)
        if index is None or not m or not line.startswith(" "):
            continue
        indent = len(line) - len(line.lstrip())
        while sections and sections[-1][0] >= indent:
            sections.pop()
        key, value = m.group(1), m.group(2)
        if not value:
            sections.append((indent, key))
            continue
        section = sections[0][1] if sections else None
        field = _AMD_SMI_KEYS.get((section, key)) or _AMD_SMI_KEYS.get((None, key))
        if field:
            gpus[index] = _with(gpus[index], field, value)
    return tuple(gpus[i] for i in sorted(gpus))


def _amd_smi_table(text: str, gpus: dict[int, AmdGpuReading]) -> None:
    pending: dict[str, str] | None = None
    for line in text.splitlines():
        first = _AMD_SMI_ROW1.match(line.strip())
        if first:
            pending = first.groupdict()
            continue
        second = _AMD_SMI_ROW2.match(line.strip())
        if second and pending is not None:
            index = int(second.group("index"))
            reading = AmdGpuReading(index)
            for field, value in (
                ("pci_address", pending["bdf"]),
                ("name", pending["name"]),
                ("temperature_c", pending["temp"]),
                ("power_w", pending["power"]),
                ("vram_used_mib", second.group("used")),
                ("vram_total_mib", second.group("total")),
            ):
                reading = _with(reading, field, value)
            gpus[index] = reading
        pending = None


def merge_readings(*groups: tuple[AmdGpuReading, ...]) -> tuple[AmdGpuReading, ...]:
    """Pure: one reading per GPU from several outputs of the same machine (amd-smi static and
    metric, rocm-smi), joined by index; a field the first does not show is taken from the next."""
    out: dict[int, AmdGpuReading] = {}
    for group in groups:
        for r in group:
            have = out.get(r.index)
            if have is None:
                out[r.index] = r
                continue
            fill = {k: v for k, v in vars(r).items() if v is not None and getattr(have, k) is None}
            out[r.index] = replace(have, **fill)
    return tuple(out[i] for i in sorted(out))


def probe_rocminfo(host: Host) -> RocminfoReport | None:
    """rocminfo's report on this host (commands/rocminfo.txt in a recording); None without it."""
    text = host.command("rocminfo", ["rocminfo"], timeout=ROCM_TOOL_TIMEOUT_S)
    return parse_rocminfo(text) if text else None


def probe_amd_smi(host: Host) -> tuple[AmdGpuReading, ...]:
    """The GPUs amd-smi (else rocm-smi, which ROCm replaced by it) reports; () without either."""
    text = host.command("amd-smi", ["amd-smi", "static"], timeout=ROCM_TOOL_TIMEOUT_S)
    if text:
        return parse_amd_smi(text)
    text = host.command("rocm-smi", ["rocm-smi"], timeout=ROCM_TOOL_TIMEOUT_S)
    return parse_rocm_smi(text) if text else ()
