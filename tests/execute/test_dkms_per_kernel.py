"""A DKMS module for every kernel an image boots (execute/dkms.py).

Debian's dkms postinst builds, in a chroot, for the kernels it finds on a first install but
only for the newest on an upgrade, and skips a kernel without headers with no error: so after
apt the product reads `dkms status` per kernel. The status lines are those of a Debian 12
image built here by `install --root` (dkms 3.0.10) and of the dkms 2.x format (Ubuntu 20.04's
dkms 2.8: "module, version, kernel, arch: state").
"""

from __future__ import annotations

from pathlib import Path

from egpu_setup.detect.kernels import parse_dkms_status
from egpu_setup.execute.dkms import kernels_with_headers, missing_kernels
from egpu_setup.host.machine import RootHost

DKMS3 = "nvidia-current/535.261.03, 6.1.0-50-amd64, x86_64: installed\n"
DKMS3_ADDED = "nvidia-current/535.261.03: added\n"
DKMS2 = "nvidia, 470.256.02, 5.4.0-200-generic, x86_64: installed\n"


def test_both_status_formats_parse() -> None:
    (new,) = parse_dkms_status(DKMS3)
    assert (new.module, new.version, new.kernel, new.arch, new.state) == (
        "nvidia-current", "535.261.03", "6.1.0-50-amd64", "x86_64", "installed",
    )  # fmt: skip
    (old,) = parse_dkms_status(DKMS2)
    assert (old.module, old.version, old.kernel) == ("nvidia", "470.256.02", "5.4.0-200-generic")
    (added,) = parse_dkms_status(DKMS3_ADDED)
    assert (added.kernel, added.state) == (None, "added")


def test_a_kernel_without_its_module_is_found_and_none_without_our_module() -> None:
    kernels = ["6.1.0-49-amd64", "6.1.0-50-amd64"]
    assert missing_kernels(parse_dkms_status(DKMS3), kernels, "nvidia") == ["6.1.0-49-amd64"]
    # only added (the postinst skipped the build): every kernel still needs it
    assert missing_kernels(parse_dkms_status(DKMS3_ADDED), kernels, "nvidia") == kernels
    # DKMS knows no NVIDIA module (the open modules from a package, or none): nothing to build
    assert missing_kernels(parse_dkms_status(""), kernels, "nvidia") == []


def test_only_kernels_with_modules_and_headers_count_headers_resolved_inside_the_image(
    tmp_path: Path,
) -> None:
    root = tmp_path / "image"
    for release in ("6.1.0-49-amd64", "6.1.0-50-amd64", "6.1.0-51-amd64"):
        (root / "boot").mkdir(parents=True, exist_ok=True)
        (root / f"boot/vmlinuz-{release}").write_text("")
        (root / f"lib/modules/{release}").mkdir(parents=True)
    # 50's headers, by the absolute link Debian's kernel package makes: valid inside the image only
    (root / "usr/src/linux-headers-6.1.0-50-amd64/include").mkdir(parents=True)
    (root / "lib/modules/6.1.0-50-amd64/build").symlink_to("/usr/src/linux-headers-6.1.0-50-amd64")
    # 51 has modules but no vmlinuz: not a kernel the image boots
    (root / "boot/vmlinuz-6.1.0-51-amd64").unlink()
    (root / "usr/src/linux-headers-6.1.0-51-amd64/include").mkdir(parents=True)
    (root / "lib/modules/6.1.0-51-amd64/build").symlink_to("/usr/src/linux-headers-6.1.0-51-amd64")
    assert kernels_with_headers(RootHost(root)) == ["6.1.0-50-amd64"]
