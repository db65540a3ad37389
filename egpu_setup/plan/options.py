"""What the planner is asked for: the parts, the venv, a mirror, an offline bundle."""

from __future__ import annotations

from dataclasses import dataclass

from egpu_setup.errors import UsageError
from egpu_setup.plan.apt_sources import SOURCES_DIR
from egpu_setup.plan.steps import DEFAULT_APT_LOCK_TIMEOUT, DEFAULT_DOWNLOAD_TIMEOUT
from egpu_setup.state.paths import TORCH_VENV

PARTS = ("driver", "torch", "config")


DEFAULT_VENV = TORCH_VENV


@dataclass(frozen=True)
class PlanOptions:
    only: frozenset[str] = frozenset(PARTS)
    venv: str = DEFAULT_VENV
    index_url: str | None = None  # a lab mirror of the variant index; replaces it, never extra
    force: bool = False
    apt_lock_timeout: int = DEFAULT_APT_LOCK_TIMEOUT
    download_timeout: int = DEFAULT_DOWNLOAD_TIMEOUT
    target: str = "live"  # live / root: what kind of system the steps land on
    pending_reboot: str | None = None  # reason from the journal when a reboot is still owed
    sudo_user: str | None = None
    sudo_uid: int | None = None
    bundle: BundleSource | None = None  # install --bundle: everything from there, offline
    hold_driver: bool = False  # hold the driver packages for the term (plan/hold.py)


@dataclass(frozen=True)
class BundleSource:
    """What `install --bundle DIR` takes from the bundle for this machine's target."""

    directory: str  # the bundle on this machine (absolute)
    target: str  # "py3.11-debian-12"
    distro: str | None  # the driver part's repository; None: bundle has no driver part
    find_links: str | None  # absolute wheel pool
    requirements_file: str | None  # absolute requirements file with --hash lines
    repository: str | None  # absolute directory holding the .debs and Packages
    packages_sha256: str | None = None  # of repository/Packages, from the manifest
    # (file name, sha256) of every file in `repository`, from the bundle's manifest (install
    # reads it when it opens the bundle); the executor stages nothing that does not match
    repository_sha256: tuple[tuple[str, str], ...] = ()
    requirements_sha256: str | None = None  # of requirements_file, from the manifest

    @property
    def stage_to(self) -> str:
        return f"/var/lib/egpu-setup/bundle-apt/{self.distro}"

    @property
    def sources_path(self) -> str:
        return f"{SOURCES_DIR}/egpu-setup-bundle.sources"


def parse_only(text: str | None, known: tuple[str, ...] = PARTS) -> frozenset[str]:
    """`--only a,b`: a subset of `known` (all of it when not given); UsageError otherwise."""
    if text is None:
        return frozenset(known)
    parts = {p.strip() for p in text.split(",") if p.strip()}
    bad = sorted(parts - set(known))
    if bad or not parts:
        raise UsageError(
            f"--only {text!r}: unknown part {', '.join(bad) or '(empty)'}",
            f"choose from {','.join(known)}",
        )
    return frozenset(parts)
