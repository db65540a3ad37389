"""What the user asked for: CLI flags and the profile's limits, parsed and merged (CLI wins)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from egpu_setup.compat.matrix import (
    Matrix,
)
from egpu_setup.compat.versions import (
    PythonVersion,
    parse_torch_version,
)
from egpu_setup.errors import UsageError
from egpu_setup.profile.types import Profile


@dataclass(frozen=True)
class Constraints:
    """What the user asked for (CLI flags, profile): what-if inputs override detected facts."""

    torch_spec: str | None = None  # "2.9.1", "2.9", ">=2.7", "==2.5.1", "2.9.1+cu128"
    cuda: str | None = None  # "cu128" / "cpu"
    rocm: str | None = None  # "rocm7.2": an AMD GPU's torch ROCm variant (resolve/rocm.py)
    driver_branch: int | None = None  # --driver-branch N: exactly this branch
    min_branch: int | None = None
    preferred_branch: int | None = None
    max_branch: int | None = None
    flavour: Literal["open", "proprietary", "auto"] = "auto"
    python: str | None = None  # "3.12"
    platform: Literal["linux", "wsl"] | None = None
    machine: str | None = None  # --arch, what-if: "aarch64" (else the host's, else x86_64)
    distro: str | None = None  # "ubuntu-24.04"
    gpu: str | None = None  # "10de:2b85", "2b85", "RTX 5090"
    driver: str | None = None  # the installed driver, what-if: "550.163.01"
    extras: tuple[str, ...] = ()  # "torchvision", "torchaudio"
    glibc: str | None = None  # the host's glibc, what-if: "2.27" (else the distro's, distros.yaml)
    torch_pin: str | None = None  # profile torch.pin: exactly this release and variant
    driver_pin: str | None = None  # profile driver.pin: exactly this driver version


def constraints_from_profile(profile: Profile | None, **cli: Any) -> Constraints:
    """A profile's driver and torch constraints merged with CLI values (CLI wins; None: unset)."""
    values: dict[str, Any] = {}
    if profile is not None:
        drv, tor = profile.driver, profile.torch
        values["min_branch"] = drv.min_branch
        values["preferred_branch"] = drv.preferred_branch
        values["max_branch"] = drv.max_branch
        values["flavour"] = drv.flavour or "auto"
        values["driver_pin"] = drv.pin
        values["torch_spec"] = tor.spec
        values["cuda"] = tor.cuda
        values["extras"] = tuple(tor.extras)
        values["torch_pin"] = tor.pin
    known = set(Constraints.__dataclass_fields__)
    for key, value in cli.items():
        if key not in known:
            raise TypeError(f"constraints_from_profile: unknown field {key!r}")
        if value is not None and value != ():
            check_pin(key, value, values)
            values[key] = value
    return Constraints(**{k: v for k, v in values.items() if v is not None})


# A flag that would choose differently from a profile's pin: the pin is the lab's record of
# what every laptop gets, so a flag may restate it but never quietly override it.
_PINNED_BY = {
    "torch_spec": "torch_pin",
    "cuda": "torch_pin",
    "driver_branch": "driver_pin",
}


def check_pin(key: str, value: Any, values: dict[str, Any]) -> None:
    """UsageError when the flag `key` contradicts the profile's pin."""
    pin_key = _PINNED_BY.get(key)
    pin = values.get(pin_key) if pin_key else None
    if not pin:
        return
    version, _, variant = str(pin).partition("+")
    if key == "torch_spec":
        agrees = str(value).strip() in (pin, version, f"=={version}")
    elif key == "cuda":
        agrees = value == variant
    else:  # driver_branch
        agrees = str(value) == version.split(".")[0]
    if not agrees:
        flag = {"torch_spec": "--torch", "cuda": "--cuda", "driver_branch": "--driver-branch"}[key]
        field = "torch.pin" if pin_key == "torch_pin" else "driver.pin"
        raise UsageError(
            f"{flag} {value}: the profile pins {pin} ({field}); a flag cannot change a pin",
            f"leave {flag} out, or change {field} in the profile (then every laptop gets it)",
        )


def spec_filter(spec: str | None) -> tuple[Callable[[str], bool], str | None, str]:
    """A predicate over torch versions, the variant a local label pins ('2.9.1+cu128'), and text."""
    if not spec:
        return (lambda _v: True), None, "any"
    text = spec.strip()
    if text.lower().startswith("torch"):
        text = text[5:].strip()
    variant = None
    if re.fullmatch(r"\d+\.\d+(\.\d+)?(\+\w+)?", text):
        try:
            version, variant = parse_torch_version(text)
        except ValueError as exc:
            raise UsageError(
                f"--torch {spec!r}: {exc}", "use e.g. --torch 2.9.1 or '>=2.7'"
            ) from exc
        if version.count(".") == 1:  # "2.9": any 2.9.x
            return (lambda v: v.startswith(version + ".")), variant, f"{version}.x"
        return (lambda v: v == version), variant, version
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        specifier = SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise UsageError(
            f"--torch {spec!r} is not a version or a version specifier",
            "use e.g. --torch 2.9.1, --torch 2.9 or --torch '>=2.7,<2.12'",
        ) from exc
    if any("+" in s.version for s in specifier):
        raise UsageError(
            f"--torch {spec!r}: put the variant in --cuda", "e.g. --torch 2.9.1 --cuda cu128"
        )
    return (lambda v: specifier.contains(v, prereleases=False)), None, str(specifier)


def parse_python(text: str) -> str:
    try:
        py = PythonVersion.from_str(text)
    except ValueError as exc:
        raise UsageError(f"--python: {exc}", "use e.g. --python 3.12") from exc
    if py.major != 3:
        raise UsageError(
            f"Python {py}: no torch 2.x wheel exists for Python {py.major}",
            "torch 2.x needs Python 3.8 or newer; use e.g. --python 3.12",
        )
    return str(py)


def parse_distro(text: str, matrix: Matrix) -> tuple[str, str | None]:
    """'ubuntu-24.04' -> ('ubuntu', '24.04'); 'arch' -> ('arch', None)."""
    raw = text.strip().lower()
    m = re.fullmatch(r"([a-z][a-z0-9._-]*?)(?:[-: ]([0-9][0-9a-z.]*))?", raw)
    if not m or not matrix.knows_distro_id(m.group(1)):
        supported = ", ".join(d.label for d in matrix.distros)
        raise UsageError(
            f"--distro {text!r}: unknown distribution",
            f"use an os-release ID and VERSION_ID such as {supported}",
        )
    return m.group(1), m.group(2)


def branch_ok(branch: int, c: Constraints) -> bool:
    if c.driver_branch is not None and branch != c.driver_branch:
        return False
    if c.driver_pin is not None and str(branch) != c.driver_pin.split(".")[0]:
        return False
    if c.min_branch is not None and branch < c.min_branch:
        return False
    return not (c.max_branch is not None and branch > c.max_branch)


def requested_range(c: Constraints) -> str:
    if c.driver_pin is not None:
        return f"the profile's driver.pin {c.driver_pin}"
    if c.driver_branch is not None:
        return f"--driver-branch {c.driver_branch}"
    parts = [
        f">= {c.min_branch}" if c.min_branch is not None else "",
        f"<= {c.max_branch}" if c.max_branch is not None else "",
    ]
    return "the requested driver branch range (" + ", ".join(p for p in parts if p) + ")"
