"""Parse `nvidia-smi` text: the default table, `-q`, and `--query-gpu=... --format=csv`.

The layout is detected from the text itself:
- table: the boxed default output, in the 79-column layout of drivers before 530 and the
  91-column layout of 530+ (wider name column, Bus-Id padded), also as printed under WSL,
  where "Driver Version" is the Windows driver and differs from the NVIDIA-SMI version. R610
  drivers print "KMD Version:" / "CUDA UMD Version:" in place of "Driver Version:" / "CUDA
  Version:"; drivers before 410 print no CUDA version at all, and a 2014 (331) layout a 4-digit
  PCI domain;
- query: `nvidia-smi -q` / `-a` ("==============NVSMI LOG==============", indented "Key : value"),
  also an excerpt of it that starts below the header (a "Product Name" line, a "PCI" section);
- csv: `--query-gpu=...` with `--format=csv` (header row names the columns). `csv,noheader`
  output has no column names: they come from `columns=`, else from the `--query-gpu=` command
  line pasted above it, else from the shape of unambiguous cells (a PCI device id "0x232110DE",
  a bus id, a UUID, "32768 MiB") with the first text cell as the name.
Failures set `error` (the line as printed) and `error_kind`: "driver-not-loaded" ("couldn't
communicate with the NVIDIA driver", whatever apostrophe, wrapped or quoted), "no-devices" ("No
devices were found" / "No devices found"), "driver-library-mismatch" ("Driver/library version
mismatch"), "gpu-lost" ("GPU is lost"), "device-handle-error" ("Unable to determine the device
handle for GPU ...: Unknown Error": a GPU nvidia-smi could not read, cause not stated),
"not-installed".
"[N/A]", "N/A", "[Not Supported]" and other bracketed placeholders become None.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass

from egpu_setup.detect.lspci import normalize_pci_address

__all__ = ["SmiGpu", "SmiReport", "parse_nvidia_smi"]


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as nvidia-smi reported it. Unknown fields are None."""

    index: int | None = None
    name: str | None = None
    pci_bus_id: str | None = None  # "0000:01:00.0" (nvidia-smi's 8-digit domain shortened)
    uuid: str | None = None
    driver_version: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    link_gen_current: int | None = None
    link_gen_max: int | None = None
    link_width_current: int | None = None
    link_width_max: int | None = None
    persistence_mode: bool | None = None
    throttle_reasons: tuple[str, ...] = ()  # active "Clocks Event/Throttle Reasons", -q names
    pci_bus: str | None = None  # "0x01" as printed (csv pci.bus, -q PCI/Bus)
    pci_device_id: str | None = None  # "0x1DF010DE" as printed (device id, then vendor 10de)
    compute_capability: str | None = None  # csv compute_cap: "8.9"

    @property
    def device_id(self) -> str | None:
        """The PCI device id "0x1DF010DE" names: "1df0" (NVML packs device << 16 | vendor)."""
        m = re.fullmatch(r"0x([0-9a-fA-F]{4})10de", (self.pci_device_id or "").strip(), re.I)
        return m.group(1).lower() if m else None


@dataclass(frozen=True)
class SmiReport:
    """What one nvidia-smi output says. `error` is set when nvidia-smi could not talk to the GPU."""

    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[SmiGpu, ...] = ()
    error: str | None = None
    nvml_version: str | None = None  # "NVML library version: 550.107" after a mismatch
    layout: str | None = None  # "table" / "query" / "csv" / None
    error_kind: str | None = None  # "driver-not-loaded" / "no-devices" / ... (module docstring)
    # Notes printed after a version number, kept apart from it: R610's `-q` prints
    # "Driver Version : 610.47 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]"
    # (https://docs.nvidia.com/deploy/nvidia-smi/index.html, "Modified version information").
    version_notes: tuple[str, ...] = ()


# --- failures -------------------------------------------------------------------------------

