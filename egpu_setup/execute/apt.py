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
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from egpu_setup.errors import BusyError, EgpuSetupError, ExecutionError
from egpu_setup.execute.files import Context, write_managed
from egpu_setup.plan.steps import AptInstall, AptRepository, bundle_apt_options, installed_packages

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
KEY_MAX_BYTES = 1024 * 1024


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


# -- the dpkg lock --------------------------------------------------------------------------------

DPKG_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")


def lock_holder(host: Any) -> str | None:
    """ "pid 123 (unattended-upgr)" for whoever holds the dpkg frontend lock, from /proc/locks."""
    for lock in DPKG_LOCKS:
        try:
            st = host.real_path(lock).stat()
        except OSError:
            continue
        try:
            locks = Path("/proc/locks").read_text()
        except OSError:
            return None
        for line in locks.splitlines():
            fields = line.split()
            # "1: POSIX  ADVISORY  WRITE 4711 08:01:1234 0 EOF"; blocked waiters have "->"
            if len(fields) < 6 or "->" in fields:
                continue
            try:
                major, minor, ino = fields[5].split(":")
                pid = int(fields[4])
            except ValueError:
                continue
            if int(ino) == st.st_ino and os.makedev(int(major, 16), int(minor, 16)) == st.st_dev:
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    comm = "?"
                return f"pid {pid} ({comm}) holds {lock}"
    return None


def wait_for_dpkg_lock(host: Any, timeout: float) -> None:
    """Wait until nobody holds the dpkg locks; BusyError naming the holder after `timeout`."""
    import fcntl

    deadline = time.monotonic() + timeout
    announced = False
    while True:
        busy = None
        for lock in DPKG_LOCKS:
            real = host.real_path(lock)
            try:
                fd = os.open(real, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.lockf(fd, fcntl.LOCK_UN)
            except OSError:
                busy = lock
            finally:
                os.close(fd)
            if busy:
                break
        if busy is None:
            return
        holder = lock_holder(host) or f"another process holds {busy}"
        if time.monotonic() >= deadline:
            raise BusyError(
                f"the package manager is busy: {holder} (waited {timeout:g} s)",
                "let it finish (unattended-upgrades often runs after boot), then run again; "
                "never delete the lock",
            )
        if not announced:
            log.warning("waiting up to %g s for the package manager: %s", timeout, holder)
            announced = True
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


# -- steps ----------------------------------------------------------------------------------------


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
    from egpu_setup.state.manifest import sha256

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


def fetch_verified_key(url: str, fingerprint: str) -> bytes:
    """Download a repository key and return it as a binary keyring, iff it is exactly the pin."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            data = resp.read(KEY_MAX_BYTES + 1)
    except OSError as exc:
        raise EgpuSetupError(
            f"cannot download the apt key {url}: {exc}", "check the network, then run again"
        ) from exc
    if len(data) > KEY_MAX_BYTES:
        raise EgpuSetupError(f"apt key {url} is larger than 1 MiB", "this is not a key file")
    want = fingerprint.replace(" ", "").upper()
    with tempfile.TemporaryDirectory(prefix="egpu-setup-gpg-") as home:
        os.chmod(home, 0o700)
        src = Path(home) / "key"
        src.write_bytes(data)
        got = _gpg(home, ["--show-keys", "--with-colons", str(src)])
        fprs = [
            line.split(":")[9]
            for i, line in enumerate(got.splitlines())
            if line.startswith("fpr:") and i > 0 and got.splitlines()[i - 1].startswith("pub:")
        ]
        if fprs != [want]:
            raise EgpuSetupError(
                f"the apt key at {url} has fingerprint {', '.join(fprs) or 'none'}, "
                f"not the pinned {want}: nothing was added",
                "NVIDIA rotates keys (it did in 2022): update egpu-setup's matrix data, "
                "or report it if the pin is current",
            )
        out = Path(home) / "keyring.gpg"
        if data.lstrip().startswith(b"-----BEGIN"):  # armored: apt wants .gpg binary here
            _gpg(home, ["--dearmor", "-o", str(out), str(src)])
        else:
            out.write_bytes(data)
        return out.read_bytes()


def _gpg(home: str, args: list[str]) -> str:
    proc = subprocess.run(  # noqa: S603 - argv list
        ["gpg", "--homedir", home, "--batch", "--no-tty", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise EgpuSetupError(
            f"gpg {' '.join(args[:1])} failed: {proc.stderr.strip()[-300:]}",
            "is this a PGP public key?",
        )
    return proc.stdout
