"""`install --bundle DIR`: the bundle opened and checked, the resolution narrowed to what it holds.

The bundle decides what is installed (torch, its variant, the driver packages), so the flags that
would choose differently are refused; every file the plan will use is checked against the
bundle's manifest (size and sha256) before anything is installed, and the manifest itself against
the pin the admin carried over from the machine that built it (bundle/format.py).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egpu_setup.bundle.format import (
    PIN_ENV,
    PIN_FILE,
    PROFILE_FILE,
    Manifest,
    check_pin,
    load_manifest,
)
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import Host
from egpu_setup.install.options import InstallOptions
from egpu_setup.log import get_logger
from egpu_setup.plan.options import BundleSource
from egpu_setup.profile.types import Profile
from egpu_setup.resolve.resolution import Resolution, TorchPlan
from egpu_setup.state.tool_wheels import KeptWheels

log = get_logger("egpu_setup.install")


@dataclass(frozen=True)
class OfflineBundle:
    directory: Path
    manifest: Manifest

    @property
    def profile_file(self) -> str:
        """Where the profile the bundle was resolved for lies (the default of `--profile`)."""
        return str(self.directory / PROFILE_FILE)

    def load_profile(self) -> Profile:
        """That profile, from bytes checked against the pinned manifest, never re-read from
        the bundle after the check (a copy in a private directory is what the loader reads)."""
        from egpu_setup.bundle.format import pinned_copy
        from egpu_setup.profile.load import load_file

        with pinned_copy(self.directory, self.manifest, PROFILE_FILE) as copy:
            profile = load_file(copy)
        return dataclasses.replace(profile, path=self.profile_file)


def open_bundle(options: InstallOptions) -> OfflineBundle:
    """The bundle's manifest, authenticated by its pin and validated; UsageError for flags the
    bundle decides and for a missing pin."""
    clash = [
        flag
        for flag, value in (
            ("--index-url", options.index_url),
            ("--torch", options.torch_spec),
            ("--cuda", options.cuda),
        )
        if value
    ]
    if clash:
        raise UsageError(
            f"{clash[0]} cannot be combined with --bundle: the bundle fixes what is installed",
            f"pass {clash[0]} to `egpu-setup bundle` when building it",
        )
    path = Path(options.bundle_dir or "").resolve()
    if not path.is_dir():
        raise UsageError(f"--bundle {options.bundle_dir}: no such directory", "pass a bundle DIR")
    pin = options.bundle_sha256 or os.environ.get(PIN_ENV)
    if not pin:
        raise UsageError(
            f"--bundle {options.bundle_dir}: nothing vouches for this bundle: pass the sha256 of "
            "its manifest.json that `egpu-setup bundle` printed",
            f"--bundle-sha256 HEX (or {PIN_ENV}=HEX), copied from {PIN_FILE} on the machine "
            "that built the bundle, never from the bundle itself",
        )
    return OfflineBundle(path, load_manifest(path, check_pin(pin)))


def tool_wheels(bundle: OfflineBundle | None) -> KeptWheels | None:
    """The bundle's tool/ wheels (egpu-setup and its dependencies) with the sha256s its pinned
    manifest gives, checked now and again on the copy pip installs from (execute/tool.py), for
    egpu-setup's own venv; None without a bundle or without that part."""
    from egpu_setup.bundle.format import repository_files, verify_files

    if bundle is None or not any(rel.startswith("tool/") for rel in bundle.manifest.files()):
        return None
    verify_files(bundle.directory, bundle.manifest, ["tool"])
    return KeptWheels(str(bundle.directory / "tool"), repository_files(bundle.manifest, "tool"))


def narrow_to_bundle(
    bundle: OfflineBundle, resolution: Resolution, only: frozenset[str], target: Host
) -> tuple[Resolution, BundleSource]:
    """This machine's target in the bundle, its files verified; the resolution narrowed to it."""
    from egpu_setup.bundle.format import find_target, repository_files, verify_files

    manifest, directory = bundle.manifest, bundle.directory
    wants_torch = "torch" in only and resolution.torch is not None
    wants_driver = "driver" in only and resolution.driver.action in ("install", "upgrade")
    distro = resolution.archive or resolution.distro
    entry = find_target(
        manifest, resolution.python if wants_torch else None, distro if wants_driver else None
    )
    torch: dict[str, Any] = entry.get("torch") or {}
    driver: dict[str, Any] = entry.get("driver") or {}
    _check_parts(directory, entry, (wants_torch, torch, "torch"), (wants_driver, driver, "driver"))
    prefixes = []
    if wants_torch:
        prefixes += [torch["wheels"], torch["requirements_file"]]
    if wants_driver:
        prefixes.append(driver["repository"])
    checked = verify_files(directory, manifest, prefixes)
    log.warning("bundle %s: %s verified (%.1f MB)", directory, entry["name"], checked / 1e6)
    if wants_torch:
        resolution = dataclasses.replace(
            resolution,
            torch=TorchPlan(
                torch["version"], torch["variant"], torch["index_url"], tuple(torch["requirements"])
            ),
        )
    if wants_driver:
        resolution = dataclasses.replace(
            resolution,
            driver=dataclasses.replace(resolution.driver, packages=tuple(driver["packages"])),
        )
    packages = manifest.files().get(f"{driver['repository']}/Packages") if driver else None
    requirements = manifest.files().get(torch["requirements_file"]) if wants_torch else None
    source = BundleSource(
        directory=str(directory),
        target=entry["name"],
        distro=entry["distro"] if wants_driver else None,
        find_links=str(directory / torch["wheels"]) if wants_torch else None,
        requirements_file=str(directory / torch["requirements_file"]) if wants_torch else None,
        repository=str(directory / driver["repository"]) if wants_driver else None,
        packages_sha256=packages["sha256"] if packages else None,
        repository_sha256=repository_files(manifest, driver["repository"]) if wants_driver else (),
        requirements_sha256=requirements["sha256"] if requirements else None,
    )
    return resolution, source


def _check_parts(
    directory: Path, entry: dict[str, Any], *parts: tuple[bool, dict[str, Any] | None, str]
) -> None:
    for wanted, part, name in parts:
        if wanted and not part:
            raise UsageError(
                f"bundle {directory} target {entry['name']} has no {name} part",
                f"rebuild it with `egpu-setup bundle` including {name}, or pass --only",
            )