# What nvidia-smi (or the shell) prints instead of data, by kind. Matched case-insensitively in
# the text with quote marks removed, curly apostrophes made straight and lines joined: pastes
# wrap "Make sure / that the latest NVIDIA driver ..." and turn "couldn't" into "couldn‘t".
_ERROR_KINDS = (
    (
        "driver-not-loaded",
        re.compile(
            r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", re.I
        ),
    ),
    (
        "driver-library-mismatch",
        re.compile(r"Failed to initialize NVML: Driver/library version mismatch", re.I),
    ),
    ("not-installed", re.compile(r"NVIDIA-SMI couldn't find libnvidia-ml\.so", re.I)),
    ("no-devices", re.compile(r"(?:^|\n)\s*No devices (?:were )?found\b", re.I)),
    # NVML_ERROR_GPU_IS_LOST is the only reason that says the GPU left the bus; "Unknown Error"
    # (or any other reason) after "Unable to determine the device handle" says nothing about why
    # (NVML API reference, nvmlReturn_t).
    ("gpu-lost", re.compile(r"GPU is lost", re.I)),
    ("device-handle-error", re.compile(r"Unable to determine the device handle for GPU", re.I)),
    ("nvml-failed", re.compile(r"Failed to initialize NVML", re.I)),
    (
        "not-installed",
        re.compile(r"nvidia-smi: (?:command )?not found|Command 'nvidia-smi' not found", re.I),
    ),
)
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "`": "'"})
_QUOTE_MARK_RE = re.compile(r"^\s*(?:>\s?)+", re.M)
_NVML_VERSION_RE = re.compile(r"NVML library version:\s*([0-9][0-9.]*)", re.I)
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _none_if_na(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or value.upper() in ("N/A", "NA", "ERR!") or value.startswith("["):
        return None
    return value


def _num(value: str | None) -> float | None:
    """'22.13 W' -> 22.13, '24564 MiB' -> 24564.0, '38C' -> 38.0, '16x' -> 16.0."""
    value = _none_if_na(value)
    if value is None:
        return None
    m = re.match(r"^[+-]?[0-9]+(?:\.[0-9]+)?", value)
    return float(m.group(0)) if m else None


def _int(value: str | None) -> int | None:
    n = _num(value)
    return int(n) if n is not None else None


def _bool(value: str | None) -> bool | None:
    value = _none_if_na(value)
    if value is None:
        return None
    v = value.lower()
    if v in ("enabled", "on", "yes", "true", "1"):
        return True
    if v in ("disabled", "off", "no", "false", "0"):
        return False
    return None


def _bus_id(value: str | None) -> str | None:
    value = _none_if_na(value)
    return normalize_pci_address(value) if value else None


# NVML's clocks event reason bits (nvml.h nvmlClocksEventReason*), named as `nvidia-smi -q`
# prints them so the table, -q and csv report the same strings.
_REASON_BITS = (
    (0x1, "Idle"),
    (0x2, "Applications Clocks Setting"),
    (0x4, "SW Power Cap"),
    (0x8, "HW Slowdown"),
    (0x10, "Sync Boost"),
    (0x20, "SW Thermal Slowdown"),
    (0x40, "HW Thermal Slowdown"),
    (0x80, "HW Power Brake Slowdown"),
    (0x100, "Display Clock Setting"),
)


def _reasons_from_mask(value: str | None) -> tuple[str, ...]:
    value = _none_if_na(value)
    if value is None:
        return ()
    try:
        mask = int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return ()
    return tuple(name for bit, name in _REASON_BITS if mask & bit)


# --- default table --------------------------------------------------------------------------

# R610 and newer print "KMD Version:" (the kernel-mode driver) and "CUDA UMD Version:".
_HEADER_DRIVER_RE = re.compile(r"(?:Driver|KMD) Version:\s*([0-9][0-9.]*)")
_HEADER_CUDA_RE = re.compile(r"CUDA (?:UMD )?Version:\s*([0-9][0-9.]*)")
_BUS = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
# "|   0  NVIDIA GeForce RTX 4090        Off |   00000000:01:00.0  On |    Off |"
_ROW1_RE = re.compile(
    rf"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<pm>On|Off|N/A)\s*\|\s*(?P<bus>{_BUS})\s+"
    r"(?P<disp>On|Off|N/A)\s*\|"
)
# "|  0%   38C    P8             22W /  450W |     593MiB /  24564MiB |      0%      Default |"
_ROW2_RE = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<pwr>\S+)\s*/\s*(?P<cap>\S+)\s*\|"
    r"\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*\|"
)


