"""Entering an image (`--root DIR`): each command in private namespaces with its API filesystems.

A bare `chroot DIR cmd` gives the image no /proc, /sys, /dev or /dev/pts: dkms then fails with
"/dev/fd/63: No such file or directory" and leaves dpkg half-configured. Instead every
command runs as

    setpriv --pdeathsig KILL -- unshare --mount --propagation private --pid --fork --kill-child \\
        -- python3 -I host/enter.py DIR [--bind HOST:/run/...]... -- argv...

enter.py mounts the API filesystems inside the new mount namespace, enters the root, drops the
capabilities a package does not need, writes a policy-rc.d for the command's duration and runs it.
Nothing is mounted in the build host's namespace, so an error, Ctrl-C or SIGKILL leaves no mount
behind: the namespace dies with its last process (mount_namespaces(7), pid_namespaces(7));
`--pdeathsig KILL` (setpriv(1)) ends it when egpu-setup itself is killed, and `--kill-child`
(unshare(1)) when unshare is.

`clean_leftovers` still removes what an older tool (or a person) left mounted under the image's
API-filesystem directories in the host's namespace, deepest first and lazily when busy, before a
run changes anything: deleting a venv or rolling back under a bound /dev would delete the build
host's device nodes. Mounts elsewhere in the image (the image on its own filesystem) are the
user's and stay.

util-linux provides unshare, setpriv and mount (Essential in Debian; on Fedora and Arch too).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from egpu_setup.errors import ExecutionError
from egpu_setup.log import get_logger

log = get_logger("egpu_setup")

ENTER = Path(__file__).with_name("enter.py")
# The build host's environment an image command may see: locale, terminal, Debian's and apt's
# switches, proxies. Never PATH, HOME, PYTHONPATH, VIRTUAL_ENV or LD_*: those name the build
# host's files.
_IMAGE_ENV = re.compile(
    r"^(TERM|LANG|LANGUAGE|LC_[A-Z]+|TZ|SOURCE_DATE_EPOCH|DEBIAN_[A-Z_]+|DEBCONF_[A-Z_]+"
    r"|APT_[A-Z_]+|(?:http|https|ftp|no|all)_proxy|(?:HTTP|HTTPS|FTP|NO|ALL)_PROXY)$"
)
# A whole environment a caller built for pip or uv (execute/pip.py) keeps their switches too,
# but not those that name a file of the build host (a CA bundle, a cache, a wheel directory).
_INSTALLER_ENV = re.compile(r"^(PIP|UV)_[A-Z_]+$")
_BUILD_HOST_PATHS = re.compile(
    r"^(PIP_(CERT|CLIENT_CERT|FIND_LINKS|CACHE_DIR|LOG|LOG_FILE|SRC|TARGET|PREFIX|ROOT"
    r"|BUILD_DIR|CONSTRAINT|REQUIREMENT)|UV_(CACHE_DIR|FIND_LINKS|PYTHON_INSTALL_DIR|TOOL_DIR"
    r"|TOOL_BIN_DIR|CONFIG_FILE))$"
)
# Image directories enter.py mounts over; leftovers here in the host's namespace are ours to undo.
API_DIRS = ("proc", "sys", "dev", "run")
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UMOUNT_TIMEOUT_S = 60.0  # a busy mount answers at once; one stuck on a dead NFS server never


def enter_argv(root: Path, argv: Sequence[str], binds: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The build host's command that runs argv inside root (see the module docstring)."""
    bind_args = [a for host_dir, image_dir in binds for a in ("--bind", f"{host_dir}:{image_dir}")]
    prefix = ["setpriv", "--pdeathsig", "KILL", "--"] if _have("setpriv") else []
    return [
        *prefix,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "--",
        sys.executable,
        "-I",  # no PYTHONPATH, no user site: the helper is ours alone
        str(ENTER),
        str(root),
        *bind_args,
        "--",
        *argv,
    ]


def _have(name: str) -> bool:
    from egpu_setup.host.process import program

    try:
        program(name)
    except ExecutionError:
        return False
    return True


