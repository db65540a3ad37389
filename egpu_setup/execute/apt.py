"""apt steps: sources with Signed-By keyrings checked by fingerprint, non-interactive installs.

Never apt-key and never /etc/apt/trusted.gpg.d: a key there is trusted for every repository
(apt-key(8), sources.list(5) Signed-By). A third-party key is downloaded to memory, its fingerprint
compared with the pinned one (`gpg --show-keys`, in a throw-away GNUPGHOME) before anything is
written. Locks: apt waits DPkg::Lock::Timeout seconds; we never delete a lock or kill its holder,
we name it (docs/sources.md, "Non-interactive apt").
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from egpu_setup.errors import BusyError, EgpuSetupError, ExecutionError, TimedOut
from egpu_setup.execute.apt_key import fetch_verified_key
from egpu_setup.execute.console import show_line
from egpu_setup.execute.dpkg_lock import wait_for_dpkg_lock
from egpu_setup.execute.files import Context, make_durable, write_managed
from egpu_setup.host.dpkg_lock import lock_holder
from egpu_setup.host.machine import Host, open_beneath
from egpu_setup.log import get_logger
from egpu_setup.plan.installed import (
    auto_installed,
    configured_packages,
    native_arch,
    needs_reinstall,
    present_packages,
)
from egpu_setup.plan.steps import AptInstall, AptRepository, bundle_apt_options

log = get_logger("egpu_setup.execute")


APT_ENV = {
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "APT_LISTCHANGES_FRONTEND": "none",
}


_LOCK_MESSAGES = (
    "Could not get lock",
    "Unable to acquire the dpkg frontend lock",
    "is another process using it",
)


def raise_if_locked(host: Host, output: str, timeout: float) -> None:
    """BusyError (exit 5) when apt's `output` says another package manager held the lock."""
    if any(m in output for m in _LOCK_MESSAGES):
        raise BusyError(
            f"apt could not get the dpkg lock within {timeout:g} s: "
            f"{lock_holder(host) or 'holder unknown'}",
            "let the other package manager finish, then run again; never delete the lock",
        )


def install(ctx: Context, step: AptInstall) -> tuple[str, str]:
    """apt-get install the step's packages. What it is about to install is in the manifest
    before dpkg starts, so rollback --packages takes back what got in however the run ends."""
    host = ctx.host
    wait_for_dpkg_lock(host, step.lock_timeout)
    # apt goes no further while dpkg says a package must be installed again, and a plain
    # install calls it "already the newest version": named after --reinstall, it is unpacked
    # again; one apt had as a dependency gets that mark back after (apt-mark(8): a package
    # named on apt-get's command line is marked manually installed)
    broken = tuple(sorted(needs_reinstall(host)))
    auto = auto_installed(host) & set(broken) - set(step.packages)
    if broken:
        log.warning("dpkg left %s half-installed: installed again", " ".join(broken))
    argv = step.argv(reinstall=broken)
    # read right before apt runs (after the lock wait): a package that was already there, in
    # any state but its conffiles alone, is not ours to remove, even on an upgrade that names it
    before = {n for n, state in present_packages(host).items() if state != "config-files"}
    record_coming(ctx, step, argv, before)
    fetching: list[str] = []  # the URL of apt's last Get: line, for a deadline

    def line(text: str) -> None:
        show_line(text)
        if _FETCH.match(text):
            fetching[:] = [text.split()[1]]

    deadline = step.lock_timeout + step.deadline
    res = host.stream(argv, env=APT_ENV, on_line=line, timeout=deadline)
    rc, tail = res.rc, res.tail()
    if res.timed_out:
        raise TimedOut(
            f"`{' '.join(argv)}` did not finish within {deadline:g} s and was stopped"
            + (f"; it was downloading from {_server(fetching[0])}" if fetching else ""),
            "a slow or stalled mirror: check the network and the apt sources it uses "
            "(/etc/apt/sources.list*), then run the same command again; what was downloaded is "
            "kept, and rollback --packages removes what got in",
            argv=argv,
            timeout=deadline,
        )
    if rc != 0:
        raise_if_locked(host, tail, step.lock_timeout)
        stalled = sorted({_server(u) for u in _FAILED.findall(tail)})
        if stalled:
            raise ExecutionError(
                f"`{' '.join(argv)}` could not download from {', '.join(stalled)} (exit {rc}; "
                f"apt gives up on a server silent for {step.fetch_timeout} s)",
                "check the network and that server (the apt sources, /etc/apt/sources.list*), "
                "then run the same command again; `apt-get update` shows whether it answers",
                argv=argv,
                rc=rc,
                stderr_tail=tail,
            )
        raise ExecutionError(
            f"`{' '.join(argv)}` exited with {rc}",
            "the apt output above says why; `egpu-setup doctor` may know the cause",
            argv=argv,
            rc=rc,
            stderr_tail=tail,
        )
    if auto:
        host.run_checked(["apt-mark", "auto", *sorted(auto)], env=APT_ENV, timeout=120)
    # what apt installed that its simulation did not name: recorded too; the dependencies
    # rollback --packages purges once nothing else needs them (rollback/purge.py)
    after = configured_packages(host)  # its triggers may be deferred (plan/triggers.py)
    for name in step.packages:
        if name not in before and name in after:
            ctx.manifest.add_package(name, ctx.run_id)
    for name in sorted(set(after) - before - set(step.packages)):
        ctx.manifest.add_package(name, ctx.run_id, pulled_in=True)
    ctx.manifest.save()
    notes = []
    recorded = {p["name"] for p in ctx.manifest.packages}  # by this run or a killed one
    kept_note = sum(1 for name in step.packages if name not in recorded)
    if kept_note:
        notes.append(f"{kept_note} already installed, not recorded for rollback")
    if step.for_part == "driver":
        from egpu_setup.execute.dkms import ensure_modules

        built = ensure_modules(host)
        if built:
            notes.append(f"DKMS module built for kernel {', '.join(built)}")
    make_durable(host, DPKG_WRITES)
    return "done", "; ".join(notes)


