"""The README's first command, verbatim, as root on a stock Debian 12 (a debootstrap root).

A stock Debian 12 has python3 but not python3-venv, and its pip refuses the system Python (PEP
668); the command must still leave a root-owned `egpu-setup` on PATH and print the plan. The
Python packages come from this machine's own pip configuration (downloaded here into a folder the
root's pip reads with --no-index), so the test needs no index inside the root.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from helpers.debroot import DebrootUnavailable, copy_root

pytestmark = pytest.mark.debootstrap
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
       "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"}  # fmt: skip


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start\n.*?```sh\n(.*?)```", text, re.S)
    assert block, "README has no Quick start code block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def chroot(
    root: Path, script: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(root), "bash", "-c", script],
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def stock_debian12(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        root = copy_root("bookworm", tmp_path_factory.mktemp("stock") / "root")
    except DebrootUnavailable as exc:
        pytest.skip(str(exc))
    res = chroot(root, "apt-get install -y -q --no-install-recommends python3")
    assert res.returncode == 0, res.stderr[-2000:]
    return root


def test_readme_first_command_installs_a_root_owned_tool_and_plans(
    stock_debian12: Path, tmp_path: Path
) -> None:
    root = stock_debian12
    assert chroot(root, "python3 -c 'import ensurepip'").returncode != 0, "not a stock Debian 12"
    # The checkout, as a user would have cloned it (no venvs, no caches).
    shutil.copytree(REPO, root / "src", symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".ci", "__pycache__", "*.egg-info", "build", "dist", ".*_cache"))  # fmt: skip
    wheels = root / "wheels"
    dl = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), "--only-binary=:all:",
         "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation",
         "cp", "setuptools>=77", "wheel", *_dependencies()],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if dl.returncode != 0:
        pytest.skip(f"this machine's pip index is unreachable: {dl.stderr[-300:]}")
    first = readme_commands()[0]
    res = chroot(root, f"cd /src && {first}", {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "Plan (" in res.stdout and "torch" in res.stdout, res.stdout
    # Root-owned all the way: the link, the venv, its interpreter and its site-packages.
    link = root / "usr/local/bin/egpu-setup"
    assert os.readlink(link) == "/opt/egpu-setup/tool/bin/egpu-setup"
    for dirpath, dirnames, filenames in os.walk(root / "opt/egpu-setup"):
        for name in [*dirnames, *filenames, ""]:
            st = (Path(dirpath) / name).lstat()
            assert st.st_uid == 0, (dirpath, name)
            if not stat.S_ISLNK(st.st_mode):
                assert not st.st_mode & 0o022, (dirpath, name, oct(st.st_mode))
    version = chroot(root, "egpu-setup --version")
    assert version.returncode == 0 and "egpu-setup, version" in version.stdout
    page = os.readlink(root / "usr/local/share/man/man1/egpu-setup.1")
    assert page == "/opt/egpu-setup/tool/share/man/man1/egpu-setup.1"
    assert (root / page.lstrip("/")).read_text().startswith(".TH EGPU-SETUP 1")
    assert (
        "_egpu_setup_completion"
        in (root / "usr/local/share/bash-completion/completions/egpu-setup").read_text()
    )
    # The tool was copied into the venv: editing the checkout changes nothing root runs.
    assert (
        "/src/"
        not in chroot(
            root,
            "egpu-setup --help >/dev/null; "
            "/opt/egpu-setup/tool/bin/python -c 'import egpu_setup; print(egpu_setup.__file__)'",
        ).stdout
    )


def test_install_script_refuses_a_non_root_user(stock_debian12: Path) -> None:
    shutil.copytree(REPO / "scripts", stock_debian12 / "src2/scripts", dirs_exist_ok=True)
    (stock_debian12 / "src2/pyproject.toml").write_text("")
    res = chroot(stock_debian12, "setpriv --reuid=65534 --regid=65534 --clear-groups "
                                 "bash /src2/scripts/install.sh")  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.startswith("error: installing egpu-setup system-wide needs root")
    assert "\nhint: " in res.stderr


def _dependencies() -> list[str]:
    if sys.version_info < (3, 11):  # mypy checks as the oldest Python the package supports
        pytest.skip("reading pyproject.toml needs Python 3.11's tomllib")
    else:
        import tomllib

        project: dict[str, list[str]] = tomllib.loads((REPO / "pyproject.toml").read_text())[
            "project"
        ]
        return project["dependencies"]