def _parse_table(lines: list[str]) -> tuple[str | None, str | None, tuple[SmiGpu, ...]]:
    driver = cuda = None
    gpus: list[SmiGpu] = []
    for i, line in enumerate(lines):
        if driver is None and (m := _HEADER_DRIVER_RE.search(line)):
            driver = m.group(1)
            if cm := _HEADER_CUDA_RE.search(line):
                cuda = cm.group(1)
        m = _ROW1_RE.match(line.strip())
        if m is None:
            continue
        values: dict[str, object] = {}
        if i + 1 < len(lines) and (m2 := _ROW2_RE.match(lines[i + 1].strip())):
            values = {
                "temperature_c": _num(m2.group("temp")),
                "power_draw_w": _num(m2.group("pwr")),
                "power_limit_w": _num(m2.group("cap")),
                "memory_used_mib": _int(m2.group("used")),
                "memory_total_mib": _int(m2.group("total")),
            }
        name = m.group("name").strip()
        gpus.append(
            SmiGpu(
                index=int(m.group("index")),
                # The old layout cuts long names ("NVIDIA GeForce ..."): kept as printed.
                name=name,
                pci_bus_id=_bus_id(m.group("bus")),
                driver_version=driver,
                persistence_mode=_bool(m.group("pm")),
                **values,  # type: ignore[arg-type]
            )
        )
    return driver, cuda, tuple(gpus)


# --- nvidia-smi -q --------------------------------------------------------------------------

# "    Product Name                          : NVIDIA GeForce RTX 4090": nvidia-smi pads keys, so
# a key is followed by whitespace and a colon; "GPU 00000000:01:00.0" is a section header.
_Q_KV_RE = re.compile(r"^(?P<indent>\s*)(?P<key>[^:\s][^:]*?)\s+:(?:\s(?P<value>.*))?$")
_Q_GPU_RE = re.compile(rf"^GPU\s+(?P<bus>{_BUS})\s*$")


# Keys only a GPU's block of `-q` has: an excerpt that starts with one of them is a GPU block
# whose "GPU 00000000:01:00.0" header was not pasted.
_Q_GPU_KEYS = frozenset({"Product Name", "Product Brand", "GPU UUID", "Bus Id", "Device Id"})


def _looks_like_query(lines: list[str]) -> bool:
    if any("NVSMI LOG" in line for line in lines) or any(_Q_GPU_RE.match(x) for x in lines):
        return True
    return any(
        (kv := _Q_KV_RE.match(line)) is not None and kv.group("key").strip() in _Q_GPU_KEYS
        for line in lines
    )


_VERSION_NOTE_RE = re.compile(r"^(?P<number>[0-9][0-9.]*)\s*(?:\[(?P<note>[^\]]*)\]?)?\s*$")


def _version(value: str, notes: list[str]) -> str | None:
    """The version number of a `-q` version line; a bracketed note after it goes to `notes`."""
    m = _VERSION_NOTE_RE.match(value.strip())
    if m is None:
        return _none_if_na(value)
    if m.group("note"):
        notes.append(m.group("note").strip())
    return m.group("number")