# Where an apt step writes: dpkg's database, the packages' files, what their maintainer
# scripts and triggers make (alternatives, ldconfig's cache, an initramfs in /boot) and apt's
# own state (extended_states: what was installed as a dependency). dpkg fsyncs the files it
# unpacks and its status file (dpkg(1), --force-unsafe-io turns that off), the rest nobody
# does: synced before the journal says the step is done.
DPKG_WRITES = ("/var/lib/dpkg", "/usr", "/etc", "/boot", "/var/lib/apt")


# apt-get's progress: "Get:1 http://host/debian bookworm/main amd64 jq amd64 1.6-2.1 [64.9 kB]";
# and its summary of a download that failed: "E: Failed to fetch http://host/pool/...deb  ..."
_FETCH = re.compile(r"^Get:\d+ \S+://")
_FAILED = re.compile(r"^E: Failed to fetch (\S+://\S+)", re.M)
# apt-get -s: "Inst NAME [OLD] (NEW ...)" for each package it would unpack
_INST = re.compile(r"^Inst (\S+)", re.M)


def _server(url: str) -> str:
    """The host (and port) of a URL apt printed: the server to name."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def record_coming(ctx: Context, step: AptInstall, argv: list[str], before: set[str]) -> None:
    """Put in the manifest, before dpkg starts, every package this install will add: the named
    ones and what apt brings with them, as apt's own simulation lists them (`apt-get -s`, no
    lock taken, apt-get(8)). Killed or failed midway, the run leaves them recorded, and
    rollback --packages purges whichever got in (rollback/purge.py skips the rest)."""
    sim = [argv[0], "-s", *argv[1:]]
    res = ctx.host.run(sim, env=APT_ENV, timeout=step.deadline)
    if res.rc != 0:
        raise_if_locked(ctx.host, res.out + res.err, step.lock_timeout)
        raise ExecutionError(
            f"`{' '.join(sim)}` exited with {res.rc}: apt cannot install these packages",
            "the apt output says why; `egpu-setup doctor` may know the cause",
            argv=sim,
            rc=res.rc,
            stderr_tail=(res.out + res.err)[-2000:],
        )
    native = ":" + native_arch(ctx.host.read("/var/lib/dpkg/status") or "")
    # an Inst line for a package already there is an upgrade or a reinstall: not ours
    coming = {n.removesuffix(native) for n in _INST.findall(res.out)} - before
    for name in step.packages:  # the named ones first, in the plan's order, then the rest
        if name in coming:
            ctx.manifest.add_package(name, ctx.run_id)
    for name in sorted(coming - set(step.packages)):
        ctx.manifest.add_package(name, ctx.run_id, pulled_in=True)
    ctx.manifest.save()


def add_repository(ctx: Context, step: AptRepository) -> tuple[str, str]:
    """Verify the key first; then keyring, pin, sources; then apt-get update (undone on failure)."""
    keyring: bytes | None = None
    if step.keyring_url:
        if not step.fingerprint:
            raise EgpuSetupError(
                f"apt source {step.name}: no pinned key fingerprint",
                "the matrix data is incomplete",
            )
        keyring = fetch_verified_key(step.keyring_url, step.fingerprint)
    before = set(ctx.manifest.files)
    try:
        if step.stage_from and step.stage_to:
            stage_repository(ctx, step.stage_from, step.stage_to, step.stage_sha256)
        if keyring is not None and step.keyring_path:
            write_managed(ctx, step.keyring_path, keyring, 0o644)
        if step.pin_path and step.pin_content:
            write_managed(ctx, step.pin_path, step.pin_content.encode(), 0o644)
        write_managed(ctx, step.sources_path, step.content.encode(), 0o644)
        # refresh this source only: a stale third-party repository elsewhere must not fail
        # (exit 100) and take our good source down with it
        only = bundle_apt_options(step.sources_path)
        ctx.host.run_checked(
            ["apt-get", *only, "-o", "DPkg::Lock::Timeout=60", "update"],
            env=APT_ENV,
            on_line=show_line,
        )
    except BaseException:
        # a source apt cannot use must not stay behind: undo this step's files
        from egpu_setup.execute.undo import apply_undo, plan_undo

        new = [u for u in plan_undo(ctx.host, ctx.manifest) if u.path not in before]
        apply_undo(ctx.host, ctx.manifest, new)
        raise
    return "done", ""


def stage_repository(
    ctx: Context, source: str, stage_to: str, expected: Sequence[tuple[str, str]] = ()
) -> int:
    """Copy a bundle's flat repository (*.deb + Packages) to `stage_to` on the target.

    The source `Trusted: yes` rests on these bytes, so each file is read once, hashed, compared
    with the bundle manifest's sha256 (`expected`, carried by the plan) and only those same
    bytes are written: a .deb swapped after the plan's check is caught here, and nothing of
    this step stays staged (the caller undoes its files). Only the manifest's files are copied;
    anything else lying in the directory is ignored. Each file is a managed file (atomic write,
    in the manifest), so rollback removes them with the source; a file already staged with the
    expected bytes is left alone."""
    from egpu_setup.state.atomic import sha256

    src = Path(source)
    if not expected:
        raise ExecutionError(
            f"no sha256 for the files of {source} in the plan: nothing was staged",
            "the bundle's manifest lists none; rebuild the bundle with `egpu-setup bundle`",
            argv=(),
        )
    copied = 0
    for name, want in expected:
        if "/" in name or name in ("", ".", ".."):
            raise ExecutionError(
                f"bundle file name {name!r} leaves {source}", "rebuild the bundle", argv=()
            )
        target = f"{stage_to}/{name}"
        have = ctx.host.read_bytes(target)
        if have is not None and sha256(have) == want:
            continue
        try:  # inside the bundle only: a link planted there is not followed
            data = _read_bundle_file(src, name)
        except OSError as exc:
            raise ExecutionError(
                f"cannot read {src / name}: {exc}: nothing was staged",
                "copy the whole bundle again, or rebuild it with `egpu-setup bundle`",
                argv=(),
            ) from exc
        got = sha256(data)
        if got != want:
            raise ExecutionError(
                f"{src / name} changed after it was checked (sha256 {got[:16]}…, the bundle "
                f"manifest says {want[:16]}…): nothing was staged",
                "someone or something modified the bundle; rebuild it or copy it again",
                argv=(),
            )
        write_managed(ctx, target, data, 0o644)
        copied += 1
    log.info("staged %d of %d files in %s", copied, len(expected), stage_to)
    return copied


def _read_bundle_file(src: Path, name: str) -> bytes:
    """The whole regular file `name` of the bundle folder `src`, opened by `open_beneath`
    (no link followed); OSError for a link, a missing or a non-regular file."""
    with os.fdopen(open_beneath(src, name), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(src / name))
        return f.read()
