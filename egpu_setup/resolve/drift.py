"""Drift: what a refreshed matrix would choose differently from the shipped snapshot.

`matrix update` reads the live PyTorch index; installs keep deciding with the shipped snapshot
until one asks for `--matrix updated` (compat/matrix.py select_matrix). Drift says, for the same
machine and profile, what that would change, so a lab decides to move on the day it chooses,
for every laptop at once. A profile's pins are exact: their choice never drifts, and a pin the
refreshed index no longer carries is said as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egpu_setup.compat.matrix import Matrix
from egpu_setup.errors import EgpuSetupError
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.resolve.resolver import resolve


@dataclass(frozen=True)
class Choice:
    """What one matrix chooses: the torch wheel and the driver plan, or why it cannot."""

    torch: str | None = None  # "2.13.0+cu130"
    driver: str | None = None  # "install branch 580" / "keep 550.163.01"
    error: str | None = None

    def text(self) -> str:
        if self.error:
            return f"refused ({self.error})"
        return f"torch {self.torch}, driver {self.driver}"

    def to_json(self) -> dict[str, Any]:
        return {"torch": self.torch, "driver": self.driver, "error": self.error}


@dataclass(frozen=True)
class Drift:
    """The choice for one machine and profile under the shipped and the refreshed matrix."""

    name: str  # the profile's name, or "this machine"
    shipped: Choice
    updated: Choice
    pins: tuple[str, ...] = ()  # "torch.pin 2.9.1+cu128"

    @property
    def changed(self) -> bool:
        return self.shipped != self.updated

    def text(self) -> str:
        pinned = f" ({', '.join(self.pins)})" if self.pins else ""
        if not self.changed:
            return f"{self.name}{pinned}: unchanged, {self.shipped.text()}"
        return f"{self.name}{pinned}: {self.shipped.text()} -> {self.updated.text()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "changed": self.changed,
            "pins": list(self.pins),
            "shipped": self.shipped.to_json(),
            "updated": self.updated.to_json(),
        }


def drift(
    name: str,
    facts: Any | None,
    profile: Any | None,
    constraints: Constraints,
    shipped: Matrix,
    updated: Matrix,
) -> Drift:
    """Resolve the same inputs with both matrices."""
    pins = tuple(
        f"{field} {value}"
        for field, value in (
            ("torch.pin", constraints.torch_pin),
            ("driver.pin", constraints.driver_pin),
        )
        if value
    )
    return Drift(
        name,
        _choose(facts, profile, constraints, shipped),
        _choose(facts, profile, constraints, updated),
        pins,
    )


def _choose(facts: Any | None, profile: Any | None, c: Constraints, m: Matrix) -> Choice:
    try:
        r = resolve(facts, profile, c, m)
    except EgpuSetupError as exc:
        return Choice(error=exc.message)
    return Choice(f"{r.torch.version}+{r.torch.variant}", _driver_text(r))


def _driver_text(r: Resolution) -> str:
    d = r.driver
    if d.action == "keep":
        return f"keep {d.installed}"
    if d.action == "host-managed":
        return "managed outside egpu-setup" + (f" (branch {d.branch})" if d.branch else "")
    if d.action == "in-kernel":
        # amdgpu: no branch to name, only the firmware package it loads
        return "amdgpu in the kernel" + (
            f" (firmware {', '.join(d.packages)})" if d.packages else ""
        )
    return f"{d.action} branch {d.branch}"
