"""The wheels egpu-setup keeps of itself (state/tool_wheels.py) and the copy pip installs from
(execute/tool.py): only listed files, each by its sha256, never a source tree or a name."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.execute.tool import private_copy
from egpu_setup.host.machine import RootHost
from egpu_setup.image.tool import choose_tool
from egpu_setup.plan.steps import InstallTool
from egpu_setup.state import tool_wheels
from egpu_setup.state.tool_wheels import KEPT, SUMS, for_python, parse_sums, requirements

A = "a" * 64
B = "b" * 64
C = "c" * 64


def test_a_sums_line_is_a_hash_two_spaces_or_a_star_and_a_wheel_name() -> None:
    text = f"{A}  egpu_setup-1.0-py3-none-any.whl\n{B} *click-8.2.0-py3-none-any.whl\n"
    assert parse_sums(text, "SUMS") == (
        ("click-8.2.0-py3-none-any.whl", B),
        ("egpu_setup-1.0-py3-none-any.whl", A),
    )


@pytest.mark.parametrize(
    "line",
    [
        f"{A}  ../evil-1.0-py3-none-any.whl",  # leaves the folder
        f"{A}  notes.txt",  # not a wheel: pip would never see it, so it is an error
        f"{A[:-1]}  x-1.0-py3-none-any.whl",  # a short hash
        f"{A.upper()}  x-1.0-py3-none-any.whl",  # sha256sum writes lower case
        "",
    ],
)
def test_any_other_line_is_refused(line: str) -> None:
    with pytest.raises(UsageError, match="line 2"):
        parse_sums(f"{A}  ok-1.0-py3-none-any.whl\n{line}\n", "SUMS")


def test_a_python_gets_the_wheels_built_for_it_and_the_newest_of_each() -> None:
    files = [
        ("markupsafe-3.0.2-cp311-cp311-manylinux_2_17_x86_64.whl", A),
        ("markupsafe-3.0.2-cp313-cp313-manylinux_2_17_x86_64.whl", B),
        ("click-8.1.0-py3-none-any.whl", A),
        ("click-8.2.0-py3-none-any.whl", B),
        ("charset_normalizer-3.4.0-cp38-abi3-manylinux_2_17_x86_64.whl", C),
        ("egpu_setup-0.1.0-py3-none-any.whl", C),
        ("README.txt", A),
    ]
    got = {(w.name, w.version, w.sha256) for w in for_python(files, "3.11")}
    assert got == {
        ("markupsafe", "3.0.2", A),
        ("click", "8.2.0", B),
        ("charset-normalizer", "3.4.0", C),  # the stable ABI of an older CPython
        ("egpu-setup", "0.1.0", C),
    }
    assert {w.sha256 for w in for_python(files, "3.13") if w.name == "markupsafe"} == {B}
    assert "markupsafe" not in {w.name for w in for_python(files, "3.10")}


def test_the_requirements_pin_every_wheel_by_version_and_hash() -> None:
    files = [
        ("egpu_setup-0.1.0-py3-none-any.whl", A),
        ("pyyaml-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl", B),
        ("pyyaml-6.0.2-cp311-cp311-musllinux_1_1_x86_64.whl", C),
    ]
    assert requirements(files, "3.11") == (
        f"egpu-setup==0.1.0 --hash=sha256:{A}\npyyaml==6.0.2 --hash=sha256:{B} --hash=sha256:{C}\n"
    )


def _kept(folder: Path, wheels: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in wheels.items():
        (folder / name).write_bytes(data)
    (folder / SUMS).write_text(
        "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted(wheels.items()))
    )
    return folder


WHEELS = {"egpu_setup-0.1.0-py3-none-any.whl": b"ours", "click-8.2.0-py3-none-any.whl": b"cli"}


def test_kept_wheels_are_found_beside_the_prefix_only_when_root_owns_them(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    folder = _kept(tmp_path / KEPT, WHEELS)
    kept = tool_wheels.own(str(tmp_path))
    assert kept is not None and kept.directory == str(folder)
    assert [name for name, _ in kept.files] == sorted(WHEELS)
    assert tool_wheels.own(str(tmp_path / "elsewhere")) is None
    if os.geteuid() == 0:
        os.chown(folder / SUMS, 65534, 65534)  # a user could rewrite the list: none is kept
        assert tool_wheels.own(str(tmp_path)) is None


def _step(folder: Path, files: tuple[tuple[str, str], ...]) -> InstallTool:
    return InstallTool(
        venv="/opt/egpu-setup/tool", version="0.1.0", python="/usr/bin/python3",
        create_venv=True, wheels_from=str(folder), wheels=files,
    )  # fmt: skip


def test_pip_sees_a_private_copy_of_the_listed_wheels_and_a_file_pinning_them(
    tmp_path: Path,
) -> None:
    folder = _kept(tmp_path / "kept", WHEELS)
    files = parse_sums((folder / SUMS).read_text(), "SUMS")
    (folder / "planted-1.0-py3-none-any.whl").write_bytes(b"a .pth that runs as root")
    with private_copy(_step(folder, files), "3.11") as copy:
        assert sorted(p.name for p in copy.iterdir()) == [*sorted(WHEELS), "requirements.txt"]
        assert oct(copy.stat().st_mode & 0o777) == "0o755" and copy.stat().st_uid == os.geteuid()
        pins = (copy / "requirements.txt").read_text()
        assert "egpu-setup==0.1.0 --hash=sha256:" in pins and "planted" not in pins
    assert not copy.exists()


def test_a_wheel_swapped_after_the_plan_installs_nothing(tmp_path: Path) -> None:
    folder = _kept(tmp_path / "kept", WHEELS)
    files = parse_sums((folder / SUMS).read_text(), "SUMS")
    (folder / "click-8.2.0-py3-none-any.whl").write_bytes(b"someone else's click")
    with (
        pytest.raises(EgpuSetupError, match="is not the wheel the plan checked"),
        private_copy(_step(folder, files), "3.11"),
    ):
        pytest.fail("pip would have run")
    (folder / "click-8.2.0-py3-none-any.whl").write_bytes(WHEELS["click-8.2.0-py3-none-any.whl"])
    link = folder / "egpu_setup-0.1.0-py3-none-any.whl"
    link.unlink()
    link.symlink_to("/etc/hostname")  # a link is not read through
    with (
        pytest.raises(EgpuSetupError, match="unreadable"),
        private_copy(_step(folder, files), "3.11"),
    ):
        pytest.fail("pip would have run")


def test_no_egpu_setup_wheel_for_the_targets_python_is_said_before_pip(tmp_path: Path) -> None:
    folder = _kept(tmp_path / "kept", {"egpu_setup-0.1.0-cp313-none-any.whl": b"x"})
    files = parse_sums((folder / SUMS).read_text(), "SUMS")
    with (
        pytest.raises(EgpuSetupError, match=r"no egpu-setup wheel for Python 3\.11") as err,
        private_copy(_step(folder, files), "3.11"),
    ):
        pytest.fail("pip would have run")
    assert "--bundle" in (err.value.hint or "")


def test_an_image_is_refused_when_this_egpu_setup_keeps_no_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = tmp_path / "image"
    (image / "usr/bin").mkdir(parents=True)
    (image / "usr/bin/python3").symlink_to("python3.11")
    (image / "usr/bin/python3.11").write_text("")
    (image / "usr/lib/python3.11/ensurepip").mkdir(parents=True)
    (image / "usr/lib/python3.11/ensurepip/__init__.py").write_text("")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "an-editable-venv"))
    with pytest.raises(UsageError, match="keeps no wheels of its own") as err:
        choose_tool(RootHost(image), "debian")
    assert "scripts/install.sh" in (err.value.hint or "")
