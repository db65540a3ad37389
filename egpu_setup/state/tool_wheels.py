"""The wheels egpu-setup keeps of itself: the only ones it puts into a venv that root runs.

scripts/install.sh keeps egpu-setup's own wheel and its dependencies' wheels beside the tool venv
it makes, in PREFIX/share/egpu-setup/wheels, with their sha256s in SHA256SUMS (sha256sum(1)'s
format), all root's. Putting the tool into an image or into /opt/egpu-setup/tool installs those
files (or a pinned bundle's tool/ files, bundle/format.py) and nothing else: copied privately,
each hash checked on the copy, then `pip install --no-index --require-hashes` (execute/tool.py).
Never a source tree (the code there may have changed since it planned, and building it runs its
build backend as root), never `egpu-setup==VERSION` by name from an index (whoever registers
that name would own every lab image).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from egpu_setup.errors import UsageError

KEPT = "share/egpu-setup/wheels"  # below the tool venv's prefix
SUMS = "SHA256SUMS"
_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *]([^/\s]+\.whl)$")


@dataclass(frozen=True)
class KeptWheels:
    """A folder of wheels and the sha256 each must have: (file name, sha256), sorted."""

    directory: str
    files: tuple[tuple[str, str], ...]


def parse_sums(text: str, where: str) -> tuple[tuple[str, str], ...]:
    """(wheel file name, sha256) of each line of a SHA256SUMS file; UsageError on any other line:
    the list is the trust anchor of every wheel, so nothing in it is guessed."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        m = _SUM_LINE.match(line)
        if m is None:
            raise UsageError(
                f"{where} line {number} is not `SHA256  NAME.whl`: {line[:80]!r}",
                "install egpu-setup again with scripts/install.sh (it writes this list)",
            )
        out.append((m.group(2), m.group(1)))
    return tuple(sorted(out))


def own(prefix: str | None = None) -> KeptWheels | None:
    """The wheels kept beside the running egpu-setup (below `prefix`, default sys.prefix), when
    root owns them and the list is readable; None when it keeps none (an editable install, pip
    into a venv of one's own)."""
    from egpu_setup.host.machine import read_regular
    from egpu_setup.host.trust import owned_by_root

    folder = Path(sys.prefix if prefix is None else prefix) / KEPT
    sums = folder / SUMS
    if not owned_by_root([str(folder), str(sums)]):
        return None  # missing, or a user's: either way not wheels root may install
    data = read_regular(sums, 1 << 20)
    if data is None:
        return None
    return KeptWheels(str(folder), parse_sums(data.decode("utf-8", "replace"), str(sums)))


@dataclass(frozen=True)
class Usable:
    """One wheel a given Python installs: its distribution (normalized), version, file, sha256."""

    name: str
    version: str
    file: str
    sha256: str


def for_python(files: Sequence[tuple[str, str]], python: str) -> list[Usable]:
    """The wheels a CPython `python` (X.Y) on Linux can install, of each distribution only its
    newest version (a bundle may hold one per target Python); sorted by name."""
    major, minor = (int(x) for x in python.split(".")[:2])
    best: dict[str, tuple[Version, list[Usable]]] = {}
    for file_name, digest in files:
        try:
            name, version, _build, tags = parse_wheel_filename(file_name)
        except InvalidWheelFilename:
            continue
        if not any(_runs(t.interpreter, t.abi, major, minor) for t in tags):
            continue
        wheel = Usable(name, str(version), file_name, digest)
        have = best.get(name)
        if have is None or version > have[0]:
            best[name] = (version, [wheel])
        elif version == have[0]:
            have[1].append(wheel)
    return [w for _, (_, wheels) in sorted(best.items()) for w in wheels]


def _runs(interpreter: str, abi: str, major: int, minor: int) -> bool:
    """PEP 425: a pure wheel (py3, py3Y), one for this CPython (cp3Y), or the stable ABI of an
    older one (cp3N-abi3, N <= Y)."""
    if interpreter in (f"py{major}", f"py{major}{minor}"):
        return True
    m = re.fullmatch(rf"cp{major}(\d+)", interpreter)
    if m is None:
        return False
    built_for = int(m.group(1))
    return built_for == minor or (abi == "abi3" and built_for <= minor)


def requirements(files: Sequence[tuple[str, str]], python: str) -> str:
    """A requirements file that pins each of those wheels by version and sha256: what pip's
    --require-hashes installs, and nothing else
    (https://pip.pypa.io/en/stable/topics/secure-installs/#hash-checking-mode)."""
    hashes: dict[tuple[str, str], list[str]] = {}
    for w in for_python(files, python):
        hashes.setdefault((w.name, w.version), []).append(w.sha256)
    lines = [
        f"{name}=={version} " + " ".join(f"--hash=sha256:{d}" for d in digests)
        for (name, version), digests in hashes.items()
    ]
    return "\n".join(lines) + "\n"
