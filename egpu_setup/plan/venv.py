"""The torch venv before torch goes in: does the Python have ensurepip, is a venv already there,
and is it one a failed run left half-made.

Stock Debian and Ubuntu ship the venv module without ensurepip (it is in python3.X-venv), and
`python3 -m venv` then fails *after* writing pyvenv.cfg and bin/python: EnvBuilder.create() runs
ensure_directories, create_configuration, setup_python, then _setup_pip (where it fails) and only
then setup_scripts (bin/activate) (Debian 12 /usr/lib/python3.11/venv/__init__.py; the message
is "ensurepip is not available ... apt install python3.11-venv"). What it leaves is recognised
here by exactly that shape, so a user's own healthy venv (every one has bin/activate: stdlib,
`--without-pip` and uv venvs alike) is never touched.

A venv egpu-setup made (its MARK_VENV) that holds a distribution whose install did not finish
(plan/installed.py: a kill or a power cut mid-install) is half-made too: pip cannot repair it in
place (it refuses to uninstall a distribution without RECORD), and the venv is root's own, so
it is rebuilt. A user's venv with one is never rebuilt: the distribution is just not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from egpu_setup.plan.installed import incomplete_distributions
from egpu_setup.state.atomic import TMP_MARK
from egpu_setup.state.paths import MARK_VENV


def venv_state(host: Any, venv: str, incomplete: Mapping[str, str] | None = None) -> str:
    """absent (or an empty directory) / healthy / half-made (pyvenv.cfg and bin/python, but no
    bin/activate and no pip; or egpu-setup's mark with an unfinished distribution or no
    pyvenv.cfg yet) / not-a-venv (a directory without pyvenv.cfg or mark: preflight refuses).
    `incomplete`: the venv's unfinished distributions when the caller has read them already
    (plan/installed.py venv_contents), else they are read here."""
    if not host.exists(venv) and host.readlink(venv) is None:
        return "absent"
    if host.is_dir(venv) and all(TMP_MARK in name for name in host.listdir(venv)):
        return "absent"  # made, and nothing in it yet but the temp of a mark being written
    marked = host.exists(f"{venv}/{MARK_VENV}")
    if not host.exists(f"{venv}/pyvenv.cfg"):
        # egpu-setup marks its venv before venv writes anything (execute/pip.py)
        return "half-made" if marked else "not-a-venv"
    has_python = host.exists(f"{venv}/bin/python") or host.readlink(f"{venv}/bin/python")
    if has_python and not host.exists(f"{venv}/bin/activate") and not _has_pip(host, venv):
        return "half-made"
    if incomplete is None and marked:
        incomplete = incomplete_distributions(host, venv)
    if marked and incomplete:
        return "half-made"
    return "healthy"


def _has_pip(host: Any, venv: str) -> bool:
    if host.exists(f"{venv}/bin/pip"):
        return True
    return any(
        host.glob(f"{lib}/site-packages", "pip-*.dist-info")
        for lib in host.glob(f"{venv}/lib", "*")
    )


def missing_venv_package(facts: Any, host: Any, python: str | None) -> str | None:
    """`python3.X-venv` when the target's Debian/Ubuntu Python X.Y lacks ensurepip, else None.

    Only where the distribution's own stdlib is there (/usr/lib/pythonX.Y/os.py) and its
    ensurepip is not (/usr/lib/pythonX.Y/ensurepip/__main__.py, the file Debian's venv looks
    for). The versioned package, not the python3-venv metapackage: on Ubuntu 24.04 python3-venv
    is in universe, which a fresh machine may not have enabled
    (https://packages.ubuntu.com/noble/amd64/python3-venv); python3.X-venv is what the error
    message itself names."""
    if not python or not _debian_like(facts):
        return None
    major_minor = ".".join(python.split(".")[:2])
    lib = f"/usr/lib/python{major_minor}"
    if not host.exists(f"{lib}/os.py") or host.exists(f"{lib}/ensurepip/__main__.py"):
        return None
    return f"python{major_minor}-venv"


def _debian_like(facts: Any) -> bool:
    os_facts = getattr(facts, "os", None)
    if os_facts is None:
        return False
    names = {(os_facts.id or "").lower(), *(n.lower() for n in os_facts.id_like)}
    return bool(names & {"debian", "ubuntu"})
