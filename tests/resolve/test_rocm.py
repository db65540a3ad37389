"""resolve for an AMD GPU: the recorded Radeon eGPU host behind Thunderbolt gets "this link cannot
run ROCm" (the answer ROCm/ROCm issue #4198 got for a USB4 Radeon eGPU), OCuLink and what-if
cards get a ROCm wheel with kernels for their gfx target, and every impossibility is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from egpu_setup.detect.facts import Gpu, HostFacts, OsFacts, PythonFacts
from egpu_setup.errors import MatrixError, UnsupportedHardware, UsageError
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolver import resolve
from helpers.cli_runner import invoke

AMD_HOST = Path(__file__).resolve().parent.parent / "fixtures" / "hosts" / "amd-rx7900xt-egpu"


def amd_host(
    device: str, connection: str, distro: str = "debian", version: str = "12"
) -> HostFacts:
    gpu = Gpu(
        pci_address="0000:03:00.0",
        vendor="amd",
        vendor_id="1002",
        device_id=device,
        name="Navi",
        driver="amdgpu",
        external=True,
        connection=connection,
    )
    return HostFacts(
        os=OsFacts(id=distro, version_id=version, kernel="6.12.0", arch="x86_64", wsl=False),
        python=PythonFacts(version="3.11.2", externally_managed=True),
        gpus=(gpu,),
    )


def what_if(**kw: Any) -> Constraints:
    return Constraints(**{"distro": "ubuntu-24.04", "python": "3.12", **kw})


def test_recorded_tb_radeon_egpu_is_told_the_link_cannot_run_rocm() -> None:
    done = invoke("resolve", "--from", str(AMD_HOST))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    err, hint = done.stderr.splitlines()[:2]
    assert err.startswith("error: this link cannot run ROCm: the Radeon RX 7900 XT"), err
    assert "0000:24:00.0" in err and "gfx1100" in err and "PCIe atomics" in err
    assert "Thunderbolt" in err  # the chain's bridges, as detection named them
    assert hint.startswith("hint: connect the card by OCuLink"), hint
    assert "Traceback" not in done.stderr


def test_recorded_tb_radeon_egpu_still_gets_the_cpu_build_when_asked() -> None:
    done = invoke("resolve", "--from", str(AMD_HOST), "--cuda", "cpu", "--json")
    assert done.returncode == 0, done.stderr
    assert '"variant": "cpu"' in done.stdout


def test_what_if_rx7900xtx_gets_the_newest_rocm_wheel_with_gfx1100() -> None:
    r = resolve(None, None, what_if(gpu="RX 7900 XTX"))
    assert (r.torch.version, r.torch.variant) == ("2.14.1", "rocm7.14")
    assert r.torch.index_url == "https://download.pytorch.org/whl/rocm7.14"
    assert r.torch.requirements == ("torch==2.14.1+rocm7.14",)
    assert r.gpu is not None and r.gpu.pci_id == "1002:744c"
    assert r.gpu.architecture == "RDNA 3 (gfx1100)" and r.gpu.compute_capability is None
    d = r.driver
    assert (d.action, d.source, d.packages, d.branch) == (
        "in-kernel",
        "kernel",
        ("linux-firmware",),
        None,
    )
    assert any("amdgpu is in the Linux kernel" in x for x in r.reasons)
    assert any("PCIe atomics" in w and "not known" in w for w in r.warnings)
    assert r.to_json()["driver"]["action"] == "in-kernel"


def test_rocm_flag_picks_the_variant() -> None:
    r = resolve(None, None, what_if(gpu="1002:744c", rocm="7.2"))
    assert (r.torch.version, r.torch.variant) == ("2.14.1", "rocm7.2")
    r = resolve(None, None, what_if(gpu="W7900", rocm="rocm6.4", torch_spec="2.8"))
    assert r.torch.version.startswith("2.8") and r.torch.variant == "rocm6.4"


def test_oculink_rx9070xt_on_debian12_names_the_firmware_gap() -> None:
    r = resolve(amd_host("7550", "oculink"), None, Constraints())
    assert r.torch.variant.startswith("rocm") and r.python == "3.11"
    assert r.driver.packages == ("firmware-amd-graphics",)
    assert r.driver.apt_components == ("non-free-firmware",)
    assert any("bookworm-backports" in w and "gfx1201" in w for w in r.warnings), r.warnings
    assert any("the oculink link is not a Thunderbolt/USB4 tunnel" in x for x in r.reasons)


@pytest.mark.parametrize("connection", ["thunderbolt", "usb4"])
def test_rdna4_over_a_tunnel_is_refused(connection: str) -> None:
    with pytest.raises(UnsupportedHardware, match="this link cannot run ROCm") as e:
        resolve(amd_host("7550", connection), None, Constraints())
    assert e.value.hint is not None and "OCuLink" in e.value.hint


def test_gfx1031_only_with_the_override_and_said_so() -> None:
    r = resolve(None, None, what_if(gpu="RX 6700 XT"))
    assert any("HSA_OVERRIDE_GFX_VERSION=10.3.0" in w for w in r.warnings), r.warnings
    assert any("does not list" in w for w in r.warnings)
    assert any("no gfx1031 kernels, only gfx1030" in x for x in r.reasons)


def test_native_kernels_win_and_an_old_release_without_them_uses_the_override() -> None:
    r = resolve(None, None, what_if(gpu="RX 7600 XT"))  # gfx1102: native from torch 2.7
    assert not any("HSA_OVERRIDE" in w for w in r.warnings)
    r = resolve(None, None, what_if(gpu="RX 7600 XT", torch_spec="2.6"))
    assert any("HSA_OVERRIDE_GFX_VERSION=11.0.0" in w for w in r.warnings), r.warnings


def test_glibc_227_gets_the_last_rocm_wheel_built_on_glibc_217() -> None:
    r = resolve(None, None, what_if(gpu="RX 7900 XTX", distro="ubuntu-18.04", python="3.9"))
    # torch 2.6+rocm6.2.4 on is manylinux_2_28; 2.6's rocm6.1 tag is not known, and said so
    assert (r.torch.version, r.torch.variant) == ("2.6.0", "rocm6.1")
    assert any("is not known" in w and "glibc 2.27" in w for w in r.warnings), r.warnings
    r = resolve(
        None,
        None,
        what_if(gpu="RX 7900 XTX", distro="ubuntu-18.04", python="3.9", torch_spec="2.5"),
    )
    assert r.torch.version.startswith("2.5") and r.torch.variant == "rocm6.2"


@pytest.mark.parametrize(
    ("kw", "error", "text"),
    [
        (
            {"gpu": "RX 7900 XTX", "python": "3.7"},
            MatrixError,
            "no torch ROCm wheel exists for Python 3.7",
        ),
        ({"gpu": "RX 7900 XTX", "cuda": "cu128"}, UsageError, "runs ROCm, not CUDA"),
        ({"gpu": "RX 7900 XTX", "rocm": "banana"}, UsageError, "not a ROCm variant"),
        (
            {"gpu": "RX 7900 XTX", "rocm": "rocm5.7"},
            MatrixError,
            "no torch ROCm wheel matches --rocm rocm5.7",
        ),
        ({"gpu": "1002:ffff"}, UsageError, "not in egpu-setup's ROCm table"),
        ({"rocm": "rocm7.2"}, UsageError, "no AMD GPU found or named"),
        ({"gpu": "RX 7900 XTX", "platform": "wsl"}, UnsupportedHardware, "Linux only"),
    ],
)
def test_errors(kw: dict[str, str], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        resolve(None, None, what_if(**kw))


def test_cli_errors_have_hints_and_exit_2() -> None:
    done = invoke("resolve", "--gpu", "RX 7900 XTX", "--distro", "ubuntu-24.04", "--python", "3.7")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: no torch ROCm wheel exists for Python 3.7")
    assert lines[1].startswith("hint: ")


def test_cli_what_if_prints_the_rocm_plan() -> None:
    done = invoke("resolve", "--gpu", "RX 9070 XT", "--distro", "ubuntu-24.04", "--python", "3.12")
    assert done.returncode == 0, done.stderr
    assert "amdgpu, in the kernel: no driver to install" in done.stdout
    assert "--index-url https://download.pytorch.org/whl/rocm" in done.stdout


def test_amd_profile_with_no_amd_gpu_detected_plans_for_its_card() -> None:
    from egpu_setup.profile.load import load_profile

    profile = load_profile("rx9070xt")
    r = resolve(None, profile, what_if())
    assert r.gpu is not None and r.gpu.pci_id == "1002:7550"
    assert r.driver.action == "in-kernel" and r.torch.variant.startswith("rocm")
    assert any("planning for the profile's GPU (Radeon RX 9070 XT" in w for w in r.warnings)
    # a detected AMD eGPU wins over the profile's card, as a detected NVIDIA one does
    r = resolve(amd_host("744c", "oculink"), profile, Constraints())
    assert r.gpu is not None and r.gpu.pci_id == "1002:744c"
    assert not any("profile's GPU" in w for w in r.warnings)
    # an NVIDIA profile never plans ROCm when no AMD GPU is there
    r = resolve(None, load_profile("rtx4090"), what_if())
    assert r.driver.action != "in-kernel"


def test_every_shipped_amd_profile_agrees_with_the_rocm_table() -> None:
    from egpu_setup.profile.load import iter_profiles
    from egpu_setup.resolve.rocm import profile_gfx_problem

    amd = [p for _, p in iter_profiles() if not isinstance(p, Exception) and p.gpu.vendor == "amd"]
    assert {p.name for p in amd} >= {"rx7900xtx", "rx9070xt", "w7900"}
    assert [profile_gfx_problem(p) for p in amd] == [None] * len(amd)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("gfx: gfx1100", "gfx: gfx1201"), "gpu.gfx: 1002:744c is gfx1100, not gfx1201"),
        (('device_ids: ["744c"]', 'device_ids: ["ffff"]'), "1002:ffff is not in"),
    ],
)
def test_an_amd_profile_the_rocm_table_contradicts_is_refused(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    body = (Path(__file__).parents[2] / "profiles" / "rx7900xtx.yaml").read_text()
    (tmp_path / "lab.yaml").write_text(
        body.replace(*change).replace("name: rx7900xtx", "name: lab")
    )
    done = invoke("resolve", "--profile", str(tmp_path / "lab.yaml"), "--distro", "debian-12")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    err, hint = done.stderr.splitlines()[:2]
    assert message in err and hint.startswith("hint: use the device ids"), done.stderr


def test_drift_of_an_amd_machine_names_amdgpu_not_a_branch() -> None:
    from egpu_setup.compat.matrix import load_snapshot
    from egpu_setup.profile.load import load_profile
    from egpu_setup.resolve.drift import drift

    m = load_snapshot()
    d = drift("lab", amd_host("744c", "oculink"), load_profile("rx7900xtx"), Constraints(), m, m)
    assert d.shipped.driver == "amdgpu in the kernel (firmware firmware-amd-graphics)"
    assert "branch None" not in d.text() and not d.changed
