"""Hostile: root never runs what a user can change (egpu_setup/host/trust.py).

Each case builds, in a temp dir, a Python environment owned (in part) by `nobody` with a `.pth`
file in it: site(7) runs the `import` lines of every .pth file at startup, so the .pth reports
which uid the interpreter ran as. Root runs `doctor --venv`, `record --venv` and `verify` on it
for real; the .pth must report nobody's uid (or nothing at all, when the run is refused), and a
sentinel tree outside stays as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RunCli
from helpers.sentinel import Sentinel

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks need root")
NOBODY = 65534
PY = "/usr/bin/python3"  # Debian's own interpreter: root-owned, reachable by nobody


@pytest.fixture
def shared() -> Iterator[Path]:
    """A temp dir nobody can reach (pytest's own are 0700 root), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="egpu-setup-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _python_version() -> str:
    out = subprocess.run(
        [PY, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _spy_pth(site: Path, record: Path) -> None:
    """A .pth whose import line writes the uid it runs as into `record`."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "spy.pth").write_text(
        f"import os; open({str(record)!r}, 'w').write(str(os.getuid()))\n"
    )


def _record_dir(base: Path) -> Path:
    d = base / "record"
    d.mkdir()
    d.chmod(0o777 | 0o1000)  # sticky, like /tmp: whoever runs may write its record here
    return d


def _chown_tree(path: Path, uid: int = NOBODY) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, uid, uid, follow_symlinks=False)


def _venv(base: Path, *, cfg_in_bin: bool = False) -> Path:
    """A venv by hand: bin/python -> /usr/bin/python3 and a pyvenv.cfg (beside the executable
    when cfg_in_bin: CPython honours both places, PEP 405)."""
    venv = base / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(PY)
    cfg = venv / "bin" / "pyvenv.cfg" if cfg_in_bin else venv / "pyvenv.cfg"
    cfg.write_text(f"home = {os.path.dirname(PY)}\ninclude-system-site-packages = false\n")
    return venv


def _site(prefix: Path) -> Path:
    return prefix / "lib" / f"python{_python_version()}" / "site-packages"


def _ran_as(record: Path) -> int | None:
    spy = record / "uid"
    return int(spy.read_text()) if spy.exists() else None


def _refused_by_doctor_and_verify(cli: RunCli, venv: Path, record: Path, why: str) -> None:
    """`doctor --venv` and `verify --venv` both refuse `venv` (exit 2, error:/hint: saying
    `why`) before any of its code runs."""
    for args in (
        ["doctor", "--venv", str(venv)],
        ["verify", "--device", "cpu", "--quick", "--venv", str(venv), "--timeout", "60"],
    ):
        res = cli(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.startswith("error: ") and "\nhint: " in res.stderr, res.stderr
        assert why in res.stderr and "Traceback" not in res.stderr
        assert _ran_as(record) is None  # refused before anything ran


# -- a user's venv is run as that user ------------------------------------------------------------


@pytest.mark.parametrize("command", ["doctor", "record"])
def test_doctor_and_record_run_a_users_venv_as_that_user(
    cli: RunCli, shared: Path, command: str
) -> None:
    """Was: a .pth in a venv owned by nobody ran as uid 0 (no privilege drop at all)."""
    sentinel = Sentinel(shared / "outside")
    record = _record_dir(shared)
    venv = _venv(shared)
    _spy_pth(_site(venv), record / "uid")
    _chown_tree(venv)
    args = ["doctor", "--venv", str(venv)]
    if command == "record":
        args = ["record", str(shared / "bundle"), "--venv", str(venv)]
    res = cli(*args)
    assert _ran_as(record) == NOBODY, res.stderr
    assert res.returncode == 2 and res.stderr.startswith("error: cannot import torch in ")
    assert "Traceback" not in res.stderr
    assert sentinel.unchanged(), sentinel.changes()


def test_verify_sees_a_pyvenv_cfg_beside_the_executable(cli: RunCli, shared: Path) -> None:
    """Was: bin/pyvenv.cfg and bin/python -> /usr/bin/python3.11 in a nobody-owned venv ran as
    uid 0 (only ../pyvenv.cfg was looked at, and the interpreter stat()ed through its link)."""
    sentinel = Sentinel(shared / "outside")
    record = _record_dir(shared)
    venv = _venv(shared, cfg_in_bin=True)
    _spy_pth(_site(venv), record / "uid")  # site.py: sys.prefix is bin/.. either way
    _chown_tree(venv)
    res = cli(
        "verify", "--device", "cpu", "--quick", "--json", "--venv", str(venv), "--timeout", "60"
    )
    assert _ran_as(record) == NOBODY, res.stderr
    assert res.returncode == 1 and "Traceback" not in res.stderr  # no torch: a failed check
    assert sentinel.unchanged(), sentinel.changes()


def test_verify_python_a_user_owns_runs_as_that_user(cli: RunCli, shared: Path) -> None:
    record = _record_dir(shared)
    wrapper = shared / "userbin" / "python3"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nid -u > {record}/uid\nexec {PY} "$@"\n')
    wrapper.chmod(0o755)
    _chown_tree(wrapper.parent)
    res = cli("verify", "--device", "cpu", "--quick", "--python", str(wrapper), "--timeout", "60")
    assert _ran_as(record) == NOBODY, res.stderr
    assert "Traceback" not in res.stderr


def test_a_users_site_packages_in_a_roots_venv_makes_it_theirs(cli: RunCli, shared: Path) -> None:
    """Root owns the venv, but nobody owns a .pth in its site-packages: nobody runs it."""
    record = _record_dir(shared)
    venv = _venv(shared)
    site = _site(venv)
    _spy_pth(site, record / "uid")
    os.chown(site / "spy.pth", NOBODY, NOBODY)
    res = cli("doctor", "--venv", str(venv))
    assert _ran_as(record) == NOBODY, res.stderr


def test_the_user_site_of_home_is_checked_too(cli: RunCli, shared: Path) -> None:
    """`verify --python` keeps the user site (-E, not -I): under a sudo that kept $HOME, that is
    the user's ~/.local, and root would import it."""
    record = _record_dir(shared)
    home = shared / "home"
    _spy_pth(home / ".local/lib" / f"python{_python_version()}" / "site-packages", record / "uid")
    _chown_tree(home)
    res = cli(
        "verify", "--device", "cpu", "--quick", "--python", PY, "--timeout", "60",
        env={"HOME": str(home)},
    )  # fmt: skip
    assert _ran_as(record) == NOBODY, res.stderr


# -- what no single user can be trusted with is refused, and nothing runs --------------------------


@pytest.mark.parametrize(
    "how",
    ["parent-world-writable", "site-packages-group-writable", "two-owners"],
)
def test_a_venv_others_can_change_is_refused_and_nothing_runs(
    cli: RunCli, shared: Path, how: str
) -> None:
    sentinel = Sentinel(shared / "outside")
    record = _record_dir(shared)
    holder = shared / "holder"
    holder.mkdir()
    venv = _venv(holder)
    site = _site(venv)
    _spy_pth(site, record / "uid")
    if how == "parent-world-writable":
        holder.chmod(0o777)  # not sticky: anyone can swap the venv for their own
    elif how == "site-packages-group-writable":
        site.chmod(0o775)
    else:
        _chown_tree(venv)
        os.chown(site / "spy.pth", 1, 1)  # daemon owns one file, nobody the rest
    _refused_by_doctor_and_verify(cli, venv, record, "root does not run code that other users")
    assert sentinel.unchanged(), sentinel.changes()


def test_a_venv_whose_home_is_gone_is_refused_and_nothing_runs(cli: RunCli, shared: Path) -> None:
    """Was: a pyvenv.cfg `home` that does not exist passed; CPython then searched the folders
    above the executable for a standard library, and found one planted under a sticky /tmp."""
    sentinel = Sentinel(shared / "outside")
    record = _record_dir(shared)
    tmp = shared / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)  # sticky and open to all, as /tmp is: fine as an ancestor, never a home
    venv = _venv(tmp)
    (venv / "pyvenv.cfg").write_text(f"home = {tmp}/gone/bin\n")
    _spy_pth(_site(venv), record / "uid")
    (tmp / "lib" / f"python{_python_version()}").mkdir(parents=True)
    (tmp / "lib" / f"python{_python_version()}" / "os.py").write_text("planted = True\n")
    os.chown(tmp / "lib", NOBODY, NOBODY)  # a user's landmark where the search would look
    _refused_by_doctor_and_verify(cli, venv, record, f"names home = {tmp}/gone/bin, which does not")
    assert sentinel.unchanged(), sentinel.changes()


def test_root_does_not_run_pip_in_a_users_existing_venv(cli: RunCli, shared: Path) -> None:
    """`sudo egpu-setup install --venv THEIRS` (not the sudo user's own): refused before pip,
    the venv's Python, runs as root."""
    record = _record_dir(shared)
    venv = _venv(shared)
    _spy_pth(_site(venv), record / "uid")
    _chown_tree(venv)
    res = cli(
        "install", "--profile", "generic-nvidia", "--only", "torch", "--cuda", "cpu", "--venv",
        str(venv), "--index-url", "http://127.0.0.1:9/simple", "--yes", "--no-verify",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "root does not run its pip" in res.stderr and "hint: " in res.stderr
    assert _ran_as(record) is None


def test_roots_own_venv_still_runs_as_root(cli: RunCli, shared: Path) -> None:
    record = _record_dir(shared)
    venv = _venv(shared)
    _spy_pth(_site(venv), record / "uid")
    res = cli("doctor", "--venv", str(venv))
    assert _ran_as(record) == 0, res.stderr


def test_the_decision_is_one_function_for_every_caller(shared: Path) -> None:
    """host/trust.run_as: None (root's), (uid, gid) (one user's), or a refusal; a link chain is
    followed only after each link was checked."""
    from egpu_setup.errors import UsageError
    from egpu_setup.host.trust import run_as

    venv = _venv(shared)
    python = str(venv / "bin" / "python")
    assert run_as(python) is None
    os.chown(venv / "bin" / "python", NOBODY, NOBODY, follow_symlinks=False)  # the link itself
    assert run_as(python) == (NOBODY, NOBODY)
    hop = shared / "hop"
    hop.mkdir()
    (hop / "python3").symlink_to(PY)
    hop.chmod(0o777)  # the link's directory is open to everyone: its target could change
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(hop / "python3")
    with pytest.raises(UsageError, match="writable by others"):
        run_as(python)
    assert json.dumps(run_as(PY, python=False)) == "null"  # a root-owned program, checked alone


# -- the egpu-setup that units and egpu-eject run as root -----------------------------------------


def _console_script(where: Path, interpreter: str) -> Path:
    script = where / "bin" / "egpu-setup"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!{interpreter}\nimport sys\nsys.exit(0)\n")
    script.chmod(0o755)
    return script


def test_units_never_run_a_users_egpu_setup_or_a_build_hosts(shared: Path) -> None:
    """Was: the units and egpu-eject ran the egpu-setup on the installer's PATH as root, even a
    pipx/uv install in a home, and under --root the build host's path. Now they run the one
    that is running only when root owns all it runs, else root's own /opt/egpu-setup/tool."""
    from egpu_setup.host.machine import LiveHost, RootHost
    from egpu_setup.image.tool import choose_tool
    from egpu_setup.state.paths import TOOL_BIN

    live = LiveHost()
    roots = _console_script(shared / "opt", PY)
    assert choose_tool(live, "debian", argv0=str(roots)).path == str(roots)
    users = _console_script(shared / "home", PY)
    _chown_tree(shared / "home")  # a pipx install in nobody's home
    choice = choose_tool(live, "debian", argv0=str(users))
    assert choice.path == TOOL_BIN and choice.note and "a user other than root" in choice.note
    venv = _venv(shared / "uv")  # root's script, but its interpreter is nobody's venv
    _chown_tree(venv)
    via_venv = _console_script(shared / "uvbin", str(venv / "bin" / "python"))
    assert choose_tool(live, "debian", argv0=str(via_venv)).path == TOOL_BIN
    image = shared / "img"
    image.mkdir()
    assert choose_tool(RootHost(image), "debian", argv0=str(roots)).path == TOOL_BIN
