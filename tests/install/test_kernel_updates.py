"""A lab laptop through a term: kernel updates after `install --root`, for real, in Debian 12.

The image is the cached bootable Debian 12 base (tests/helpers/image.py: linux-image-amd64 and
its headers). egpu-setup puts itself and its configuration into it (`install --root --only
config`: the tool venv, the units, the apt hook `/etc/apt/apt.conf.d/99egpu-setup-kernels`).
The driver is a real DKMS package built here with dpkg-deb: a one-file kernel module named
`nvidia`, added, built and installed by Debian's own dkms 3.0.10 through
/usr/lib/dkms/common.postinst, as dh_dkms packages (nvidia-kernel-dkms among them) do; it
compiles in seconds where the NVIDIA driver's takes many minutes. Then, through apt-get in the
image (entered as egpu-setup enters it, host/image_root.py), so apt's DPkg::Post-Invoke runs
the hook each time:

1. a second kernel from Debian's archive with its headers (the `cloud` flavour of the same
   ABI): DKMS's own kernel hooks build for it, and the check the hook runs records both ok;
2. the module lost for that kernel (`dkms unbuild`, what a build that failed or was skipped
   leaves), then a third kernel without its headers (`rt`): the hook's check rebuilds the
   second (`dkms autoinstall -k`) and records `nvidia-module-missing-for-kernel` for the third
   with its fix, which `doctor --root` shows.

The kernels come from this machine's Debian mirror once and from the shared .deb cache after:
a directory of their own (`DEBS`, its own lock), so this test never waits for the lock an image
build holds on the suite's directory for the whole of its driver install; that directory's .debs
are linked in without its lock (apt checks every cached .deb against the archive's hashes and
fetches one that does not match again).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.detect.kernels import parse_dkms_status
from helpers import image
from helpers.cli_runner import invoke
from helpers.local_apt import build_deb, local_repository

pytestmark = pytest.mark.debootstrap

DEBS = f"{image.SUITE}-kernel-updates"
DKMS_NAME, DKMS_VERSION = "nvidia-tiny", "1.0"
PACKAGE = f"{DKMS_NAME}-dkms"
SRC = f"/usr/src/{DKMS_NAME}-{DKMS_VERSION}"
MODULE_C = """#include <linux/module.h>
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("a module DKMS builds in seconds, named as the NVIDIA driver's");
static int __init tiny_init(void) { return 0; }
static void __exit tiny_exit(void) { }
module_init(tiny_init);
module_exit(tiny_exit);
"""
DKMS_CONF = f"""PACKAGE_NAME="{DKMS_NAME}"
PACKAGE_VERSION="{DKMS_VERSION}"
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/updates/dkms"
MAKE[0]="make -C ${{kernel_source_dir}} M=${{dkms_tree}}/${{PACKAGE_NAME}}/${{PACKAGE_VERSION}}/build modules"
CLEAN="true"
AUTOINSTALL="yes"
"""
# what dh_dkms writes into a -dkms package's maintainer scripts (debhelper's
# autoscripts/postinst-dkms and prerm-dkms)
POSTINST = f"""set -e
if [ "$1" = configure ]; then
  /usr/lib/dkms/common.postinst {DKMS_NAME} {DKMS_VERSION} /usr/share/{PACKAGE} "" "$2"