def image_env(
    env: Mapping[str, str] | None, replace_env: bool, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a command in the image, plus PATH for the helper itself (enter.py
    replaces it with the image's before the command starts).

    env added to the build host's environment (`base`, default os.environ): of that only what
    the image may see (_IMAGE_ENV), plus everything the caller set itself. With replace_env, env
    is the whole environment: filtered the same way, pip's and uv's switches kept (pip's
    PIP_CONFIG_FILE=/dev/null among them) except those naming a build host's file."""
    source = dict(os.environ if base is None else base)
    if replace_env:
        picked = {
            k: v
            for k, v in (env or {}).items()
            if _IMAGE_ENV.match(k) or (_INSTALLER_ENV.match(k) and not _BUILD_HOST_PATHS.match(k))
        }
    else:
        picked = {k: v for k, v in source.items() if _IMAGE_ENV.match(k)}
        picked.update(env or {})
    picked["PATH"] = HOST_PATH  # what enter.py's own `mount` is found in, never the caller's
    return picked


def unescape_mountinfo(field: str) -> str:
    """A mountinfo(5) path: space, tab, newline and backslash are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(root: Path, mountinfo: str | None = None) -> list[str]:
    """Mount points in this (the build host's) mount namespace on the image's API-filesystem
    directories or below them, deepest first (mountinfo(5): the 5th field)."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mountinfo = f.read()
    real = os.path.realpath(root)
    tops = tuple(f"{real}/{d}" for d in API_DIRS)
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = unescape_mountinfo(fields[4])
        if point in tops or point.startswith(tuple(t + "/" for t in tops)):
            found.append(point)
    return sorted(set(found), key=lambda p: (p.count("/"), p), reverse=True)


def clean_leftovers(root: Path) -> list[str]:
    """Unmount what an earlier run left under root's API directories (lazily when busy) and
    remove a policy-rc.d a killed run left; returns what was cleaned. Call it under the run lock,
    before anything in the image changes."""
    from egpu_setup.host.enter import POLICY_RC, POLICY_RC_TEXT
    from egpu_setup.host.process import spawn

    cleaned = []
    for point in mounts_under(root):
        done = spawn(["umount", point], timeout=UMOUNT_TIMEOUT_S)
        if not done.ok:
            lazy = spawn(["umount", "--lazy", point], timeout=UMOUNT_TIMEOUT_S)
            if not lazy.ok:
                raise ExecutionError(
                    f"{point} is mounted inside the image and cannot be unmounted: "
                    f"{lazy.tail(5) or f'no answer within {UMOUNT_TIMEOUT_S:g} s'}",
                    f"unmount it yourself (`umount -R {point}`), then run again",
                    argv=["umount", point],
                    rc=lazy.rc,
                )
        log.warning("unmounted %s, left mounted inside the image by an earlier run", point)
        cleaned.append(point)
    policy = _inside(root, POLICY_RC)
    if policy is not None and policy.is_file() and not policy.is_symlink():
        with contextlib.suppress(OSError):
            if policy.read_text() == POLICY_RC_TEXT:
                policy.unlink()
                log.warning("removed %s, left in the image by a killed run", POLICY_RC)
                cleaned.append(POLICY_RC)
    return cleaned


def _inside(root: Path, path: str) -> Path | None:
    """root/path when no component below root is a symbolic link (never followed to the host)."""
    current = Path(root)
    for part in path.strip("/").split("/"):
        current = current / part
        if current.is_symlink():
            return None
    return current


class _Tree(Protocol):
    """What boot_kernels reads of a Host (machine.py imports this module, so not Host itself)."""

    def listdir(self, path: str) -> list[str]: ...

    def is_dir(self, path: str) -> bool: ...


def boot_kernels(host: _Tree) -> list[str]:
    """Kernel releases the image can boot: a /boot/vmlinuz-<release> with /lib/modules/<release>
    (what Debian's kernel packages install), oldest first by version; read through the Host, so
    links resolve inside the image."""
    out = [
        name[len("vmlinuz-") :]
        for name in host.listdir("/boot")
        if name.startswith("vmlinuz-") and host.is_dir(f"/lib/modules/{name[len('vmlinuz-') :]}")
    ]
    return sorted(out, key=_version_key)


def _version_key(release: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.+~-]", release)]
