"""What a user gets from `pip install .`: every module, template, profile and data file."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, RunCli


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return next(out.glob("egpu_setup-*.whl"))


def test_wheel_ships_every_module_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(REPO).as_posix() for p in (REPO / "egpu_setup").rglob("*.py")}
    expected |= {f"egpu_setup/data/{p.name}" for p in (REPO / "egpu_setup/data").glob("*.yaml")}
    # and the compiled form the program reads (egpu_setup/compat/shipped.py)
    expected |= {
        f"egpu_setup/data/compiled/{p.stem}.json" for p in (REPO / "egpu_setup/data").glob("*.yaml")
    }
    expected |= {
        "egpu_setup/templates/" + p.relative_to(REPO / "templates").as_posix()
        for p in (REPO / "templates").rglob("*.j2")
    }
    expected |= {f"egpu_setup/profile_files/{p.name}" for p in (REPO / "profiles").glob("*.yaml")}
    missing = sorted(n for n in expected if "__pycache__" not in n and n not in names)
    assert missing == []
    # The loader package and the shipped profiles stay apart: the YAML files are package data of
    # egpu_setup.profile_files, the loader is egpu_setup.profile.
    assert "egpu_setup/profile/__init__.py" in names
    assert "egpu_setup/profile_files/rtx4090.yaml" in names
    assert not any(n.startswith("egpu_setup/profiles/") for n in names)


@pytest.mark.slow
def test_clean_venv_runs_the_quick_start(wheel: Path, tmp_path: Path) -> None:
    """The README's first command, from a wheel in a fresh venv, run from an unrelated directory."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    res = subprocess.run(
        [str(venv / "bin/egpu-setup"), "install", "--profile", "rtx4090", "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "torch" in res.stdout


def test_wheel_ships_the_man_page(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".data/data/share/man/man1/egpu-setup.1") for n in names), names


def test_the_man_page_is_generated_from_the_current_help() -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts/make_manpage.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    page = (REPO / "docs/egpu-setup.1").read_text()
    for name in ("install", "verify", "rollback", "report", "bundle"):
        assert f"\\fBegpu-setup {name}\\fR" in page
    assert "\\-\\-profile" in page or "--profile" in page


def test_version_from_the_command_and_from_python_m(cli: RunCli) -> None:
    from egpu_setup import __version__

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"egpu-setup, version {__version__}"
    direct = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from egpu_setup.cli import main; sys.argv=['x', '--version']; main()",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert direct.stdout == res.stdout


def _complete(words: str, cword: int) -> list[str]:
    env = {
        **os.environ,
        "COMP_WORDS": words,
        "COMP_CWORD": str(cword),
        "_EGPU_SETUP_COMPLETE": "bash_complete",
    }
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup"], capture_output=True, text=True, env=env, check=False
    )
    assert res.returncode == 0, res.stderr
    return [line.split(",", 1)[1] for line in res.stdout.splitlines()]


def test_shell_completion_completes_profile_names_and_commands() -> None:
    assert _complete("egpu-setup install --profile rtx40", 3) == [
        "rtx4070",
        "rtx4070super",
        "rtx4080",
        "rtx4080super",
        "rtx4090",
    ]
    assert "generic-nvidia" in _complete("egpu-setup render --profile ''", 3)
    assert _complete("egpu-setup verify --profile gtx", 3) == ["gtx1080ti"]
    assert _complete("egpu-setup ins", 1) == ["install"]
    # A path is completed by the shell as a file, not as a profile name.
    assert _complete("egpu-setup install --profile ./my", 3) == ["./my"]


def test_bash_completion_script_is_generated(tmp_path: Path) -> None:
    env = {**os.environ, "_EGPU_SETUP_COMPLETE": "bash_source"}
    res = subprocess.run(
        [sys.executable, "-m", "egpu_setup"], capture_output=True, text=True, env=env, check=False
    )
    assert res.returncode == 0 and "complete -o nosort -F" in res.stdout
    script = tmp_path / "egpu-setup.bash"
    script.write_text(res.stdout)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


@pytest.mark.slow
def test_sdist_carries_its_tests_and_they_pass(tmp_path: Path) -> None:
    """The sdist, unpacked anywhere, installs and runs its own tests (a distribution packager's
    check). Its dependencies come from this run's environment; egpu-setup from the sdist alone."""
    import tarfile

    from helpers.venvs import make_venv

    build = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    sdist = tmp_path / build.stdout.split()[-1]
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "src", filter="data")
    top = sdist.name.removesuffix(".tar.gz")
    for wanted in ("LICENSE", "tests/conftest.py", "tests/fixtures/hosts", "docs/egpu-setup.1",
                   "scripts/install.sh", "templates/udev", "profiles/rtx4090.yaml"):  # fmt: skip
        assert f"{top}/{wanted}" in names, wanted
    assert not any("/.ci/venv/" in n or "__pycache__" in n for n in names)
    src = tmp_path / "src" / top
    venv = make_venv(tmp_path / "v", with_torch=True)
    py = str(venv / "bin/python")
    pip = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(src)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    res = subprocess.run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
         "tests/detect/test_parse_lspci.py", "tests/profile/test_profiles.py",
         "tests/detect/test_recorded_hosts.py"],
        cwd=src,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    where = subprocess.run(
        [py, "-c", "import egpu_setup; print(egpu_setup.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(venv)), where.stdout
