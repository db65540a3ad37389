"""Secure Boot: a module signing key that exists but is not enrolled stops the run with exit 4
and the console steps (mokutil(1), dkms(8)), before install and after the driver.

mokutil needs EFI firmware to answer for real, which this machine lacks: inside a real Debian
root, a stand-in prints what `mokutil --test-key` prints on a laptop."""

from __future__ import annotations

from pathlib import Path

import pytest

from egpu_setup.errors import ActionRequired
from egpu_setup.host.machine import RootHost
from egpu_setup.install.preflight import MOK_KEYS, require_enrolled_key
from helpers.debroot import DebrootUnavailable, copy_root

NOT_ENROLLED = "/var/lib/shim-signed/mok/MOK.der is not enrolled\n"
ENROLLED = "/var/lib/shim-signed/mok/MOK.der is already enrolled\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return copy_root("trixie", tmp_path_factory.mktemp("sb") / "root")
    except DebrootUnavailable as exc:
        pytest.skip(str(exc))


def with_mokutil(root: Path, answer: str) -> RootHost:
    key = root / MOK_KEYS[1].lstrip("/")
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(b"0\x82")  # DER starts so; its content does not matter to the stand-in
    tool = root / "usr/bin/mokutil"
    tool.write_text(f"#!/bin/sh\nprintf '%s' '{answer}'\n")
    tool.chmod(0o755)
    return RootHost(root)


@pytest.mark.slow
def test_an_unenrolled_key_is_a_console_step(root: Path) -> None:
    with pytest.raises(ActionRequired) as err:
        require_enrolled_key(with_mokutil(root, NOT_ENROLLED))
    assert err.value.exit_code == 4
    assert "mokutil --import /var/lib/shim-signed/mok/MOK.der" in err.value.hint


@pytest.mark.slow
def test_an_enrolled_key_or_no_key_passes(root: Path) -> None:
    require_enrolled_key(with_mokutil(root, ENROLLED))
    (root / MOK_KEYS[1].lstrip("/")).unlink()
    require_enrolled_key(RootHost(root))  # no key yet: dkms has not built anything


def test_only_a_dkms_built_driver_needs_the_key() -> None:
    from egpu_setup.install.preflight import builds_dkms_module
    from egpu_setup.plan.steps import AptInstall, Plan

    debian = Plan((AptInstall(("linux-headers-amd64", "nvidia-kernel-dkms", "nvidia-driver")),))
    ubuntu = Plan(
        (AptInstall(("nvidia-driver-580-open", "linux-modules-nvidia-580-open-generic")),)
    )
    assert builds_dkms_module(debian)
    assert not builds_dkms_module(ubuntu)  # Canonical-signed prebuilt modules
    assert not builds_dkms_module(Plan(()))  # torch or config only
