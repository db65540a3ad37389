"""The targets of a bundle: every (Python x distribution) pair, resolved with the real resolver."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host
from egpu_setup.profile.types import Profile
from egpu_setup.resolve.resolution import Resolution


@dataclass(frozen=True)
class Target:
    """One kind of laptop the bundle serves: a Python for the torch venv, a distribution."""

    python: str  # "3.11"
    distro: str  # "debian-12"
    resolution: Resolution  # compat.resolve.Resolution for this pair

    @property
    def name(self) -> str:
        return f"py{self.python}-{self.distro}"

    @property
    def pool(self) -> str:
        return f"wheels/py{self.python}"

    @property
    def requirements_file(self) -> str:
        return f"requirements-{self.name}.txt"

    @property
    def debs(self) -> str:
        return f"debs/{self.distro}"


def resolve_targets(
    profile: Profile,
    pythons: Sequence[str],
    distros: Sequence[str],
    *,
    cuda: str | None = None,
    torch_spec: str | None = None,
) -> list[Target]:
    """Resolve every (Python x distro) pair with the real resolver, from what-if inputs only."""
    from egpu_setup.compat.matrix import load_matrix
    from egpu_setup.resolve.constraints import constraints_from_profile, parse_distro
    from egpu_setup.resolve.resolver import resolve

    matrix = load_matrix()
    out: list[Target] = []
    for distro in distros:
        dist_id, dist_ver = parse_distro(distro, matrix)
        label = f"{dist_id}-{dist_ver}"
        if matrix.distro(dist_id, dist_ver) is None:
            known = ", ".join(d.label for d in matrix.distros)
            raise UsageError(
                f"--distro {distro}: no driver packages known for it",
                f"bundles are built for {known}",
            )
        for python in pythons or (None,):
            constraints = constraints_from_profile(
                profile, python=python, distro=label, cuda=cuda, torch_spec=torch_spec
            )
            res = resolve(None, profile, constraints)
            out.append(Target(res.python, label, res))
    names = [t.name for t in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"target {dupes[0]} given twice", "name each --python/--distro once")
    return out


def host_distro(host: Host) -> str:
    """`debian-12` for the machine building the bundle (the default target distribution)."""
    from egpu_setup.detect.osrelease import parse_os_release

    fields = parse_os_release(host.read("/etc/os-release") or "")
    if not fields.get("ID") or not fields.get("VERSION_ID"):
        raise UsageError(
            "cannot tell this machine's distribution from /etc/os-release",
            "pass --distro, e.g. --distro debian-12",
        )
    return f"{fields['ID']}-{fields['VERSION_ID']}"
