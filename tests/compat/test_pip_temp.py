"""torch.yaml's `pip_temp`: what the disk-space check adds for pip's temporary directory."""

from __future__ import annotations

import pytest

from egpu_setup.compat import matrix
from egpu_setup.errors import MatrixError


def test_the_shipped_figures_cover_the_measured_wheels() -> None:
    # the sums torch.yaml gives: 202,245,074 bytes of CPU wheels, 3.84 GiB for torch 2.10.0's
    # CUDA wheels (the largest release measured)
    assert matrix.pip_temp_bytes(cpu=True) >= 202_245_074
    assert matrix.pip_temp_bytes(cpu=False) >= 3.84 * 1024**3


@pytest.mark.parametrize("value", [None, "4 GiB", 0, -1, True, 4.5])
def test_a_damaged_figure_is_named(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "load_data", lambda name: {"pip_temp": {"cuda_bytes": value}})
    with pytest.raises(MatrixError) as err:
        matrix.pip_temp_bytes(cpu=False)
    assert err.value.message.startswith("egpu_setup/data/torch.yaml: pip_temp.cuda_bytes: ")
