"""Secure Boot: a module signing key that is not enrolled (or only imported) stops the run with
exit 4 and the console steps, after the automatic steps; the dry run shows those steps first.

mokutil needs EFI firmware to answer for real, which this machine lacks: inside a real Debian
root, a stand-in prints what `mokutil --test-key` prints on a laptop (its messages, from
mokutil src/mokutil.c print_skip_message / test_key)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from egpu_setup.errors import ActionRequired
from egpu_setup.host.machine import Host, RootHost
from egpu_setup.install.attention import (
    DKMS_KEY,
    UBUNTU_KEY,
    has_dkms_driver,
    key_state,
    parse_test_key,
    require_enrolled_key,
)
from egpu_setup.plan.steps import AptInstall, Plan
from helpers.debroot import DebrootUnavailable, copy_root

# mokutil's own lines: "%s is not enrolled", "%s is already enrolled", "%s is already in the
# enrollment request" (src/mokutil.c, 9ae73db), each with the file name first
NOT_ENROLLED = f"{UBUNTU_KEY} is not enrolled\n"
ENROLLED = f"{UBUNTU_KEY} is already enrolled\n"
PENDING = f"{UBUNTU_KEY} is already in the enrollment request\n"


class LiveLike(RootHost):
    """A real Debian root that answers like the running system (mokutil runs in the chroot):
    what `key_state` does on a laptop, without a laptop's firmware."""

    kind = "live"

    def command(self, name: str, argv: Sequence[str], timeout: float | None = None) -> str | None:
        return Host.command(self, name, argv, timeout)  # an image runs none; a machine does


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return copy_root("trixie", tmp_path_factory.mktemp("sb") / "root")
    except DebrootUnavailable as exc:
        pytest.skip(str(exc))


def with_mokutil(root: Path, answer: str) -> RootHost:
    key = root / UBUNTU_KEY.lstrip("/")
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(b"0\x82")  # DER starts so; its content does not matter to the stand-in
    tool = root / "usr/bin/mokutil"
    tool.write_text(f"#!/bin/sh\nprintf '%s' '{answer}'\n")
    tool.chmod(0o755)
    return LiveLike(root)


def test_test_key_text_decides_not_its_exit_status() -> None:
    assert parse_test_key(NOT_ENROLLED) == "not-enrolled"
    assert parse_test_key(ENROLLED) == "enrolled"
    assert parse_test_key(PENDING) == "pending"
    assert parse_test_key(f"{DKMS_KEY} is already in db\n") == "enrolled"
    assert (
        parse_test_key(None) == "unknown"
        and parse_test_key("EFI variables are not supported") == "unknown"
    )


@pytest.mark.debootstrap
def test_an_unenrolled_key_is_a_console_step(root: Path) -> None:
    with pytest.raises(ActionRequired) as err:
        require_enrolled_key(with_mokutil(root, NOT_ENROLLED), UBUNTU_KEY)
    assert err.value.exit_code == 4
    assert f"mokutil --import {UBUNTU_KEY}" in (err.value.hint or "")


@pytest.mark.debootstrap
def test_an_imported_key_waits_for_mokmanager_and_says_only_that(root: Path) -> None:
    with pytest.raises(ActionRequired) as err:
        require_enrolled_key(with_mokutil(root, PENDING), UBUNTU_KEY)
    assert "waits for enrolment" in err.value.message
    assert err.value.hint is not None
    assert "--import" not in err.value.hint and "MokManager" in err.value.hint


@pytest.mark.debootstrap
def test_an_enrolled_key_or_no_key_passes(root: Path) -> None:
    host = with_mokutil(root, ENROLLED)
    require_enrolled_key(host, UBUNTU_KEY)
    (root / UBUNTU_KEY.lstrip("/")).unlink()
    assert key_state(host, UBUNTU_KEY) == "missing"
    require_enrolled_key(host, UBUNTU_KEY)  # no key yet: DKMS has not built anything
    # an image's key is enrolled at each machine's own console: never judged in the root
    assert key_state(RootHost(root), UBUNTU_KEY) == "missing"


def test_only_a_dkms_built_driver_needs_the_key(tmp_path: Path) -> None:
    host = RootHost(tmp_path)  # nothing installed: only the plan counts
    debian = Plan((AptInstall(("linux-headers-amd64", "nvidia-kernel-dkms", "nvidia-driver")),))
    ubuntu = Plan(
        (AptInstall(("nvidia-driver-580-open", "linux-modules-nvidia-580-open-generic")),)
    )
    assert has_dkms_driver(debian, host)
    assert not has_dkms_driver(ubuntu, host)  # Canonical-signed prebuilt modules
    assert not has_dkms_driver(Plan(()), host)  # torch or config only
    # a DKMS driver already installed counts too (its module is rejected until the key is in)
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(
        "Package: nvidia-dkms-550\nStatus: install ok installed\nVersion: 550.120-0ubuntu1\n"
    )
    assert has_dkms_driver(Plan(()), host)


@pytest.mark.debootstrap
@pytest.mark.parametrize(
    ("answer", "want"),
    [(NOT_ENROLLED, "mok-needed"), (PENDING, "mok-needed"), (ENROLLED, "mok-enrolled")],
)
def test_the_first_boot_report_says_whether_the_key_is_enrolled(
    root: Path, answer: str, want: str
) -> None:
    from egpu_setup.install.attention import mok_status

    status = root / "var/lib/dpkg/status"
    before = status.read_bytes()
    host = with_mokutil(root, answer)
    try:
        assert mok_status(host, True) is None  # no DKMS-built driver installed: no key matters
        status.write_bytes(
            before
            + b"\nPackage: nvidia-kernel-dkms\nStatus: install ok installed\nVersion: 535.247.01-1"
            + b"\nArchitecture: amd64\n"
        )
        assert mok_status(host, True) == want
        assert mok_status(host, False) is None
    finally:
        status.write_bytes(before)