def _parse_query(
    lines: list[str], notes: list[str] | None = None
) -> tuple[str | None, str | None, tuple[SmiGpu, ...]]:
    notes = [] if notes is None else notes
    driver = cuda = None
    kmd = umd = None
    blocks: list[tuple[str | None, list[tuple[tuple[str, ...], str]]]] = []
    stack: list[tuple[int, str]] = []  # (indent, section name)
    for line in lines:
        if not line.strip():
            continue
        gm = _Q_GPU_RE.match(line.strip())
        if gm and not line[:1].isspace():
            blocks.append((gm.group("bus"), []))
            stack = []
            continue
        indent = len(line) - len(line.lstrip(" "))
        if not blocks and indent > 0:
            blocks.append((None, []))  # an excerpt of one GPU's block, below its header
        kv = _Q_KV_RE.match(line)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if kv is None:
            stack.append((indent, line.strip()))
            continue
        key = kv.group("key").strip()
        value = (kv.group("value") or "").strip()
        if not blocks:
            if key == "Driver Version":
                driver = _version(value, notes)
            elif key == "CUDA Version":
                cuda = _version(value, notes)
            elif key == "KMD Version":
                kmd = _version(value, notes)
            elif key == "CUDA UMD Version":
                umd = _version(value, notes)
            continue
        path = tuple(name for _, name in stack)
        if not value:
            # "MIG Mode" style headers can be printed with a colon and no value.
            stack.append((indent, key))
            continue
        blocks[-1][1].append(((*path, key), value))

    # R610 names the same numbers twice; the new names are the ones NVIDIA keeps.
    driver, cuda = kmd or driver, umd or cuda
    gpus = []
    for index, (bus, items) in enumerate(blocks):
        gpus.append(_gpu_from_query(index, bus, items, driver))
    return driver, cuda, tuple(gpus)


def _gpu_from_query(
    index: int, bus: str | None, items: list[tuple[tuple[str, ...], str]], driver: str | None
) -> SmiGpu:
    def find(*paths: tuple[str, ...]) -> str | None:
        for want in paths:
            for path, value in items:
                if path == want:
                    return value
        return None

    reasons = tuple(
        path[-1]
        for path, value in items
        if len(path) >= 2
        and path[0] in ("Clocks Event Reasons", "Clocks Throttle Reasons")
        and value.strip().lower() == "active"
    )
    power = ("GPU Power Readings",), ("Power Readings",)
    # 550+ prints "Average/Instantaneous Power Draw" beside or instead of "Power Draw"; the
    # "Module Power Readings" section (whole board module) is not the GPU's draw.
    draw = None
    for key in ("Power Draw", "Instantaneous Power Draw", "Average Power Draw"):
        draw = _num(find(*[(*p, key) for p in power]))
        if draw is not None:
            break
    return SmiGpu(
        index=index,
        name=_none_if_na(find(("Product Name",))),
        pci_bus_id=_bus_id(find(("PCI", "Bus Id"))) or _bus_id(bus),
        uuid=_none_if_na(find(("GPU UUID",))),
        driver_version=driver,
        memory_total_mib=_int(find(("FB Memory Usage", "Total"))),
        memory_used_mib=_int(find(("FB Memory Usage", "Used"))),
        temperature_c=_num(find(("Temperature", "GPU Current Temp"))),
        power_draw_w=draw,
        power_limit_w=_num(
            find(*[(*p, k) for p in power for k in ("Current Power Limit", "Power Limit")])
        ),
        link_gen_current=_int(find(("PCI", "GPU Link Info", "PCIe Generation", "Current"))),
        link_gen_max=_int(find(("PCI", "GPU Link Info", "PCIe Generation", "Max"))),
        link_width_current=_int(find(("PCI", "GPU Link Info", "Link Width", "Current"))),
        link_width_max=_int(find(("PCI", "GPU Link Info", "Link Width", "Max"))),
        persistence_mode=_bool(find(("Persistence Mode",))),
        throttle_reasons=reasons,
        pci_bus=_none_if_na(find(("PCI", "Bus"))),
        pci_device_id=_none_if_na(find(("PCI", "Device Id"))),
    )


