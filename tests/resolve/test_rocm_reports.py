"""resolve against public ROCm failure reports: for the card and torch each thread is about,
resolve gives the answer the thread's fix arrived at, before the user hits the error.

- https://github.com/pytorch/pytorch/issues/132570: an RX 5700 XT (Navi 10, gfx1010) gets
  "RuntimeError: HIP error: invalid device function"; the thread finds the wheels are not built
  for gfx1010 (`roc-obj-ls .../libtorch_hip.so | grep gfx1010` prints nothing). resolve: no
  wheel has gfx1010 kernels and egpu-setup knows no override for it, so it
  refuses with the CPU build as the way out instead of installing a wheel that fails.
- the same thread, an RX 6700 XT (gfx1031) on `torch 2.5.1+rocm6.2` runs with
  `HSA_OVERRIDE_GFX_VERSION=10.3.0`: resolve picks that wheel for `--torch 2.5` and says the
  override, never silently.
- https://github.com/ROCm/legacy-rocm-build/issues/1756: a gfx1032 RDNA 2 GPU
  (hipErrorNoBinaryForGpu) runs with HSA_OVERRIDE_GFX_VERSION=10.3.0: resolve says the same for
  the RX 6600 family (gfx1032).
"""

from __future__ import annotations

import pytest

from conftest import RunCli
from egpu_setup.errors import MatrixError
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolver import resolve


def what_if(**kw: str) -> Constraints:
    return Constraints(**{"distro": "ubuntu-24.04", "python": "3.12", **kw})  # type: ignore[arg-type]


def test_rx5700xt_gfx1010_is_refused_as_the_wheels_lack_it(cli: RunCli) -> None:
    with pytest.raises(MatrixError, match="no torch ROCm wheel has kernels for gfx1010") as e:
        resolve(None, None, what_if(gpu="RX 5700 XT"))
    assert "no HSA_OVERRIDE_GFX_VERSION stand-in is known" in e.value.message
    assert e.value.hint == "pass --cuda cpu for the CPU build"
    done = cli("resolve", "--gpu", "1002:731f", "--distro", "ubuntu-24.04", "--python", "3.12")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines()[0].startswith("error: no torch ROCm wheel has kernels for")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("gpu", "torch", "want"),
    [
        ("RX 6700 XT", "2.5", ("2.5.1", "rocm6.2")),  # pytorch/pytorch#132570's comment
        ("RX 6600", None, None),  # ROCm/legacy-rocm-build#1756 (gfx1032)
    ],
)
def test_rdna2_cards_without_their_own_kernels_get_the_override_the_threads_used(
    gpu: str, torch: str | None, want: tuple[str, str] | None
) -> None:
    r = resolve(None, None, what_if(gpu=gpu, **({"torch_spec": torch} if torch else {})))
    assert r.torch is not None and r.torch.variant.startswith("rocm")
    if want is not None:
        assert (r.torch.version, r.torch.variant) == want
    assert any("HSA_OVERRIDE_GFX_VERSION=10.3.0" in w for w in r.warnings), r.warnings
    assert any("only gfx1030" in x for x in r.reasons), r.reasons
