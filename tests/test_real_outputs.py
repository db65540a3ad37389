"""Every real paste in tests/data/real/ through the code a user's paste really meets.

Each `<kind>/<sample>.txt` (source URL on line 1, the paste after it) is fed to the parsers and,
where that is how a user would hand it over, laid out as a recorded host bundle
(`commands/lspci.txt`, `nvidia-smi.txt`, `boltctl.txt`, `dmesg.txt`) and run through `detect`
and `doctor` exactly as `egpu-setup detect --from` / `doctor --from` would. The result is compared
fact by fact with `<kind>/expected.yaml`, which a person wrote from the pastes.

    python tests/test_real_outputs.py      # facts right / compared, per kind

prints the accuracy table (the numbers the issue tracks); pytest runs one test per sample.
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml

REAL = Path(__file__).parent / "data" / "real"
# cuda/ holds values of real GPUs for another part of the suite (its own README and values.yaml).
KINDS = (
    "lspci-names",
    "lspci-wrapped",
    "lspci-tree",
    "gpu-ids",
    "nvidia-smi",
    "boltctl",
    "kernel-log",
    "connection",
    "glibc",
    "rocminfo",
    "rocm-smi",
    "amd-smi",
)

# How a user hands each sample to egpu-setup when it is not `lspci` output (the default): the
# bundle file it becomes. Samples whose GPUs carry no PCI address (a Windows device list, an
# nvidia-smi CSV without pci.bus_id) cannot be a host's GPUs; they go through gpus_in_text, the
# identification detect itself uses for pasted text.
GPU_ROUTES = {
    "h100-nvl-csv-pci-device-id.txt": "nvidia-smi",
    "nvidia-smi-q-pci-section-device-id-0x1401.txt": "nvidia-smi",
    "open-module-no-gsp-pci-id-10de-1d16.txt": "dmesg",
}
# nvidia-smi's three failures and the doctor finding each one must raise.
SMI_ERROR_FINDINGS = {
    "driver-not-loaded": "nvidia-driver-not-loaded",
    "no-devices": "nvidia-no-gpu-found",
    "driver-library-mismatch": "driver-library-mismatch",
    "device-handle-error": "nvidia-smi-gpu-unreadable",
}


def samples(kind: str) -> list[Path]:
    return sorted((REAL / kind).glob("*.txt"))


def expected(kind: str) -> dict[str, Any]:
    data = yaml.safe_load((REAL / kind / "expected.yaml").read_text(encoding="utf-8"))
    return data or {}


def paste(path: Path) -> str:
    """The paste: everything after the source URL on line 1, byte for byte."""
    text = path.read_text(encoding="utf-8")
    return text.split("\n", 1)[1] if "\n" in text else ""


# -- comparing ------------------------------------------------------------------------------------


def _address(value: Any) -> str | None:
    from egpu_setup.detect.lspci import normalize_pci_address

    return normalize_pci_address(value) if isinstance(value, str) else None


_LAPTOP = re.compile(r"\b(?:laptop gpu|laptop|mobile|max-q)\b")


def same_product(a: Any, b: Any) -> bool:
    """Two spellings of one product name: case, an "NVIDIA" prefix (nvidia-smi adds it), and
    NVIDIA's laptop markers ("Mobile / Max-Q" in pci.ids, "Laptop GPU" in nvidia-smi) aside."""
    if not isinstance(a, str) or not isinstance(b, str):
        return bool(a == b)

    def key(text: str) -> tuple[str, ...]:
        t = _LAPTOP.sub(" laptop ", text.casefold())
        words = [w for w in re.split(r"[^a-z0-9.]+", t) if w and w not in ("nvidia", "corporation")]
        laptop = "laptop" in words
        return (*[w for w in words if w != "laptop"], *(("laptop",) if laptop else ()))

    return key(a) == key(b)


Fact = tuple[str, Any, Any, bool]  # (label, expected, got, right)


