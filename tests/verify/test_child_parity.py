"""The verify child keeps its own copies of two rules (it runs in the target venv, where
egpu_setup cannot be imported): they must agree with the package's, on real inputs.

- which compiled code runs a GPU (CUDA binary compatibility): compat.versions.ArchList.runs
  against the child's arch_covers, over every arch list of the shipped matrix and every compute
  capability of its architectures;
- the PCI bus id form: detect.lspci.normalize_pci_address against the child's normalize_bus_id.
"""

from __future__ import annotations

import pytest

from egpu_setup.compat.matrix import load_snapshot
from egpu_setup.compat.versions import ArchList, ComputeCapability
from egpu_setup.detect.lspci import normalize_pci_address
from egpu_setup.verify import _child as child

STATUS = {"sass": "pass", "ptx": "warn", None: "fail"}


def as_torch_reports(arch: ArchList) -> list[str]:
    """The arch list as torch.cuda.get_arch_list() reports a build: sm_XY per cubin, and
    compute_XY for each capability shipped as PTX."""
    sms = [f"sm_{c.major}{c.minor}" for c in arch.cubins]
    return sms + [f"compute_{c.major}{c.minor}" for c in arch.ptx]


def _capabilities() -> list[ComputeCapability]:
    m = load_snapshot()
    seen = {a.cc_min for a in m.architectures} | {a.cc_max for a in m.architectures}
    for a in m.architectures:  # every minor inside each range, and one past its top
        seen |= {ComputeCapability(a.cc_min.major, n) for n in range(a.cc_max.minor + 2)}
    return sorted(seen, key=lambda c: (c.major, c.minor))


def _arch_lists() -> list[ArchList]:
    lists = {str(v.arch): v.arch for t in load_snapshot().torch for v in t.variants if v.arch}
    # and PTX in the middle and at the top, as TORCH_CUDA_ARCH_LIST allows (+PTX)
    for extra in ("5.0;6.0+PTX;8.0", "7.5;8.6;9.0+PTX"):
        lists[extra] = ArchList.from_str(extra)
    return [lists[k] for k in sorted(lists)]


@pytest.mark.parametrize("arch", _arch_lists(), ids=str)
def test_the_child_judges_every_shipped_arch_list_as_the_resolver_does(arch: ArchList) -> None:
    reported = as_torch_reports(arch)
    for cc in _capabilities():
        status, _detail = child.arch_covers(reported, (cc.major, cc.minor))
        assert status == STATUS[arch.runs(cc)], (str(arch), str(cc), reported)


@pytest.mark.parametrize(
    "text",
    ["00000000:3C:00.0", "0000:3c:00.0", "3c:00.0", "01:00.0", "10000:E1:00.0", "0001:00:02.1"],
)
def test_the_child_writes_a_bus_id_as_detection_does(text: str) -> None:
    assert child.normalize_bus_id(text) == normalize_pci_address(text)