# --- --query-gpu csv ------------------------------------------------------------------------

# Query field names (nvidia-smi --help-query-gpu) and their aliases -> SmiGpu field.
_CSV_FIELDS = {
    "index": "index",
    "name": "name",
    "gpu_name": "name",
    "pci.bus_id": "pci_bus_id",
    "gpu_bus_id": "pci_bus_id",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "driver_version": "driver_version",
    "memory.total": "memory_total_mib",
    "memory.used": "memory_used_mib",
    "temperature.gpu": "temperature_c",
    "power.draw": "power_draw_w",
    "power.draw.instant": "power_draw_w",
    "power.draw.average": "power_draw_w",
    "power.limit": "power_limit_w",
    "enforced.power.limit": "power_limit_w",
    "pcie.link.gen.current": "link_gen_current",
    "pcie.link.gen.gpucurrent": "link_gen_current",
    "pcie.link.gen.max": "link_gen_max",
    "pcie.link.gen.gpumax": "link_gen_max",
    "pcie.link.width.current": "link_width_current",
    "pcie.link.width.max": "link_width_max",
    "persistence_mode": "persistence_mode",
    "clocks_throttle_reasons.active": "throttle_reasons",
    "clocks_event_reasons.active": "throttle_reasons",
    "pci.bus": "pci_bus",
    "pci.device_id": "pci_device_id",
    "compute_cap": "compute_capability",
}
_INT_FIELDS = frozenset(
    {
        "index",
        "memory_total_mib",
        "memory_used_mib",
        "link_gen_current",
        "link_gen_max",
        "link_width_current",
        "link_width_max",
    }
)
_FLOAT_FIELDS = frozenset({"temperature_c", "power_draw_w", "power_limit_w"})