def _fact(label: str, want: Any, got: Any, same: Callable[[Any, Any], bool] | None = None) -> Fact:
    ok = same(want, got) if same else (want == got and type(want) is type(got))
    return (label, want, got, bool(ok))


def _by_address(
    want: list[dict[str, Any]], got: list[dict[str, Any]]
) -> Iterator[tuple[int, dict[str, Any], dict[str, Any] | None]]:
    """Pair each expected entry with the observed one at the same PCI address (the n-th of that
    address for the n-th expected one); entries without an address pair up in order."""
    used: set[int] = set()
    for i, w in enumerate(want):
        addr = _address(w.get("pci_address"))
        match = None
        for j, g in enumerate(got):
            if j in used:
                continue
            if addr is None or _address(g.get("pci_address")) == addr:
                match = j
                break
        if match is not None:
            used.add(match)
        yield i, w, (got[match] if match is not None else None)


def compare_gpus(
    want: list[dict[str, Any]], got: list[dict[str, Any]], prefix: str = "gpus"
) -> list[Fact]:
    facts = [_fact(f"{prefix}.count", len(want), len(got))]
    for i, w, g in _by_address(want, got):
        for key, value in w.items():
            label = f"{prefix}[{i}].{key}"
            have = None if g is None else g.get(key)
            have = list(have) if isinstance(have, tuple) else have  # JSON reads a tuple as a list
            if key == "pci_address":
                facts.append(_fact(label, _address(value), _address(have)))
            elif key == "name":
                facts.append(_fact(label, value, have, same_product))
            else:
                facts.append(_fact(label, value, have))
    return facts


# -- observing: each kind through the code a user's paste meets -----------------------------------


def bundle(tmp: Path, **files: str) -> Path:
    """A recorded host made of pasted command output only (commands/<name>.txt)."""
    (tmp / "commands").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (tmp / "commands" / f"{name.replace('_', '-')}.txt").write_text(text, encoding="utf-8")
    return tmp


def detect_json(tmp: Path, **files: str) -> dict[str, Any]:
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.host.machine import RecordedHost

    return detect_host(RecordedHost(bundle(tmp, **files))).to_json()


def doctor_ids(tmp: Path, **files: str) -> list[str]:
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.doctor.collect import collect
    from egpu_setup.doctor.diagnose import diagnose
    from egpu_setup.host.machine import RecordedHost

    host = RecordedHost(bundle(tmp, **files))
    facts = detect_host(host)
    return sorted({f.id for f in diagnose(facts, collect(host, facts))})


