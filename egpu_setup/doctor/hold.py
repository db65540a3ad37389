"""Pure: is the NVIDIA driver held, split, or was its hold removed? Read from dpkg's status, the
pin file egpu-setup writes (`driver.hold`) and whether the manifest says it wrote one.

Every binary of the driver's source package carries the source's version (detect/dpkg_status.py),
so two versions among them is a split: a kernel module built from one release and libraries
from another, what nvidia-smi reports as "Driver/library version mismatch" once the module loads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from egpu_setup.detect.dpkg_status import (
    HOLD_PIN,
    DpkgEntry,
    driver_packages,
    parse_dpkg_status,
    parse_pins,
)
from egpu_setup.doctor.findings import Finding
from egpu_setup.state.paths import STATE_DIR

STATE_MANIFEST = f"{STATE_DIR}/manifest.json"

# The package that carries the kernel module: Debian's nvidia-kernel-dkms and
# nvidia-open-kernel-dkms, Ubuntu's nvidia-dkms-<branch>; its version is the one loaded at boot.
_MODULE = re.compile(r"(?:^|-)(?:kernel-dkms|dkms|kernel-source|kernel-open)(?:-|$)")


@dataclass(frozen=True)
class HoldVerdict:
    packages: tuple[tuple[str, str], ...]  # the driver packages installed, (name, version)
    pinned: tuple[tuple[str, str], ...]  # what the pin file holds, () without one
    moved: tuple[str, ...]  # packages away from the reference version (pinned, or the module's)
    reference: tuple[str, str] | None  # (name, version) the others are measured against
    hold_removed: bool  # the manifest says egpu-setup wrote the pin; it is not there now

    @property
    def held(self) -> bool:
        return bool(self.pinned) and not self.moved

    @property
    def split(self) -> bool:
        return bool(self.moved)

    def split_text(self) -> str:
        """'split: nvidia-kernel-dkms 550.127-1 vs libcuda1 550.135-1 (moved: libcuda1, ...)'."""
        versions = dict(self.packages)
        first = self.moved[0]
        ref = f"{self.reference[0]} {self.reference[1]}" if self.reference else "?"
        return (
            f"split: {ref} vs {first} {versions.get(first, 'not installed')} "
            f"(moved: {', '.join(self.moved)})"
        )


def judge_hold(status: str | None, pin: str | None, hold_recorded: bool = False) -> HoldVerdict:
    """The verdict over dpkg's status text, the pin file's text and the manifest's word."""
    entries = parse_dpkg_status([status or ""])
    pins = parse_pins(pin) if pin else {}
    installed = driver_packages(entries, pins)
    reference, moved = _moved(installed, pins, entries)
    return HoldVerdict(
        tuple(installed.items()),
        tuple(sorted(pins.items())),
        moved,
        reference,
        hold_recorded and pin is None,
    )


def _moved(
    installed: dict[str, str], pins: dict[str, str], entries: dict[str, DpkgEntry]
) -> tuple[tuple[str, str] | None, tuple[str, ...]]:
    if pins:
        module = next((n for n in sorted(pins) if _MODULE.search(n)), min(pins))
        moved = tuple(n for n in sorted(pins) if installed.get(n) != pins[n] and n in entries)
        return (module, pins[module]), moved
    if len(set(installed.values())) < 2:
        return None, ()
    found = next((n for n in installed if _MODULE.search(n)), None)
    if found is not None:
        module, version = found, installed[found]
    else:  # no module package named: the version most of them have
        version = Counter(installed.values()).most_common(1)[0][0]
        module = next(n for n, v in installed.items() if v == version)
    return (module, version), tuple(n for n, v in installed.items() if v != version)


def hold_findings(verdict: HoldVerdict) -> list[Finding]:
    """driver-held (info) or driver-hold-removed (warning); a split is driver-library-mismatch's
    (doctor/checks.py check_mismatch), which names the moved packages."""
    if verdict.hold_removed:
        return [
            Finding(
                "driver-hold-removed",
                "warning",
                f"egpu-setup held the NVIDIA driver, but its pin {HOLD_PIN} is gone: the next "
                "upgrade can move the libraries away from the kernel module",
                (f"{STATE_MANIFEST} names {HOLD_PIN}; the file is not there",),
                "Hold it again with `sudo egpu-setup install --profile NAME --hold-driver`, or "
                "release it for good with `sudo egpu-setup rollback`.",
            )
        ]
    if not verdict.held:
        return []
    versions = sorted({v for _, v in verdict.pinned})
    return [
        Finding(
            "driver-held",
            "info",
            f"The NVIDIA driver is held at {', '.join(versions)} ({len(verdict.pinned)} "
            f"packages, {HOLD_PIN}): no upgrade moves it this term",
            tuple(f"{name} {version} (pinned)" for name, version in verdict.pinned),
            "To move to a newer driver, release the hold (`sudo egpu-setup rollback`, or "
            "install with --no-hold-driver) and install again.",
        )
    ]


def split_lines(verdict: HoldVerdict) -> list[str]:
    """Evidence for a split: each moved package beside the version it should have."""
    versions = dict(verdict.packages)
    ref = verdict.reference[1] if verdict.reference else "?"
    want = dict(verdict.pinned) or {n: ref for n in verdict.moved}
    return [
        f"dpkg: {n} {versions.get(n, 'not installed')} (the driver is {want.get(n, '?')})"
        for n in verdict.moved
    ]
