"""Wheel file names are read by packaging.utils.parse_wheel_filename, in the index reader
(compat/fetch.py) and in pasted text (compat/glibc.py)."""

from __future__ import annotations

import pytest

from egpu_setup.compat import fetch
from egpu_setup.compat.glibc import parse_glibc_report


def _page(*names: str) -> str:
    return "<html><body>" + "".join(f'<a href="/whl/{n}">x</a>' for n in names) + "</body></html>"


def test_a_compressed_tag_set_counts_for_each_of_its_tags() -> None:
    """PEP 425's compressed tag sets (manylinux_2_17_x86_64.manylinux2014_x86_64), which the
    regex before it could not read."""
    page = _page(
        "torch-2.4.1%2Bcu121-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "torch-2.4.1%2Bcu121-cp312-cp312-linux_x86_64.whl",
    )
    assert fetch.parse_index(page) == {"2.4.1": {"cu121": ["3.11", "3.12"]}}


@pytest.mark.parametrize(
    "name",
    [
        "torch-2.4.1%2Bcu121-cp312-cp312-manylinux_2_28_aarch64.whl",  # another machine
        "torch-2.4.1%2Brocm6.1-cp312-cp312-linux_x86_64.whl",  # not a CUDA/CPU build
        "torch-2.4.1rc1%2Bcu121-cp312-cp312-linux_x86_64.whl",  # a release candidate
        "torch-2.4.1.post1%2Bcu121-cp312-cp312-linux_x86_64.whl",
        "torch-2.4%2Bcu121-cp312-cp312-linux_x86_64.whl",  # not X.Y.Z
        "torch-1.13.1%2Bcu117-cp310-cp310-linux_x86_64.whl",  # before the matrix
        "torchvision-0.19.1%2Bcu121-cp312-cp312-linux_x86_64.whl",
        "torch-2.4.1%2Bcu121-py3-none-any.whl",
        "torch-2.4.1%2Bcu121-cp312-abi3-linux_x86_64.whl",
        "torch-2.4.1%2Bcu121-cp312-cp312-linux_x86_64.tar.gz",
        "torch-not-a-version%2Bcu121-cp312-cp312-linux_x86_64.whl",
        "torch-2.4.1%2Bcu121-cp312.whl",  # too few parts
    ],
)
def test_a_wheel_the_resolver_cannot_use_is_skipped(name: str) -> None:
    page = _page(name, "torch-2.5.0%2Bcpu-cp312-cp312-linux_x86_64.whl")
    assert fetch.parse_index(page) == {"2.5.0": {"cpu": ["3.12"]}}


@pytest.mark.parametrize(
    ("text", "tag", "torch", "python"),
    [
        (
            "ERROR: torch-2.7.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl is not a supported",
            "manylinux_2_28_x86_64",
            "2.7.1+cu128",
            "3.12",
        ),
        (
            "see https://host.invalid/whl/cu118/torch-2.7.0%2Bcu118-cp311-cp311-"
            "manylinux_2_28_x86_64.whl and then torch-2.6.0-cp39-cp39-linux_x86_64.whl",
            "linux_x86_64",  # the first *valid* name: the %2B one is not a file name
            "2.6.0",
            "3.9",
        ),
        ("`six-1.16.0-py2.py3-none-any.whl`", "any", None, None),
        ("no-wheel-here.whl and torch.whl", None, None, None),
    ],
)
def test_the_first_valid_wheel_name_in_a_paste(
    text: str, tag: str | None, torch: str | None, python: str | None
) -> None:
    report = parse_glibc_report(text)
    assert (report.wheel_tag, report.torch, report.python) == (tag, torch, python)
