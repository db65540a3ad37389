"""Every installed kernel and its NVIDIA module: the pure judgement, the probe over a real
tree, `kernels check` on an image root, and doctor's finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egpu_setup.detect.kernels import (
    DkmsEntry,
    KernelFacts,
    KernelTree,
    parse_modules_dep,
    probe_kernels,
)
from egpu_setup.doctor.kernels import KernelVerdict, judge_kernels, kernel_findings
from egpu_setup.host.machine import RootHost
from helpers.cli_runner import invoke

OLD, NEW, BARE = "6.1.0-40-amd64", "6.1.0-41-amd64", "6.1.0-42-amd64"
DKMS = (DkmsEntry("nvidia-current", "535.247.01", OLD, "x86_64", "installed"),)


def _tree(release: str, *, headers: bool, module: str | None) -> KernelTree:
    return KernelTree(release, image=True, headers=headers, module=module)


def test_dkms_kernel_with_headers_is_rebuilt_one_without_is_missing() -> None:
    facts = KernelFacts(
        OLD,
        (
            _tree(OLD, headers=True, module="updates/dkms/nvidia-current.ko"),
            _tree(NEW, headers=True, module=None),
            _tree(BARE, headers=False, module=None),
        ),
        DKMS,
    )
    assert judge_kernels(facts) == (
        KernelVerdict(OLD, "ok", True, None),
        KernelVerdict(NEW, "rebuild", False, f"dkms autoinstall -k {NEW}"),
        KernelVerdict(
            BARE,
            "missing",
            False,
            f"apt-get install linux-headers-{BARE} && dkms autoinstall -k {BARE}",
        ),
    )


def test_ubuntu_prebuilt_module_names_its_package() -> None:
    facts = KernelFacts(
        "6.8.0-51-generic",
        (
            _tree("6.8.0-51-generic", headers=False, module="kernel/nvidia-550/nvidia.ko"),
            _tree("6.8.0-52-generic", headers=False, module=None),
        ),
        None,
    )
    (_, new) = judge_kernels(facts)
    assert new == KernelVerdict(
        "6.8.0-52-generic",
        "missing",
        False,
        "apt-get install linux-modules-nvidia-550-6.8.0-52-generic",
    )


def test_no_driver_anywhere_is_nothing_to_judge() -> None:
    facts = KernelFacts(OLD, (_tree(OLD, headers=True, module=None),), ())
    assert judge_kernels(facts) == ()
    assert kernel_findings(()) == []


def test_finding_is_an_error_only_for_the_running_kernel() -> None:
    other = kernel_findings((KernelVerdict(NEW, "missing", False, "fix-it"),))
    running = kernel_findings((KernelVerdict(NEW, "missing", True, "fix-it"),))
    assert [(f.id, f.severity) for f in other] == [("nvidia-module-missing-for-kernel", "warning")]
    assert [(f.id, f.severity) for f in running] == [("nvidia-module-missing-for-kernel", "error")]
    assert NEW in other[0].summary and "fix-it" in other[0].fix


def test_modules_dep_forms() -> None:
    assert parse_modules_dep("kernel/a.ko:\nupdates/dkms/nvidia.ko.zst: kernel/b.ko\n") == (
        "updates/dkms/nvidia.ko.zst"
    )
    assert parse_modules_dep("/lib/modules/6.1/kernel/nvidia-550/nvidia.ko:\n") == (
        "/lib/modules/6.1/kernel/nvidia-550/nvidia.ko"
    )
    assert parse_modules_dep("updates/dkms/nvidia-current.ko.xz:\n") == (
        "updates/dkms/nvidia-current.ko.xz"
    )
    # nvidia-drm and nvidia-uvm alone are not the module the driver needs
    assert parse_modules_dep("updates/dkms/nvidia-drm.ko: updates/dkms/nvidia.ko\n") is None


def _image(root: Path) -> Path:
    """Three installed kernels as Debian's packages lay them out: one with its DKMS module,
    one with headers only, one with neither; DKMS holds the nvidia-current sources."""
    for release in (OLD, NEW, BARE):
        base = root / "lib/modules" / release
        base.mkdir(parents=True)
        (root / "boot").mkdir(exist_ok=True)
        (root / f"boot/vmlinuz-{release}").write_text("")
        dep = "kernel/drivers/video/fbdev/core/fb.ko:\n"
        if release == OLD:
            (base / "updates/dkms").mkdir(parents=True)
            (base / "updates/dkms/nvidia-current.ko.xz").write_text("")
            dep += "updates/dkms/nvidia-current.ko.xz:\n"
        if release != BARE:
            (base / "build/include").mkdir(parents=True)
        (base / "modules.dep").write_text(dep)
    # a tree a removed kernel left: no modules.dep, not a kernel
    (root / "lib/modules/6.1.0-30-amd64/updates").mkdir(parents=True)
    (root / "var/lib/dkms/nvidia-current/535.247.01/source").mkdir(parents=True)
    return root


def test_probe_reads_the_tree(tmp_path: Path) -> None:
    facts = probe_kernels(RootHost(_image(tmp_path / "img")))
    assert [(k.release, k.headers, k.module) for k in facts.kernels] == [
        (OLD, True, "updates/dkms/nvidia-current.ko.xz"),
        (NEW, True, None),
        (BARE, False, None),
    ]
    assert facts.dkms is None  # no dkms in the image: nothing to run


def test_kernels_check_on_an_image_records_what_it_cannot_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EGPU_SETUP_STATE_DIR")  # the image's own state, under its root
    root = _image(tmp_path / "img")
    res = invoke("kernels", "check", "--root", str(root), "--json")
    assert res.returncode == 1, res.stderr
    data = json.loads(res.stdout)
    assert [(k["release"], k["state"]) for k in data["kernels"]] == [
        (OLD, "ok"),
        (NEW, "missing"),  # no dkms here to say it knows the module: nothing can build it
        (BARE, "missing"),
    ]
    assert [f["id"] for f in data["findings"]] == ["nvidia-module-missing-for-kernel"]
    kept = root / "var/lib/egpu-setup/kernels.json"
    assert json.loads(kept.read_text()) == data
    before = kept.stat().st_mtime_ns
    # a second run that finds nothing new leaves the record alone (the apt hook's common case)
    assert invoke("kernels", "check", "--root", str(root), "--json").returncode == 1
    assert kept.stat().st_mtime_ns == before
    # --no-rebuild only looks: it keeps nothing
    (root / f"lib/modules/{NEW}/updates/dkms").mkdir(parents=True)
    (root / f"lib/modules/{NEW}/updates/dkms/nvidia-current.ko.xz").write_text("")
    (root / f"lib/modules/{NEW}/modules.dep").write_text("updates/dkms/nvidia-current.ko.xz:\n")
    res = invoke("kernels", "check", "--root", str(root), "--no-rebuild")
    assert res.returncode == 1 and f"{NEW}: ok" in res.stdout and f"{BARE}: missing" in res.stdout
    assert kept.stat().st_mtime_ns == before
