"""What `egpu-setup install` was asked for: its flags, as one frozen value built by the command."""

from __future__ import annotations

import os
from dataclasses import dataclass

from egpu_setup.plan.options import DEFAULT_VENV
from egpu_setup.plan.steps import DEFAULT_DOWNLOAD_TIMEOUT


@dataclass(frozen=True)
class InstallOptions:
    """The install flags, read by every stage and changed by none (docs/design.md: the flags).

    profile None means the bundle's profile (`--bundle DIR`); `only` is the raw `--only` text,
    parsed (and refused when wrong) by prepare, so errors come in the order the flags are checked.
    """

    profile: str | None = None
    dry_run: bool = False
    yes: bool = False
    as_json: bool = False
    only: str | None = None
    venv: str | None = None
    torch_spec: str | None = None
    cuda: str | None = None
    rocm: str | None = None  # an AMD GPU's torch ROCm variant, as resolve's --rocm
    driver_branch: int | None = None
    mode: str | None = None
    index_url: str | None = None
    bundle_dir: str | None = None
    bundle_sha256: str | None = None  # the pin of the bundle's manifest.json (`bundle` prints it)
    root_dir: str | None = None
    from_dir: str | None = None
    force: bool = False
    lock_timeout: int = 600
    download_timeout: int = DEFAULT_DOWNLOAD_TIMEOUT
    run_verify: bool = True
    matrix: str = "shipped"  # "updated": the overlay of `matrix update` decides (--matrix)
    enclosure: str | None = None  # --enclosure UUID: the Thunderbolt device to enrol and tie
    mok_key: str | None = None  # --mok-key DIR: the lab's module signing key (install/mok_key.py)
    hold_driver: bool | None = None  # --hold-driver/--no-hold-driver; None: the profile's

    @property
    def venv_path(self) -> str:
        """The torch venv, absolute (`--venv ~/torch` as the shell would not expand it)."""
        return os.path.abspath(os.path.expanduser(self.venv)) if self.venv else DEFAULT_VENV
