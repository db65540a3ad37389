"""torch into a venv through exactly one index (PEP 668; docs/sources.md, "One index").

- Never into a system Python, never --break-system-packages: the venv is created if missing.
- Exactly one source: `--index-url` of the resolved variant (or the lab's mirror of it). pip's
  config files are not read for this install (PIP_CONFIG_FILE=/dev/null) and the index/find-links
  variables are dropped, so an `extra-index-url` or `find-links` in somebody's config can never
  mix a second source into torch (dependency confusion, CVE-2018-20225). Certificates, proxies
  and timeouts from PIP_CERT / PIP_PROXY / PIP_DEFAULT_TIMEOUT and *_proxy variables still apply.
- uv when it is on PATH (faster doing the same work: benchmarks/torch_uv_vs_pip.py), else the
  venv's own pip. Under sudo with a venv the invoking user owns, the installer runs as that user.
- Bytecode is compiled at install time with either installer: pip does it by default, uv only
  with --compile-bytecode (`uv pip install --help`: "Compile Python files to bytecode after
  installation"). A venv without it pays later, and for good where __pycache__ cannot be
  written: a root-owned venv that lab users share imports torch from source every time (about
  twice as slow: benchmarks/torch_uv_vs_pip.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement

from egpu_setup.compat.index_url import installer_index
from egpu_setup.errors import EgpuSetupError, ExecutionError
from egpu_setup.execute.console import show_line
from egpu_setup.execute.files import Context, make_durable, missing_parents
from egpu_setup.execute.undo import mark_venv
from egpu_setup.host.machine import Host, RootHost
from egpu_setup.host.process import SYSTEM_PATH, home_of, passed_on
from egpu_setup.plan.steps import PipInstall
from egpu_setup.plan.venv import venv_state
from egpu_setup.state.atomic import clean_temp_files, empty_dir, make_dirs, remove_dir
from egpu_setup.state.paths import MARK_VENV, StatePaths

# pip/uv settings that could add a second source (dependency confusion) or a system install
SOURCE_ENV = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "PIP_CONSTRAINT",
    "PIP_REQUIREMENT",
    "PIP_BREAK_SYSTEM_PACKAGES",
    "UV_INDEX",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_BREAK_SYSTEM_PACKAGES",
    "VIRTUAL_ENV",
)


# seconds of silence on a connection before pip/uv give up on it (pip's own default is 15, uv's
# 30: a loaded mirror of multi-GB CUDA wheels can be slower than that to start sending)
STALL_TIMEOUT = 60


# Where root's own session points caches and config; meaningless (and root-owned) for the user
# the installer runs as, so dropped: uv and pip then use the user's HOME.
_ROOT_SESSION = (
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    "UV_CACHE_DIR",
    "PIP_CACHE_DIR",
    "PYTHONUSERBASE",
    "MAIL",
)


@dataclass(frozen=True)
class Account:
    """The user the installer runs as (from the target's passwd database)."""

    name: str
    uid: int
    home: str
    gid: int = -1  # -1: the temp directory made for it keeps root's group (fchown(2))


def installer_env(
    run_as: Account | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of the uv/pip child (pure over `base`, default os.environ).

    Under sudo, `runuser -u USER` keeps our environment, so HOME would still be /root: uv and
    pip would then try (and fail, or leave root-owned files) in root's cache. The user's own
    HOME, USER and LOGNAME go in; a user without a usable home (a system account) runs with the
    caches off instead of writing somewhere it does not own."""
    source = os.environ if base is None else base
    # the clean environment every child gets (host/process.py: child_env), not the caller's
    # PIP_*, UV_*, PYTHON*, VIRTUAL_ENV or LD_*: what pip installs is what the plan says
    env = {k: v for k, v in source.items() if passed_on(k) and k not in SOURCE_ENV}
    env.update(PATH=SYSTEM_PATH, HOME=home_of(os.geteuid()))
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if run_as is not None:
        for key in _ROOT_SESSION:
            env.pop(key, None)
        env.update(HOME=run_as.home, USER=run_as.name, LOGNAME=run_as.name)
        if not run_as.home.startswith("/") or run_as.home in ("/", "/nonexistent"):
            env.update(UV_NO_CACHE="1", PIP_NO_CACHE_DIR="1")
    return env


def account(host: Host, name: str) -> Account:
    """`name`'s uid and home on the target: its /etc/passwd under --root, NSS on this machine."""
    if host.kind == "live":
        import pwd

        try:
            pw = pwd.getpwnam(name)
        except KeyError as exc:
            raise EgpuSetupError(
                f"user {name} (SUDO_USER) does not exist", "run without sudo's -u"
            ) from exc
        return Account(name, pw.pw_uid, pw.pw_dir, pw.pw_gid)
    for line in (host.read("/etc/passwd") or "").splitlines():
        fields = line.split(":")
        if len(fields) >= 7 and fields[0] == name and fields[2].isdigit():
            gid = int(fields[3]) if fields[3].isdigit() else -1
            return Account(name, int(fields[2]), fields[5], gid)
    raise EgpuSetupError(
        f"user {name} is not in {host.root}/etc/passwd", "create the user in the image first"
    )


def choose_installer(host: Host, wanted: str) -> str | None:
    """Path of uv to use, or None for the venv's pip."""
    if wanted == "pip":
        return None
    uv = host.which("uv")
    if uv is None and wanted == "uv":
        raise EgpuSetupError("uv is not on PATH", "install uv, or drop EGPU_SETUP_INSTALLER=uv")
    return uv


def commands(step: PipInstall, uv: str | None) -> list[list[str]]:
    """The argv lists that carry out `step` (pure: shown by --dry-run -v and tested)."""
    py = f"{step.venv}/bin/python"
    out: list[list[str]] = []
    if step.find_links:
        return _offline_commands(step, uv, py)
    out.extend(_venv_command(step))
    if uv:
        head = [uv, "pip", "install", "--no-config", "--compile-bytecode", "--python", py]
        source = installer_index(step.index_url, uv=True)[0]
    else:
        head = [py, "-I", "-m", "pip", "install", "--progress-bar", "on"]
        source = ["--timeout", str(stall_timeout(step))]
        source += installer_index(step.index_url, uv=False)[0]
    if step.repair:
        out.append([*head, *source, *_reinstall(uv), *step.repair])
    out.append([*head, *source, *step.requirements])
    return _as_user(step, out)


def _reinstall(uv: str | None) -> list[str]:
    """Reinstall exactly what is named, nothing it depends on: pip's --force-reinstall
    (uninstall by RECORD, then install) and --no-deps; uv's --reinstall is the same
    (`uv pip install --help`: "Reinstall all packages, regardless of whether they're already
    installed"), limited to the names given by --no-deps."""
    return ["--reinstall" if uv else "--force-reinstall", "--no-deps"]


def repair_file(step: PipInstall) -> str:
    """Offline, the requirements file of the step's repairs: beside the checked copy of the
    bundle's (`_pinned_requirements` writes it), its lines for exactly those, hashes and all."""
    return os.path.join(os.path.dirname(str(step.requirements_file)), "repair.txt")


def stall_timeout(step: PipInstall) -> int:
    """Seconds a connection may send nothing before pip/uv give up on it (pip --timeout,
    UV_HTTP_TIMEOUT; both are read timeouts, so a server that trickles a byte at a time never
    trips them: the step's deadline, download_timeout, ends that)."""
    return min(STALL_TIMEOUT, step.download_timeout)


def _as_user(step: PipInstall, argvs: list[list[str]]) -> list[list[str]]:
    """Each command as the user who owns the venv (the plan's run_as), or as it is."""
    if not step.run_as:
        return argvs
    return [["runuser", "-u", step.run_as, "--", *argv] for argv in argvs]


def _venv_command(step: PipInstall) -> list[list[str]]:
    """`python -m venv` where the step makes the venv: the stdlib's with uv too, as it seeds pip
    from ensurepip with no network, where `uv venv --seed` fetches pip from an index. A venv a
    failed run left half-made (plan/venv.py) is made again in place: root's own emptied by the
    executor first with its mark kept (`_begin_own_venv`), a user's with --clear as that user."""
    if not (step.create_venv or step.rebuild_venv):
        return []
    clear = ["--clear"] if step.rebuild_venv and step.run_as else []
    return [[step.python, "-I", "-m", "venv", *clear, step.venv]]


def _begin_own_venv(host: Host, step: PipInstall, run_id: str) -> None:
    """Root's own venv is marked before anything is written in it (undo.mark_venv): a run killed
    while venv or ensurepip writes leaves a venv that says it is egpu-setup's, which the next
    run judges by its files (plan/venv.py: rebuilt when a distribution is unfinished) and
    `rollback --packages` removes. venv --clear would take the mark too: a half-made one is
    emptied here instead, the mark kept."""
    where = host.location(step.venv)
    if step.rebuild_venv:
        empty_dir(where, keep=frozenset({MARK_VENV}), anchor=host.root)
    else:
        make_dirs(where, anchor=host.root)
        clean_temp_files({where}, anchor=host.root)  # a mark a killed run was writing
    mark_venv(host, step.venv, run_id)
    make_durable(host, (step.venv,))


def _offline_commands(step: PipInstall, uv: str | None, py: str) -> list[list[str]]:
    """From an offline bundle: no index at all, every file checked against its --hash."""
    out: list[list[str]] = []
    out.extend(_venv_command(step))
    source = ["--no-index", "--find-links", str(step.find_links), "--require-hashes"]
    if uv:
        head = [uv, "pip", "install", "--no-config", "--compile-bytecode", "--offline"]
        head += ["--python", py]
    else:
        head = [py, "-I", "-m", "pip", "install", "--progress-bar", "on"]
    if step.repair:
        out.append([*head, *source, *_reinstall(uv), "-r", repair_file(step)])
    out.append([*head, *source, "-r", str(step.requirements_file)])
    return _as_user(step, out)


def install(ctx: Context, step: PipInstall, wanted: str, paths: StatePaths) -> tuple[str, str]:
    host = ctx.host
    if venv_state(host, step.venv) == "not-a-venv":
        raise EgpuSetupError(
            f"{step.venv} exists and is not a virtual environment (no pyvenv.cfg)",
            "egpu-setup never installs into a system Python (PEP 668); pass --venv NEW_PATH",
        )
    # a venv that exists (a half-made one too, which is rebuilt in place) is
    # root's own, or root does not touch it
    exists = not step.create_venv or step.rebuild_venv
    if exists and not step.run_as and host.kind == "live":
        _refuse_foreign_venv(step.venv)
    uv = choose_installer(host, wanted)
    env = installer_env(account(host, step.run_as) if step.run_as else None)
    if not step.find_links:  # the one index: redirects checked, a token in env, not argv
        from egpu_setup.compat.index_url import check_index_redirects

        check_index_redirects(step.index_url)
        env.update(installer_index(step.index_url, uv is not None)[1])
    env["UV_HTTP_TIMEOUT"] = str(stall_timeout(step))
    if not step.run_as and host.kind == "live":
        env.update(state_cache(paths, uv is not None))
    if step.create_venv:
        ctx.manifest.add_venv(step.venv, ctx.run_id, missing_parents(host, step.venv))
        ctx.manifest.save()
    if (step.create_venv or step.rebuild_venv) and not step.run_as:
        try:
            _begin_own_venv(host, step, ctx.run_id)
        except OSError as exc:
            raise _disk_error(host, step.venv, os.strerror(exc.errno or 0)) or exc from exc
    owner = None
    if step.run_as:
        who = account(host, step.run_as)
        owner = (who.uid, who.gid)
    with _pinned_requirements(step) as pinned, _bundle_seen_from(host, pinned) as seen:
        argvs = commands(seen, uv)
        made = len(_venv_command(step))  # the commands before these make the venv
        deadline = time.monotonic() + step.download_timeout
        try:
            for i, argv in enumerate(argvs):
                if i == made:
                    _fresh_temp_dir(host, step, owner)
                # the whole environment, not added to ours: the source variables it drops stay
                # dropped; the downloads (a repair, then the install) share the step's deadline
                fetches = i >= made
                try:
                    host.run_checked(
                        argv,
                        # `python -m venv` keeps the default TMPDIR: the venv is not made yet
                        # (for a user, nor --clear'ed) when it starts, and ensurepip stages
                        # only pip's own wheel there
                        env={**env, "TMPDIR": step.temp_dir} if fetches else env,
                        replace_env=True,
                        on_line=show_line,
                        timeout=max(1, int(deadline - time.monotonic())) if fetches else None,
                    )
                except ExecutionError as exc:
                    if fetches and uv:
                        _drop_from_uv_cache(host, step, uv, env, exc.stderr_tail)
                    if fetches and exc.rc is None:  # run_checked's deadline: session ended
                        raise _missed_deadline(step) from exc
                    raise _disk_error(host, step.venv, exc.stderr_tail) or exc from exc
                # neither venv nor pip/uv fsyncs what it writes: the step is done (journal,
                # manifest, the venv's mark) only once it is on disk, or a power cut leaves a
                # venv a later run would trust (plan/installed.py judges what is there)
                make_durable(host, (step.venv,))
                if i == 0 and step.create_venv and step.run_as:  # a user's: made by them first
                    mark_venv(host, step.venv, ctx.run_id)
        finally:
            _remove_temp_dir(host, step)
    return "done", f"with {'uv' if uv else 'pip'}"


def _fresh_temp_dir(host: Host, step: PipInstall, owner: tuple[int, int] | None) -> None:
    """The installer's TMPDIR (PipInstall.temp_dir), empty: what a killed run's pip left
    there (a half-downloaded multi-GB wheel) would take the space preflight counted on. Made
    0700 by descriptor walk (state/atomic.py), the installer's user's when it runs as one."""
    where = host.location(step.temp_dir)
    try:
        make_dirs(where, anchor=host.root, mode=0o700, owner=owner)
        empty_dir(where, anchor=host.root)
    except OSError as exc:
        raise _disk_error(host, step.venv, os.strerror(exc.errno or 0)) or exc from exc


def _remove_temp_dir(host: Host, step: PipInstall) -> None:
    """Best effort: a temp directory left (a kill) is emptied by the next run."""
    where = host.location(step.temp_dir)
    with contextlib.suppress(OSError):
        empty_dir(where, anchor=host.root)
        remove_dir(where, anchor=host.root)


def state_cache(paths: StatePaths, uv: bool) -> dict[str, str]:
    """The installer's cache for root's own venvs: <state>/cache/uv (or pip), made 0700.

    A second venv of root's (another --venv, one rebuilt after a failed run) then gets torch
    from it with no download: uv asks the index for the project page and links the unpacked
    files it already has (`uv pip install --help`, --link-mode: hardlink by default on Linux).
    In root's HOME instead (~/.cache/uv) it is keyed by each index URL ever used and nobody's
    to clean; here it is one known directory of egpu-setup's state (docs/design.md), safe to
    delete.
    Not for a user's venv (their own cache, as that user) nor inside an image (--root), whose
    copies would each carry it."""
    where = paths.wheel_cache / ("uv" if uv else "pip")
    make_dirs(where, anchor=paths.anchor, mode=0o700)
    return {"UV_CACHE_DIR": str(where)} if uv else {"PIP_CACHE_DIR": str(where)}


# uv's words for a wheel it fetched and could not use (uv 0.13: "Failed to download `NAME==V`",
# "Failed to extract archive: FILE.whl", "Hash mismatch for `NAME==V`")
_UV_BAD_WHEEL = re.compile(r"(?:Failed to download|Hash mismatch for) `([A-Za-z0-9._-]+)")


def _drop_from_uv_cache(
    host: Host, step: PipInstall, uv: str, env: dict[str, str], out: str
) -> None:
    """uv keeps what it downloaded, a wheel it could not unpack too, and hands the same bytes
    to the next run from the same URL, which then fails on the hash (a mirror that fixed the
    file in place never gets through). After a failed install the named distributions' cache
    entries go (`uv cache clean PACKAGE...`): those the step asked for and those uv named as
    bad. Best effort: a cache it cannot clean is the next run's `error:`, not this one's."""
    names = {Requirement(text).name for text in step.requirements if _is_requirement(text)}
    names.update(_UV_BAD_WHEEL.findall(out))
    if not names:
        return
    (argv,) = _as_user(step, [[uv, "cache", "clean", *sorted(names)]])
    host.stream(argv, env=env, replace_env=True, timeout=120)


def _is_requirement(text: str) -> bool:
    try:
        Requirement(text)
    except InvalidRequirement:
        return False
    return True


# strerror(3)'s words for ENOSPC, EDQUOT and EROFS, as pip and uv print them, and errno's
# number, which a translated message (the caller's LC_MESSAGES reaches the child) keeps
_DISK_FULL = ("No space left on device", "Disk quota exceeded", "[Errno 28]", "os error 28")
_READ_ONLY = ("Read-only file system", "[Errno 30]", "os error 30")
# less than this left to root counts as full after a failure: `python -m venv` hides why
# ensurepip failed (it captures its output), so the filesystem itself is asked (statvfs(3))
_NEARLY_FULL = 32 * 2**20


def _disk_error(host: Host, venv: str, out: str) -> EgpuSetupError | None:
    """The installer's failure said as what it was, when the venv's filesystem is read-only or
    full (by statvfs, or by the installer's own words): named, with the space there is; None
    for any other failure."""
    st = host.statvfs(venv)
    read_only = st is not None and bool(st.f_flag & os.ST_RDONLY)
    if read_only or any(words in out for words in _READ_ONLY):
        return EgpuSetupError(
            f"{venv} is on a read-only filesystem: the venv could not be written",
            f"remount it read-write (`findmnt -T {venv}`) or pass --venv PATH elsewhere, then "
            "run again: what was left half-made is rebuilt",
        )
    free = None if st is None else st.f_bfree * st.f_frsize
    if not any(words in out for words in _DISK_FULL) and (free is None or free >= _NEARLY_FULL):
        return None
    shown = "unknown" if free is None else f"{free / 2**20:.0f} MiB"
    return EgpuSetupError(
        f"{venv}: no space left on its filesystem ({shown} free): the install stopped part-way",
        # torch 2.13.0+cpu alone is 754 MiB installed; the CUDA builds bring several GiB of
        # NVIDIA libraries besides
        "free space there (a CPU torch needs about 1 GiB, a CUDA one several) or pass --venv "
        "PATH on a larger disk, then run again: what was left half-made is rebuilt",
    )


def _missed_deadline(step: PipInstall) -> EgpuSetupError:
    source = step.find_links or urlsplit(step.index_url).hostname or step.index_url
    return EgpuSetupError(
        f"torch's install from {source} did not finish within {step.download_timeout} s "
        "(--download-timeout) and was stopped: the index sent too slowly or stalled",
        "check the connection to that host (or use a closer mirror with --index-url), or allow "
        "more with --download-timeout SECONDS; run again: nothing half-installed is kept",
    )


IMAGE_BUNDLE = "/run/egpu-setup/bundle"


@contextlib.contextmanager
def _bundle_seen_from(host: Host, step: PipInstall) -> Iterator[PipInstall]:
    """The step as the installer sees it: inside an image (--root), a bundle's wheels and its
    checked requirements file are this machine's files, bound read-only under /run for the
    commands (each directory on its own: the checked copy lies in a private temporary one)."""
    if not isinstance(host, RootHost) or not step.find_links:
        yield step
        return
    with contextlib.ExitStack() as stack:
        wheels = stack.enter_context(host.bound(step.find_links, f"{IMAGE_BUNDLE}/wheels"))
        requirements = None
        if step.requirements_file:
            folder = os.path.dirname(step.requirements_file)
            inside = stack.enter_context(host.bound(folder, f"{IMAGE_BUNDLE}/requirements"))
            requirements = f"{inside}/{os.path.basename(step.requirements_file)}"
        yield dataclasses.replace(step, find_links=wheels, requirements_file=requirements)


@contextlib.contextmanager
def _pinned_requirements(step: PipInstall) -> Iterator[PipInstall]:
    """From a bundle, pip installs only what the requirements file's --hash lines allow, so
    that file is the trust anchor of every wheel: its bytes are read once, checked against the
    sha256 the (pinned) bundle manifest gives, and pip reads that copy, not the bundle's file
    (which whoever holds the USB stick could swap after the check)."""
    if not step.find_links:
        yield step
        return
    from egpu_setup.host.machine import read_regular
    from egpu_setup.state.atomic import sha256

    source = str(step.requirements_file)
    data = read_regular(Path(source), 16 * 1024 * 1024)
    got = sha256(data) if data is not None else None
    if got is None or got != step.requirements_sha256:
        raise EgpuSetupError(
            f"{source} is not the requirements file the bundle's manifest lists "
            f"(sha256 {got or 'unreadable'}): nothing was installed",
            "copy the bundle again from the machine that built it, and run again",
        )
    tmp = tempfile.mkdtemp(prefix="egpu-setup-requirements-")
    try:
        os.chmod(tmp, 0o755)  # readable by the user the installer may run as; hashes only
        copy = Path(tmp) / "requirements.txt"
        copy.write_bytes(data)  # type: ignore[arg-type]
        copy.chmod(0o644)
        pinned = dataclasses.replace(step, requirements_file=str(copy))
        if step.repair:
            lines = pinned_lines(data.decode(), step.repair)  # type: ignore[union-attr]
            Path(repair_file(pinned)).write_text(lines)
            os.chmod(repair_file(pinned), 0o644)
        yield pinned
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pinned_lines(text: str, wanted: tuple[str, ...]) -> str:
    """The lines of a bundle's requirements file (`NAME==VERSION --hash=sha256:...` each,
    bundle/wheels.py) that pin exactly the NAME==VERSION in `wanted`, names compared
    normalised. One the bundle does not pin at that version is left out: pip then replaces
    it in the normal install, or the next plan names it again."""
    keys = {_pin_key(w) for w in wanted}
    kept = [
        line
        for line in text.splitlines()
        if _pin_key(line.split()[0] if line.split() else "") in keys
    ]
    return "".join(f"{line}\n" for line in kept)


def _pin_key(pin: str) -> tuple[str, str]:
    from packaging.utils import canonicalize_name

    name, _, version = pin.partition("==")
    return canonicalize_name(name), version


def _refuse_foreign_venv(venv: str) -> None:
    """Root installs into an existing venv only when root owns all its Python runs (pip runs
    inside it): host/trust.py. A user's venv gets torch from that user (the plan's run_as)."""
    from egpu_setup.host.trust import run_as

    owner = run_as(f"{venv}/bin/python")
    if owner is not None:
        raise EgpuSetupError(
            f"{venv} belongs to uid {owner[0]}: root does not run its pip",
            f"install as that user (`egpu-setup install --only torch --venv {venv}` without "
            "sudo), or pass --venv NEW_PATH for a root-owned venv",
        )