def check_gpus(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    entries = want.get("gpus") or []
    addresses = [_address(e.get("pci_address")) for e in entries]
    if all(addresses) and len(set(addresses)) == len(addresses):
        route = GPU_ROUTES.get(name, "lspci")
        got = detect_json(tmp, **{route.replace("-", "_"): text})["gpus"]
    else:
        from egpu_setup.detect.probe import gpus_in_text

        got = [asdict(m) for m in gpus_in_text(text)]
    return compare_gpus(entries, got)


def check_nvidia_smi(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.detect.nvidia_smi import parse_nvidia_smi

    report = parse_nvidia_smi(text)
    facts: list[Fact] = [_fact("error", want.get("error"), report.error_kind)]
    for key in ("driver_version", "cuda_version"):
        if key in want:
            facts.append(_fact(key, want[key], getattr(report, key)))
    if "nvml_library_version" in want:
        facts.append(
            _fact("nvml_library_version", want["nvml_library_version"], report.nvml_version)
        )
    got = [
        {
            "name": g.name,
            "bus_id": g.pci_bus_id,
            "memory_total_mib": g.memory_total_mib,
            "pci_bus": g.pci_bus,
            "pci_device_id": g.pci_device_id,
        }
        for g in report.gpus
    ]
    if "gpus" in want:
        facts.append(_fact("gpus.count", len(want["gpus"]), len(got)))
        for i, w in enumerate(want["gpus"]):
            g = got[i] if i < len(got) else {}
            for key, value in w.items():
                if key == "bus_id":
                    facts.append(_fact(f"gpus[{i}].bus_id", _address(value), g.get("bus_id")))
                else:
                    facts.append(_fact(f"gpus[{i}].{key}", value, g.get(key)))
    # What detect and doctor make of it as a pasted commands/nvidia-smi.txt.
    host = detect_json(tmp / "detect", nvidia_smi=text)
    nvidia = host["nvidia"]
    for key in ("driver_version", "cuda_version"):
        if key in want:
            facts.append(_fact(f"detect.{key}", want[key], nvidia[key]))
    # GPUs printed with no PCI address are listed by detect, counted and named as printed.
    unplaced = [w for w in want.get("gpus") or () if "bus_id" not in w]
    if unplaced and not host["gpus"]:
        listed = [g["name"] for g in host["listed_gpus"]]
        facts.append(_fact("detect.listed_gpus", [w.get("name") for w in unplaced], listed))
    finding = SMI_ERROR_FINDINGS.get(want.get("error") or "")
    ids = doctor_ids(tmp / "doctor", nvidia_smi=text)
    facts.append(_fact("doctor.finding", finding, finding if finding in ids else None))
    if finding is None:
        facts.append(
            _fact(
                "doctor.no-driver-finding", [], [i for i in ids if i in SMI_ERROR_FINDINGS.values()]
            )
        )
    return facts


def _rx_speed(dev: Any) -> str | None:
    if dev.rx_speed_gbps is None:
        return None
    text = f"{dev.rx_speed_gbps:g} Gb/s"
    if dev.rx_lanes:
        text += f" = {dev.rx_lanes} lanes * {dev.rx_speed_gbps / dev.rx_lanes:g} Gb/s"
    return text


def check_boltctl(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.detect.boltctl import parse_boltctl_list

    devices = parse_boltctl_list(text)
    entries = want.get("devices") or []
    facts: list[Fact] = [_fact("devices.count", len(entries), len(devices))]
    fields = {
        "label": lambda d: d.label,
        "name": lambda d: d.name,
        "vendor": lambda d: d.vendor,
        "uuid": lambda d: d.uuid,
        "status": lambda d: d.status,
        "authorized": lambda d: d.authorized,
        "generation": lambda d: d.generation_name,
        "policy": lambda d: d.policy,
        "type": lambda d: d.type,
        "rx_speed": _rx_speed,
    }
    for i, w in enumerate(entries):
        dev = devices[i] if i < len(devices) else None
        for key, value in w.items():
            facts.append(_fact(f"devices[{i}].{key}", value, fields[key](dev) if dev else None))
    # detect from a pasted commands/boltctl.txt: the peripherals, with the name/vendor/uuid lines.
    tb = detect_json(tmp, boltctl=text)["thunderbolt"]["devices"]
    peripherals = [w for w in entries if w.get("type", "peripheral") != "host"]
    facts.append(_fact("detect.devices.count", len(peripherals), len(tb)))
    for i, w in enumerate(peripherals):
        d = tb[i] if i < len(tb) else {}
        for key, json_key in (("name", "name"), ("vendor", "vendor"), ("uuid", "unique_id")):
            if key in w:
                facts.append(_fact(f"detect.devices[{i}].{key}", w[key], d.get(json_key)))
    return facts


def _looks_like_lspci(text: str) -> bool:
    from egpu_setup.detect.lspci import parse_lspci

    return bool(parse_lspci(text))


def check_kernel_log(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.detect.lspci import parse_lspci
    from egpu_setup.doctor.dmesg import scan_dmesg

    lspci = _looks_like_lspci(text)
    ids = doctor_ids(tmp, **({"lspci": text} if lspci else {"dmesg": text}))
    facts = [_fact("findings", sorted(want.get("findings") or []), ids)]
    facts.append(_fact("xid_codes", want.get("xid_codes") or [], list(scan_dmesg(text).xid_codes)))
    if "unassigned" in want:
        # the windows the kernel could not place, "address kind", each once: read per message
        scan = scan_dmesg(text)
        got = sorted({f"{b.address} {b.kind}" for b in scan.bar_failures})
        facts.append(_fact("unassigned", sorted(want["unassigned"]), got))
    if "bar_normal" in want:
        problems = [b for e in parse_lspci(text) if e.is_display for b in e.bar_problems]
        facts.append(_fact("bar_normal", want["bar_normal"], not problems))
    return facts


def check_connection(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.detect.pci import connection_in_text

    info = connection_in_text(text)
    return [_fact(key, value, getattr(info, key)) for key, value in want.items()]


def check_glibc(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.compat.glibc import parse_glibc_report

    report = parse_glibc_report(text)
    facts = []
    for key, value in want.items():
        if key == "newest_installable_torch":
            from egpu_setup.resolve.constraints import Constraints
            from egpu_setup.resolve.resolver import resolve

            res = resolve(
                None,
                None,
                Constraints(glibc=report.host_glibc, cuda=report.variant, python=report.python),
            )
            facts.append(_fact(key, value, f"{res.torch.version}+{res.torch.variant}"))
        else:
            facts.append(_fact(key, value, getattr(report, key)))
    return facts


def check_rocminfo(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.detect.rocm import parse_rocminfo

    report = parse_rocminfo(text)
    facts = [
        _fact(key, want[key], getattr(report, key))
        for key in ("kfd_loaded", "kfd_error", "user")
        if key in want
    ]
    agents = [asdict(a) for a in report.agents]
    facts.append(_fact("agents.count", len(want["agents"]), len(agents)))
    for i, w in enumerate(want["agents"]):
        a = agents[i] if i < len(agents) else {}
        facts += [_fact(f"agents[{i}].{k}", v, a.get(k)) for k, v in w.items()]
    # doctor, with the paste as commands/rocminfo.txt
    facts.append(_fact("findings", want["findings"], doctor_ids(tmp, rocminfo=text)))
    return facts


def _check_readings(want: dict[str, Any], got: Any) -> list[Fact]:
    readings = [asdict(g) for g in got]
    facts = [_fact("gpus.count", len(want["gpus"]), len(readings))]
    for i, w in enumerate(want["gpus"]):
        g = readings[i] if i < len(readings) else {}
        facts += [_fact(f"gpus[{i}].{k}", v, g.get(k)) for k, v in w.items()]
    return facts


def check_rocm_smi(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.detect.rocm import parse_rocm_smi

    return _check_readings(want, parse_rocm_smi(text))


def check_amd_smi(name: str, text: str, want: dict[str, Any], tmp: Path) -> list[Fact]:
    from egpu_setup.detect.rocm import parse_amd_smi

    return _check_readings(want, parse_amd_smi(text))


CHECKS: dict[str, Callable[[str, str, dict[str, Any], Path], list[Fact]]] = {
    "lspci-names": check_gpus,
    "lspci-wrapped": check_gpus,
    "lspci-tree": check_gpus,
    "gpu-ids": check_gpus,
    "nvidia-smi": check_nvidia_smi,
    "boltctl": check_boltctl,
    "kernel-log": check_kernel_log,
    "connection": check_connection,
    "glibc": check_glibc,
    "rocminfo": check_rocminfo,
    "rocm-smi": check_rocm_smi,
    "amd-smi": check_amd_smi,
}


def check_sample(kind: str, path: Path, tmp: Path) -> list[Fact]:
    want = expected(kind)[path.name]
    return CHECKS[kind](path.name, paste(path), want, tmp)


# -- tests ----------------------------------------------------------------------------------------

CASES = [
    pytest.param(kind, path, id=f"{kind}/{path.stem}") for kind in KINDS for path in samples(kind)
]


@pytest.mark.parametrize(("kind", "path"), CASES)
def test_real_sample(kind: str, path: Path, tmp_path: Path) -> None:
    facts = check_sample(kind, path, tmp_path)
    wrong = [f"{label}: want {w!r}, got {g!r}" for label, w, g, ok in facts if not ok]
    assert facts, f"{kind}/{path.name}: no fact compared"
    assert not wrong, f"{kind}/{path.name}:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize("kind", KINDS)
def test_every_sample_has_an_oracle_and_back(kind: str) -> None:
    files = {p.name for p in samples(kind)}
    oracle = set(expected(kind))
    assert files - oracle == set(), f"{kind}: samples without an expected.yaml entry"
    assert oracle - files == set(), f"{kind}: expected.yaml entries without a sample"
    assert set(CHECKS) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_samples_start_with_their_source(kind: str) -> None:
    for path in samples(kind):
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
        assert re.fullmatch(r"https?://\S+", first), f"{kind}/{path.name}: line 1 is {first!r}"
        assert paste(path).strip(), f"{kind}/{path.name}: empty paste"


def test_every_category_has_enough_samples() -> None:
    """The issue's bar: at least 3 real samples per category, 60 in all."""
    counts = {kind: len(samples(kind)) for kind in KINDS}
    assert min(counts.values()) >= 3, counts
    assert sum(counts.values()) >= 60, counts


# -- the accuracy table ---------------------------------------------------------------------------


def accuracy() -> list[tuple[str, int, int, int, int, int]]:
    """(kind, samples, samples right, facts right, facts compared, samples that raised)."""
    rows = []
    for kind in KINDS:
        n_ok = right = total = errors = 0
        for path in samples(kind):
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    facts = check_sample(kind, path, Path(tmp))
                except Exception:  # an API or a parser that raised: every fact of it is wrong
                    errors += 1
                    facts = []
            want_facts = max(len(facts), _fact_count(expected(kind)[path.name]))
            good = sum(1 for f in facts if f[3])
            right += good
            total += want_facts
            n_ok += int(bool(facts) and good == len(facts))
        rows.append((kind, len(samples(kind)), n_ok, right, total, errors))
    return rows


def _fact_count(entry: Any) -> int:
    """Facts an oracle entry states (used when the code under test raised before comparing)."""
    if isinstance(entry, dict):
        return sum(
            _fact_count(v) if isinstance(v, list) and v and isinstance(v[0], dict) else 1
            for v in entry.values()
        )
    if isinstance(entry, list):
        return 1 + sum(len(e) for e in entry if isinstance(e, dict))
    return 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    rows = accuracy()
    print(f"{'kind':<12} {'samples':>7} {'pass':>5} {'facts right/total':>18}  raised")
    for kind, n, ok, right, total, errors in rows:
        print(f"{kind:<12} {n:>7} {ok:>5} {right:>10}/{total:<7} {errors:>6}")
    n = sum(r[1] for r in rows)
    ok = sum(r[2] for r in rows)
    right = sum(r[3] for r in rows)
    total = sum(r[4] for r in rows)
    print(f"{'all':<12} {n:>7} {ok:>5} {right:>10}/{total:<7} {100 * right / total:.0f}%")


@pytest.mark.parametrize("kind", ["lspci-names", "lspci-wrapped", "gpu-ids"])
def test_no_known_nvidia_gpu_is_left_without_its_architecture(kind: str) -> None:
    """Whatever a paste shows of an NVIDIA GPU (its id, an old pci.ids' "Device 2684", its chip
    codename, its model name), if our table knows it, detect's answer carries the architecture
    and compute capability: beyond the oracle, which omits them where the paste prints only an id."""
    from egpu_setup.compat import gpus
    from egpu_setup.detect.probe import gpus_in_text

    nvidia = 0
    for path in samples(kind):
        for g in gpus_in_text(paste(path)):
            if g.vendor != "nvidia":
                continue
            nvidia += 1
            known = (
                (g.device_id and gpus.arch_from_device_id(g.device_id))
                or gpus.arch_from_codename(g.codename)
                or (g.name and gpus.arch_from_text(g.name))
            )
            assert known, (path.name, g)  # every NVIDIA GPU these pastes show is in the table
            assert (g.architecture, g.compute_capability) == known, (path.name, g)
    assert nvidia, kind
