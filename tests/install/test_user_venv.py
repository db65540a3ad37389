"""`egpu-setup venv PATH` for real: a root-owned torch venv (this run's torch, hard-linked into a
venv made by /usr/bin/python3), then the command run as `nobody` through runuser, the user's
venv importing that torch, pip installing a wheel into it, and the torch venv unchanged and not
writable by that user. Each refusal is run too, with nothing left on disk."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from egpu_setup.plan.steps import PipInstall
from egpu_setup.state.reports import save_report
from helpers import pypi_index
from helpers.cli_runner import invoke
from helpers.venvs import site_packages, torch_site_packages

pytestmark = pytest.mark.slow
SYSTEM_PYTHON = "/usr/bin/python3"
CHECKOUT = Path(__file__).resolve().parents[2]


def _need() -> None:
    if shutil.which("runuser") is None or not Path(SYSTEM_PYTHON).exists() or os.geteuid():
        pytest.skip("needs root, runuser and the system python3 (.ci/run runs as root)")


def _torch_venv(where: Path) -> Path:
    """A root-owned venv of the system Python whose site-packages hold this run's torch and
    its dependencies as hard links (no copy of a gigabyte; the same files, root's, 0644)."""
    venv = where / "torch-venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = site_packages(venv)
    for entry in torch_site_packages().iterdir():
        if entry.suffix == ".pth" or entry.name.startswith(("__editable__", "egpu_setup")):
            continue
        subprocess.run(["cp", "-al", str(entry), str(site)], check=True)
    return venv


def _report(state: Path, venv: Path, *, ok: bool = True) -> None:
    step = PipInstall(str(venv), ("torch==2.13.0",), "http://127.0.0.1/simple", True, "python3")
    data = {"schema": "egpu-setup/install/1", "ok": ok, "verify_ok": ok, "steps": [step.to_json()]}
    save_report(state, "install", data, time.time())


@pytest.fixture(scope="module")
def lab() -> Iterator[Path]:
    _need()
    # under /tmp, not tmp_path: nobody cannot enter root's 0700 pytest directories
    base = Path(tempfile.mkdtemp(prefix="egpu-setup-uvenv-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        _torch_venv(base)
        (base / "state").mkdir(mode=0o755)
        _report(base / "state", base / "torch-venv")
        home = base / "home"
        home.mkdir()
        nobody = pwd.getpwnam("nobody")
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        yield base
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def as_nobody(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """argv as nobody, in an environment of PATH, HOME and `env` alone."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **env}
    pairs = [f"{k}={v}" for k, v in env.items()]
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", "/usr/bin/env", "-i", *pairs, *argv],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=600,
    )


def egpu_setup(
    *args: str, state: Path, home: str = "/nonexistent"
) -> subprocess.CompletedProcess[str]:
    """This checkout's egpu-setup as nobody, by the system Python (the test venv's interpreter
    lies under root's 0700 home), its dependencies from the test venv."""
    deps = next((CHECKOUT / ".ci" / "venv" / "lib").glob("python3.*/site-packages"))
    return as_nobody(
        SYSTEM_PYTHON,
        "-m",
        "egpu_setup",
        *args,
        PYTHONPATH=f"{CHECKOUT}:{deps}",
        EGPU_SETUP_STATE_DIR=str(state),
        HOME=home,
    )


def fingerprint(tree: Path) -> list[tuple[str, int, int, int, int, int]]:
    out = []
    for dirpath, dirs, files in os.walk(tree):
        for name in sorted(dirs + files):
            st = os.lstat(os.path.join(dirpath, name))
            rel = os.path.relpath(os.path.join(dirpath, name), tree)
            out.append((rel, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ino))
    return sorted(out)


def test_nobody_gets_a_venv_on_the_root_torch(lab: Path) -> None:
    root_venv = lab / "torch-venv"
    before = fingerprint(root_venv)
    target = lab / "home" / "env"
    made = egpu_setup("venv", str(target), state=lab / "state")
    assert made.returncode == 0, made.stderr
    assert f"venv: {target}" in made.stdout
    assert f"torch=={metadata.version('torch')}" in made.stdout
    assert os.stat(target).st_uid == pwd.getpwnam("nobody").pw_uid
    py = str(target / "bin" / "python")
    where = as_nobody(py, "-c", "import torch, sys; print(torch.__file__); print(sys.prefix)")
    assert where.returncode == 0, where.stderr
    torch_file, prefix = where.stdout.split()
    assert torch_file.startswith(str(site_packages(root_venv)))
    assert prefix == str(target)
    # the user's pip installs into the user's venv (a wheel of their own, offline)
    wheels = lab / "home" / "wheels"
    subprocess.run(["runuser", "-u", "nobody", "--", "mkdir", str(wheels)], check=True)
    whl = pypi_index.build_wheel(wheels, "egpu-probe", "1.0", "VALUE = 7\n")
    os.chmod(whl, 0o644)
    pip = as_nobody(
        py, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "egpu-probe"
    )
    assert pip.returncode == 0, pip.stderr
    probe = as_nobody(py, "-c", "import egpu_probe; print(egpu_probe.__file__)")
    assert probe.stdout.strip().startswith(str(site_packages(target)))
    # torch is pinned at the verified version for the user's pip
    constraints = (target / "egpu-setup-constraints.txt").read_text()
    assert f"torch=={metadata.version('torch')}\n" in constraints
    assert f"constraint = {target}/egpu-setup-constraints.txt" in (target / "pip.conf").read_text()
    # a torch of the user's own would shadow the verified one: pip refuses it, naming why
    pypi_index.build_wheel(wheels, "torch", "99.0").chmod(0o644)
    other = as_nobody(
        py, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "torch==99.0"
    )
    assert other.returncode != 0 and "torch==99.0" in other.stdout + other.stderr
    assert not list(site_packages(target).glob("torch*"))
    # verify --venv checks it, the torch it imports being the root venv's
    check = verify_as_student(lab, target)
    assert check.returncode == 0, check.stderr
    # the torch venv: unchanged, and the user cannot write to it
    assert fingerprint(root_venv) == before
    write = as_nobody("/usr/bin/touch", f"{site_packages(root_venv)}/planted")
    assert write.returncode != 0 and not (site_packages(root_venv) / "planted").exists()


def verify_as_student(lab: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """`verify --venv TARGET --device cpu --quick --json`, as the student runs it."""
    return egpu_setup(
        "verify",
        "--venv",
        str(target),
        "--device",
        "cpu",
        "--quick",
        "--json",
        state=lab / "state",
        home=str(lab / "home"),  # verify keeps its state in the user's own home
    )


def test_nobody_installs_from_the_loopback_index_then_verifies(lab: Path) -> None:
    """The term's path end to end, as a student: `egpu-setup venv` on the root-owned torch venv,
    the user's pip fetching a wheel of their own from a PEP 503 index on 127.0.0.1 (the shape of
    a lab mirror, pages and sha256 fragments included), then `verify --venv` in that venv."""
    root_venv = lab / "torch-venv"
    before = fingerprint(root_venv)
    target = lab / "home" / "thesis"
    made = egpu_setup("venv", str(target), state=lab / "state")
    assert made.returncode == 0, made.stderr
    py = str(target / "bin" / "python")
    built = Path(tempfile.mkdtemp(prefix="egpu-setup-uvenv-wheels-"))
    try:
        whl = pypi_index.build_wheel(built, "egpu-probe", "2.0", "VALUE = 11\n")
        with pypi_index.LocalIndex([whl]) as index:
            pip = as_nobody(
                py,
                "-m",
                "pip",
                "install",
                "--no-cache-dir",
                "--index-url",
                index.url,
                "egpu-probe",
            )
            served = index.requests
    finally:
        shutil.rmtree(built)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert "/simple/egpu-probe/" in served
    assert f"/files/{whl.name}" in served
    probe = as_nobody(py, "-c", "import egpu_probe; print(egpu_probe.VALUE, egpu_probe.__file__)")
    value, where = probe.stdout.split()
    assert value == "11" and where.startswith(str(site_packages(target)))
    check = verify_as_student(lab, target)
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)
    assert report["ok"] is True
    assert fingerprint(root_venv) == before


def _refused(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert any(line.startswith("error: ") and text in line for line in lines), result.stderr
    assert any(line.startswith("hint: ") for line in lines), result.stderr
    assert "Traceback" not in result.stderr


def test_no_verified_torch_venv(lab: Path) -> None:
    empty = lab / "empty-state"
    empty.mkdir(mode=0o755, exist_ok=True)
    _report(empty, lab / "torch-venv", ok=False)  # a failed install names no verified venv
    target = lab / "home" / "none"
    _refused(egpu_setup("venv", str(target), state=empty), "no verified torch venv installed")
    assert not os.path.lexists(target)


def test_path_not_empty(lab: Path) -> None:
    target = lab / "home" / "full"
    subprocess.run(["runuser", "-u", "nobody", "--", "mkdir", "-p", f"{target}/mine"], check=True)
    _refused(egpu_setup("venv", str(target), state=lab / "state"), "exists and is not empty")
    assert sorted(os.listdir(target)) == ["mine"]


def test_python_minor_differs(lab: Path) -> None:
    """A torch venv built for another Python minor than its base interpreter is now (as after a
    distribution upgrade moved /usr/bin/python3 on): its site-packages would not import."""
    state = lab / "other-state"
    state.mkdir(mode=0o755, exist_ok=True)
    other = lab / "other" / "torch-venv"
    other.parent.mkdir(mode=0o755, exist_ok=True)
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(other)], check=True)
    (lib,) = (other / "lib").glob("python3.*")
    lib.rename(lib.with_name("python3.99"))
    _report(state, other)
    target = lab / "home" / "mismatch"
    _refused(egpu_setup("venv", str(target), state=state), "is for Python 3.99")
    assert not os.path.lexists(target)


def test_root_is_refused(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGPU_SETUP_STATE_DIR", str(lab / "state"))
    target = lab / "root-env"
    _refused(invoke("venv", str(target)), "root never runs a user's code")
    assert not os.path.lexists(target)


def test_verify_as_a_user_with_no_writable_home_says_so(lab: Path) -> None:
    """nobody's HOME is /nonexistent and the state directory is root's: verify has nowhere to
    keep its state, and says so (exit 1, error and hint), where it crashed with an internal
    error (exit 70)."""
    res = egpu_setup(
        "verify", "--venv", str(lab / "torch-venv"), "--device", "cpu", "--quick",
        state=lab / "state",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    lines = res.stderr.splitlines()
    assert any(ln.startswith("error: ") and "verify's state" in ln for ln in lines), res.stderr
    assert any(ln.startswith("hint: ") and "XDG_STATE_HOME" in ln for ln in lines), res.stderr
    assert "Traceback" not in res.stderr