fi"""
PRERM = f"dkms remove -m {DKMS_NAME} -v {DKMS_VERSION} --all || true"


def _dkms_package(root: Path) -> Path:
    return build_deb(
        root,
        PACKAGE,
        depends="dkms",
        postinst=POSTINST,
        prerm=PRERM,
        texts={
            f"{SRC}/dkms.conf": DKMS_CONF,
            f"{SRC}/Makefile": "obj-m := nvidia.o\n",
            f"{SRC}/nvidia.c": MODULE_C,
        },
    )


def _link_suite_debs() -> None:
    """The suite's .debs into DEBS as hard links, without the suite's lock (module docstring):
    apt finds them there, and only what it fetched is added to DEBS."""
    ours = image.deb_cache_dir(DEBS)
    ours.mkdir(parents=True, exist_ok=True)
    for deb in image.deb_cache_dir().glob("*.deb"):
        if not (ours / deb.name).exists():
            os.link(deb, ours / deb.name)


def _apt(root: Path, log: Path, *args: str) -> None:
    _link_suite_debs()
    # INITRD=No: the kernel packages' initramfs hook (/etc/kernel/postinst.d/initramfs-tools)
    # then builds none; what the check reads is /lib/modules and DKMS, and two initramfs builds
    # were most of this test's time
    argv = ["install", "--no-install-recommends", *args]
    image.apt(root, argv, log=log, debs=DEBS, env={"INITRD": "No"})


def _installed_for(root: Path) -> set[str]:
    """The kernels `dkms status` in the image says the module is installed for."""
    out = image.run_in(root, ["dkms", "status", "-m", DKMS_NAME]).out
    return {e.kernel for e in parse_dkms_status(out) if e.kernel and e.state == "installed"}


def _kernels_json(root: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((root / "var/lib/egpu-setup/kernels.json").read_text())
    return result


def _states(record: dict[str, Any]) -> dict[str, str]:
    return {k["release"]: k["state"] for k in record["kernels"]}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[image.Image, Path]]:
    work = tmp_path_factory.mktemp("term")
    log = work / "term.log"
    try:
        img = image.build_base(work / "image", image.Phases(), log=log)
    except image.ImageUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield img, log
    finally:
        image.remove_image(img.root)
        image.discard_debs()


def test_the_apt_hook_rebuilds_for_a_new_kernel_and_flags_one_without_headers(
    lab: tuple[image.Image, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    img, log = lab
    root = img.root
    phases = image.Phases()
    base = img.kver  # 6.1.0-N-amd64: the other flavours of the same ABI
    cloud, rt = base.replace("-amd64", "-cloud-amd64"), base.replace("-amd64", "-rt-amd64")

    with phases.time("install --root --only config"):
        _link_suite_debs()
        args = ["--profile", "rtx3080", "--only", "config", "--yes"]
        ran = image.egpu_setup_install(img, args, log=log, check=False, debs=DEBS)
    assert ran.rc in (0, 3), ran.out[-4000:]
    hook = (root / "etc/apt/apt.conf.d/99egpu-setup-kernels").read_text()
    assert "/opt/egpu-setup/tool/bin/egpu-setup kernels check" in hook
    assert (root / "opt/egpu-setup/tool/bin/egpu-setup").is_file()

    with phases.time("the DKMS package"):
        local_repository(root, [_dkms_package(root)])
        _apt(root, log, PACKAGE)
    assert _installed_for(root) == {base}
    assert _states(_kernels_json(root)) == {base: "ok"}  # the hook ran after dpkg

    with phases.time("a second kernel with headers"):
        _apt(root, log, f"linux-image-{cloud}", f"linux-headers-{cloud}")
    assert _installed_for(root) == {base, cloud}
    first = _kernels_json(root)
    assert _states(first) == {base: "ok", cloud: "ok"} and first["ok"] is True

    with phases.time("a third kernel without headers"):
        image.run_in(root, ["dkms", "unbuild", "-m", DKMS_NAME, "-v", DKMS_VERSION, "-k", cloud])
        assert _installed_for(root) == {base}
        _apt(root, log, f"linux-image-{rt}")
    # the hook's check built the module DKMS had lost for the second kernel...
    assert _installed_for(root) == {base, cloud}
    assert (root / f"lib/modules/{cloud}/updates/dkms/nvidia.ko").is_file()
    record = _kernels_json(root)
    assert record["built"] == [cloud] and record["failed"] == []
    assert _states(record) == {base: "ok", cloud: "ok", rt: "missing"} and record["ok"] is False
    # ...and recorded the third, which nothing here can build, with the fix
    fix = f"apt-get install linux-headers-{rt} && dkms autoinstall -k {rt}"
    assert [k["fix"] for k in record["kernels"] if k["release"] == rt] == [fix]
    (finding,) = record["findings"]
    assert finding["id"] == "nvidia-module-missing-for-kernel" and rt in finding["summary"]

    monkeypatch.delenv("EGPU_SETUP_STATE_DIR", raising=False)  # the image's own state
    with phases.time("doctor --root"):
        doctor = invoke("doctor", "--root", str(root), "--json")
    found = [f for f in json.loads(doctor.stdout)["findings"] if f["id"] == finding["id"]]
    assert len(found) == 1 and rt in found[0]["summary"] and fix in found[0]["fix"], doctor.stdout
    print(f"\nkernel updates: {phases.summary()}", file=sys.stderr)
