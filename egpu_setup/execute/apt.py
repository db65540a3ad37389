"""apt steps: sources with Signed-By keyrings checked by fingerprint, non-interactive installs.

Never apt-key and never /etc/apt/trusted.gpg.d: a key there is trusted for every repository
(reference/hotplug-security.md §5.5). A third-party key is downloaded to memory, its fingerprint
compared with the pinned one (`gpg --show-keys`, in a throw-away GNUPGHOME) before anything is
written. Locks: apt waits DPkg::Lock::Timeout seconds; we never delete a lock or kill its holder,
we name it (§6.7).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from egpu_setup.errors import BusyError, EgpuSetupError, ExecutionError
from egpu_setup.execute.apt_key import fetch_verified_key
from egpu_setup.execute.dpkg_lock import lock_holder, wait_for_dpkg_lock
from egpu_setup.execute.files import Context, write_managed
from egpu_setup.plan.installed import installed_packages
from egpu_setup.plan.steps import AptInstall, AptRepository, bundle_apt_options

log = logging.getLogger("egpu_setup.execute")


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


def stream(
    host: Any,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    keep: str | None = None,
    kept: list[str] | None = None,
) -> tuple[int, str]:
    """Run argv on the target (chroot under --root), its output streamed to our stderr.

    Returns (exit status, the last 60 lines of its output) so a failure can quote them. With a
    `timeout` the deadline holds whether or not the child prints: a child that hangs silently
    (or leaves a grandchild holding its output open) is killed with its whole process group and
    ExecutionError names it."""
    full = list(argv)
    if host.kind == "root":
        full = ["chroot", str(host.root), *full]
    elif host.kind != "live":
        raise ExecutionError(
            f"cannot run {argv[0]} on a recorded host", "use --dry-run with --from", argv=argv
        )
    tail: collections.deque[str] = collections.deque(maxlen=60)
    log.info("run: %s", " ".join(full))
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
            full,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            # its own process group, so a timeout kills what it started too; without a timeout
            # it stays in ours and a Ctrl-C reaches it as before
            start_new_session=timeout is not None,
        )
    except FileNotFoundError as exc:
        raise ExecutionError(
            f"command not found: {full[0]}", "install it", argv=full, rc=127
        ) from exc
    deadline = None if timeout is None else time.monotonic() + timeout
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    partial = b""

    def emit(raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        tail.append(line)
        if keep is not None and kept is not None and line.startswith(keep):
            kept.append(line)
        sys.stderr.write("  " + line + "\n")
        sys.stderr.flush()

    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    _kill_group(proc)
                    raise _timed_out(full, timeout, tail)
                if not sel.select(wait):
                    continue  # the deadline check above ends it
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                partial += chunk
                *lines, partial = partial.split(b"\n")
                for raw in lines:
                    emit(raw)
        if partial:
            emit(partial)
        try:
            rc = proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise _timed_out(full, timeout, tail) from None
    except BaseException:
        if proc.poll() is None and timeout is not None:
            _kill_group(proc)  # interrupted (Ctrl-C, a timeout): nothing of it keeps running
        raise
    finally:
        proc.stdout.close()
    return rc, "\n".join(tail)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def _timed_out(full: list[str], timeout: float | None, tail: Sequence[str]) -> ExecutionError:
    return ExecutionError(
        f"`{' '.join(full)}` did not finish within {timeout:g} s and was killed",
        "the output above (if any) shows where it stopped; fix the cause and run again",
        argv=full,
        rc=None,
        stderr_tail="\n".join(tail),
    )


def run_checked(
    host: Any, argv: list[str], *, env: dict[str, str] | None = None, timeout: float | None = None
) -> str:
    rc, tail = stream(host, argv, env=env, timeout=timeout)
    if rc != 0:
        raise ExecutionError(
            f"`{' '.join(argv)}` exited with {rc}",
            "the output above says why; fix it and run the same command again",
            argv=argv,
            rc=rc,
            stderr_tail=tail,
        )
    return tail


def install(ctx: Context, step: AptInstall, simulate: bool) -> tuple[str, str]:
    host = ctx.host
    wait_for_dpkg_lock(host, step.lock_timeout)
    argv = step.argv(simulate=simulate)
    # read right before apt runs (after the lock wait): a package that was already there is not
    # ours to remove, even on an upgrade that names it (rollback --packages)
    before = installed_packages(host)
    planned: list[str] = []
    rc, tail = stream(host, argv, env=APT_ENV, timeout=None, keep="Inst ", kept=planned)
    if rc != 0:
        if any(m in tail for m in _LOCK_MESSAGES):
            raise BusyError(
                f"apt could not get the dpkg lock within {step.lock_timeout} s: "
                f"{lock_holder(host) or 'holder unknown'}",
                "let the other package manager finish, then run again; never delete the lock",
            )
        raise ExecutionError(
            f"`{' '.join(argv)}` exited with {rc}",
            "the apt output above says why; `egpu-setup doctor` may know the cause",
            argv=argv,
            rc=rc,
            stderr_tail=tail,
        )
    if simulate:
        return "simulated", f"apt-get -s: {len(planned)} packages would be installed"
    ours = [name for name in step.packages if name not in before]
    for name in ours:
        ctx.manifest.add_package(name, ctx.run_id)
    ctx.manifest.save()
    kept_note = len(step.packages) - len(ours)
    return "done", f"{kept_note} already installed, not recorded for rollback" if kept_note else ""


def add_repository(ctx: Context, step: AptRepository, simulate: bool) -> tuple[str, str]:
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
        run_checked(
            ctx.host, ["apt-get", *only, "-o", "DPkg::Lock::Timeout=60", "update"], env=APT_ENV
        )
    except BaseException:
        # a source apt cannot use must not stay behind: undo this step's files
        from egpu_setup.execute.files import apply_undo, plan_undo

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
        try:
            data = (src / name).read_bytes()
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