_QUERY_CMD_RE = re.compile(r"--query-gpu[= ]([A-Za-z0-9_.,]+)")
# Cells whose shape says what they are, for `csv,noheader` output pasted without its command.
_SHAPES = (
    ("pci.device_id", re.compile(r"0x[0-9A-Fa-f]{4}10[dD][eE]")),
    ("pci.bus_id", re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")),
    ("uuid", re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f-]{27}")),
)


def _columns_by_shape(rows: list[str]) -> list[str] | None:
    """Column names for header-less CSV rows, from cells that can only be one field; the first
    cell with letters in it is the name. None unless every row has the same shape."""
    shapes = []
    for row in csv.reader(rows, skipinitialspace=True):
        if len(row) < 2:
            return None
        cols = []
        for cell in row:
            cell = cell.strip()
            kind = next((k for k, p in _SHAPES if p.fullmatch(cell)), None)
            if kind is None and re.search(r"[A-Za-z]{2}", cell) and "name" not in cols:
                kind = "name"
            cols.append(kind or "")
        shapes.append(cols)
    if not shapes or any(s != shapes[0] for s in shapes):
        return None
    strong = {"pci.device_id", "pci.bus_id", "uuid"}
    return shapes[0] if strong & set(shapes[0]) and "name" in shapes[0] else None


def _column_key(header: str) -> str:
    """'memory.total [MiB]' -> 'memory.total'."""
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", header.strip()).strip().lower()


def _looks_like_csv_header(line: str) -> bool:
    cols = [_column_key(c) for c in line.split(",")]
    return sum(c in _CSV_FIELDS for c in cols) >= 1 and all(
        re.fullmatch(r"[a-z0-9_.]+", c) for c in cols if c
    )


def _parse_csv(rows: list[str], columns: Sequence[str]) -> tuple[SmiGpu, ...]:
    keys = [_CSV_FIELDS.get(_column_key(c)) for c in columns]
    gpus = []
    for position, row in enumerate(csv.reader(rows, skipinitialspace=True)):
        if not row or len(row) != len(keys):
            continue
        values: dict[str, object] = {}
        for key, cell in zip(keys, row, strict=True):
            if key is None or key in values:
                continue
            if key == "pci_bus_id":
                values[key] = _bus_id(cell)
            elif key in _INT_FIELDS:
                values[key] = _int(cell)
            elif key in _FLOAT_FIELDS:
                values[key] = _num(cell)
            elif key == "persistence_mode":
                values[key] = _bool(cell)
            elif key == "throttle_reasons":
                values[key] = _reasons_from_mask(cell)
            else:
                values[key] = _none_if_na(cell)
        if not any(v not in (None, ()) for v in values.values()):
            continue
        values.setdefault("index", position)
        gpus.append(SmiGpu(**values))  # type: ignore[arg-type]
    return tuple(gpus)


# --- entry point ----------------------------------------------------------------------------


def parse_nvidia_smi(text: str, columns: Sequence[str] | str | None = None) -> SmiReport:
    """Parse any common nvidia-smi output; `columns` names the fields of `csv,noheader` text."""
    if not isinstance(text, str):
        return SmiReport()
    lines = [_ANSI_RE.sub("", line).replace("\x00", "").rstrip() for line in text.splitlines()]
    error, kind = _error(lines)
    nvml = None
    for line in lines:
        if m := _NVML_VERSION_RE.search(line):
            nvml = m.group(1)
            break

    content = [line for line in lines if line.strip()]
    if isinstance(columns, str):
        columns = [c for c in columns.split(",") if c.strip()]
    if not columns:
        # `csv,noheader` under the command line that asked for it: the columns are on that line.
        for i, line in enumerate(content):
            m = _QUERY_CMD_RE.search(line)
            if m and "noheader" in line:
                columns = m.group(1).split(",")
                content = content[i + 1 :]
                break
    driver = cuda = None
    gpus: tuple[SmiGpu, ...] = ()
    layout = None
    notes: list[str] = []
    if columns:
        gpus, layout = _parse_csv(content, columns), "csv"
    elif _looks_like_query(content):
        driver, cuda, gpus = _parse_query(content, notes)
        layout = "query"
    elif any(_HEADER_DRIVER_RE.search(line) for line in content) or any(
        _ROW1_RE.match(line.strip()) for line in content
    ):
        driver, cuda, gpus = _parse_table(content)
        layout = "table"
    else:
        for i, line in enumerate(content):
            if _looks_like_csv_header(line):
                header = next(csv.reader([line], skipinitialspace=True))
                gpus, layout = _parse_csv(content[i + 1 :], header), "csv"
                break
        else:
            shaped = _columns_by_shape(content)
            if shaped:
                gpus, layout = _parse_csv(content, shaped), "csv"
    if driver is None:
        versions = {g.driver_version for g in gpus if g.driver_version}
        if len(versions) == 1:
            driver = versions.pop()
    return SmiReport(
        driver_version=driver,
        cuda_version=cuda,
        gpus=gpus,
        error=error,
        nvml_version=nvml,
        layout=layout,
        error_kind=kind,
        version_notes=tuple(dict.fromkeys(notes)),
    )


def _error(lines: list[str]) -> tuple[str | None, str | None]:
    """(the failure as printed, its kind), or (None, None)."""
    text = _QUOTE_MARK_RE.sub("", "\n".join(lines)).translate(_QUOTES)
    # A sentence a paste wrapped: join lines that do not end one ("... Make sure" / "that ...").
    joined = re.sub(r"(?<![.!:])\n(?=\s*[a-z])", " ", text)
    for kind, pattern in _ERROR_KINDS:
        m = pattern.search(joined)
        if m:
            start = joined.rfind("\n", 0, m.start() + 1) + 1
            end = joined.find("\n", m.end())
            return re.sub(r"\s+", " ", joined[start : end if end >= 0 else None]).strip(), kind
    return None, None
