"""rollback --packages: purge what egpu-setup's apt runs installed, and nothing else.

What a run installed is recorded when it ran (execute/apt.py): the packages it named that were
missing, and the dependencies apt brought with them (`pulled_in`). Purged, not removed: a
removed package leaves its conffiles and its maintainer scripts' state (`rc` in dpkg -l), and
the machine had neither before (dpkg(1), --purge).

Nothing the machine's owner installed since goes with them. Before anything is purged, apt's
own simulation (`apt-get -s purge`, apt-get(8)) must name exactly the packages to purge: a
package someone installed later that depends on one of the named ones stops rollback with its
name; one that depends on a dependency keeps that dependency (and what it needs in turn). A
dependency goes only while it is still marked auto-installed (`apt-mark manual` keeps it).
apt's autoremove rule is not the test: it also keeps what an installed package merely
recommends or suggests (APT::AutoRemove::RecommendsImportant and SuggestsImportant, apt.conf(5)).
After the driver was purged from the lab image it still kept 232 of the packages the driver had
brought, the compilers among them, though the image had run without them before.

A package whose removal script refuses is kept, apt's output says why, and the rest is purged.
sudo's prerm refuses while root's password is locked, as it is in a Debian image: "Without sudo,
you may not be able to gain administrative privileges". On a running machine that stands. In an
image (`--root`) nobody is logged in to lose access, and it had no sudo before egpu-setup's run
brought it, so there the prerm's own override is set, SUDO_FORCE_REMOVE=yes.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

from egpu_setup.errors import EgpuSetupError, ExecutionError, UsageError
from egpu_setup.execute.apt import APT_ENV, raise_if_locked
from egpu_setup.execute.console import show_line
from egpu_setup.host.machine import Host
from egpu_setup.host.process import Result
from egpu_setup.log import get_logger
from egpu_setup.plan.installed import (
    auto_installed,
    dpkg_interrupted,
    native_arch,
    present_packages,
)

log = get_logger("egpu_setup.rollback")

LOCK_TIMEOUT_S = 600
# the lock wait; and never apt's own autoremove along (a machine may set it in apt.conf): only
# the packages named here are taken
OPTIONS = [
    "-o",
    f"DPkg::Lock::Timeout={LOCK_TIMEOUT_S}",
    "-o",
    "APT::Get::AutomaticRemove=false",
    # a package a killed install left half-installed is purged too: dpkg refuses to remove one
    # flagged reinstreq without it (dpkg(1), --force-remove-reinstreq)
    "-o",
    "Dpkg::Options::=--force-remove-reinstreq",
]
# apt-get -s: "Purg NAME [VERSION]" per package it would purge, "Remv" where it would only remove
_SIMULATED = re.compile(r"^(?:Purg|Remv) (\S+)", re.M)
# dpkg, when a package's prerm or postrm exits non-zero
_REFUSED = re.compile(r"^\s*dpkg: error processing package (\S+) \(--(?:remove|purge)\):", re.M)
# and its summary at the end, one package a line: what is left when the output was long
_SUMMARY = re.compile(
    r"^Errors were encountered while processing:\n((?:[ \t]+\S+[ \t]*\n?)+)", re.M
)
IMAGE_ENV = {"SUDO_FORCE_REMOVE": "yes"}


@dataclass(frozen=True)
class Purged:
    """What rollback --packages took, and what it kept with the reason."""

    purged: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]  # (package, why)


def would_purge(host: Host, names: Sequence[str]) -> set[str]:
    """Every package `apt-get purge NAMES` would take, by apt's own simulation: native ones
    by name, another architecture's as name:arch (a foreign twin, e.g. Steam's :i386
    libraries, is never mistaken for the native package egpu-setup installed)."""
    res = _apt(host, ["apt-get", "-s", *OPTIONS, "purge", *names])
    native = ":" + native_arch(host.read("/var/lib/dpkg/status") or "")
    return {n.removesuffix(native) for n in _SIMULATED.findall(res.out)}


def finish_interrupted(host: Host) -> None:
    """`dpkg --configure -a` when a killed or failed dpkg run left work behind: apt reads only
    dpkg's status file, not the journal a killed dpkg leaves in /var/lib/dpkg/updates/, so it
    would call the packages that run unpacked "not installed" and leave them. What dpkg cannot
    configure (a dependency half-installed) stays as it is, and is purged all the same."""
    why = dpkg_interrupted(host)
    if why is None:
        return
    log.warning("%s: running dpkg --configure -a first", why)
    env = {**APT_ENV, **IMAGE_ENV} if host.kind == "root" else APT_ENV
    argv = ["dpkg", "--force-confdef", "--force-confold", "--configure", "-a"]
    res = host.stream(argv, env=env, on_line=show_line, timeout=LOCK_TIMEOUT_S + 600)
    if res.rc != 0:
        log.warning("dpkg --configure -a exited with %s; purging what it left", res.rc)


def check_purge(host: Host, named: Sequence[str]) -> tuple[str, ...]:
    """The named packages still installed; EgpuSetupError (nothing changed) when purging them
    would take a package egpu-setup did not install."""
    there = present_packages(host)
    named = tuple(n for n in named if _base(n) in there)
    if not named:
        return ()
    others = sorted(would_purge(host, named) - {_base(n) for n in named})
    if others:
        raise EgpuSetupError(
            f"purging {' '.join(named)} would also remove {' '.join(others)}, which egpu-setup "
            "did not install",
            f"remove {' '.join(others)} yourself first if you mean to, or run rollback without "
            "--packages to keep every package",
        )
    return named


def purge(
    host: Host, named: Sequence[str], pulled_in: Sequence[str], purging: Set[str] = frozenset()
) -> Purged:
    """Purge `named` (the caller ran check_purge on them before changing anything) and those
    of `pulled_in` that nothing else installed depends on, together (a second run only after
    a removal script refused). `purging`: those of `pulled_in` an earlier rollback was already
    purging, whose auto-installed mark apt dropped then (not a sign of the admin's)."""
    there = present_packages(host)
    named = [n for n in named if _base(n) in there]
    auto = auto_installed(host)
    kept: list[tuple[str, str]] = []
    deps = []
    for dep in pulled_in:
        if _base(dep) not in there:
            continue  # removed by hand since
        if _base(dep) not in auto and dep not in purging:
            kept.append((dep, "marked manually installed since"))
        else:
            deps.append(dep)
    free, held = _not_needed_by_others(host, named, deps)
    kept += held
    dirs = _aliased_dirs(host, [*named, *free])
    try:
        done, refused = _purge_refusing(host, [*named, *free])
    finally:  # a purge that failed halfway may have deleted some too
        _restore_aliased_dirs(host, dirs)
    return Purged(done, tuple(kept) + refused)


# Merged /usr (Debian 12): /bin, /sbin and /lib* are links into /usr. dpkg does not know, so
# when it purges a package that lists a directory under one name (nvidia-suspend-common's
# /usr/lib/systemd/system-sleep) it deletes the directory once empty, though a package that
# stays lists it under the other (systemd's /lib/systemd/system-sleep). The ways dpkg loses files
# on such a system are listed in DEP 17, https://people.debian.org/~helmutg/dep17.html (cited by
# dh_movetousr(1)); this one was seen in the lab-image test.
MERGED = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _aliased_dirs(host: Host, names: Sequence[str]) -> dict[str, tuple[int, int, int]]:
    """The directories these packages list under /usr/<MERGED> or /<MERGED>, as they are now:
    canonical host path -> (mode, uid, gid). Empty unless this is a merged-/usr system."""
    merged = [d for d in MERGED if host.readlink(f"/{d}") in (f"usr/{d}", f"/usr/{d}")]
    if not merged:
        return {}
    listed: set[str] = set()
    for n in names:
        for lst in host.glob("/var/lib/dpkg/info", f"{_base(n)}.list") + host.glob(
            "/var/lib/dpkg/info", f"{_base(n)}:*.list"
        ):
            listed.update(line.strip() for line in (host.read(lst) or "").splitlines())
    parents = {p.rpartition("/")[0] for p in listed}
    out: dict[str, tuple[int, int, int]] = {}
    for path in sorted(listed & parents):
        top = path.split("/")
        canonical = path if top[1] == "usr" else "/usr" + path
        if (
            len(top) < 3
            or (top[1] == "usr" and top[2] not in merged)
            or (top[1] != "usr" and top[1] not in merged)
        ):
            continue
        try:
            st = os.lstat(host.location(canonical))
        except (OSError, UsageError):
            continue
        if stat.S_ISDIR(st.st_mode):
            out[canonical] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return out


def _restore_aliased_dirs(host: Host, dirs: dict[str, tuple[int, int, int]]) -> None:
    """Make again, as they were, the directories of `dirs` the purge deleted that a remaining
    package lists under either name."""
    gone = [d for d in dirs if not os.path.lexists(host.location(d))]
    if not gone:
        return
    names = [alias for d in gone for alias in (d, d[len("/usr") :])]
    res = host.run(["dpkg-query", "-S", *names], env=APT_ENV, timeout=120)  # exit 1: not all
    owned = {line.rpartition(": ")[2].strip() for line in res.out.splitlines() if ": " in line}
    for d in sorted(gone, key=len):  # parents first
        if (d in owned or d[len("/usr") :] in owned) and host.is_dir(d.rpartition("/")[0]):
            mode, uid, gid = dirs[d]
            real = host.location(d)
            try:
                os.mkdir(real, 0o700)
                os.chown(real, uid, gid)
                os.chmod(real, mode)
            except OSError as exc:
                log.warning("could not make %s again (dpkg deleted it): %s", d, exc.strerror)
                continue
            log.info("made %s again: a package kept here lists it (merged /usr)", d)


def _not_needed_by_others(
    host: Host, named: Sequence[str], deps: Sequence[str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """(the deps that can go with `named`, (dep, why) of those a package outside needs)."""
    if not deps:
        return [], []
    ours = {_base(n) for n in (*named, *deps)}
    others = would_purge(host, [*named, *deps]) - ours
    if not others:
        return list(deps), []
    needed = _depends_closure(host, others, {_base(d) for d in deps}) - others
    who = " ".join(sorted(others)[:3]) + (" and more" if len(others) > 3 else "")
    held = [(d, f"needed by {who}, installed since") for d in deps if _base(d) in needed]
    free = [d for d in deps if _base(d) not in needed]
    still = would_purge(host, [*named, *free]) - ours
    if still:  # needed some other way (through a virtual package): keep them all
        who = " ".join(sorted(still)[:3]) + (" and more" if len(still) > 3 else "")
        held += [(d, f"purging it would remove {who}") for d in free]
        free = []
    return free, held


def _purge_refusing(
    host: Host, names: Sequence[str]
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Purge `names`. When a package's removal script refuses, that package and what it
    depends on among `names` are kept (with their auto-installed mark, which apt dropped when
    it was asked to purge them) and the others purged in a second run. Returns (purged, kept)."""
    if not names:
        return (), ()
    auto_before = auto_installed(host)
    try:
        _purge(host, names)
        return tuple(names), ()
    except ExecutionError as exc:
        out = exc.stderr_tail
        named = _REFUSED.findall(out) + " ".join(_SUMMARY.findall(out)).split()
        refused = {_base(n) for n in named}
        if not refused:
            raise
    there = present_packages(host)
    left = [n for n in names if _base(n) in there]
    needed = _depends_closure(host, refused, {_base(n) for n in left})
    # a refused purge may leave the package removed but its configuration there (dpkg's `rc`):
    # kept all the same, so a later rollback tries again
    kept = [(n, "its removal script refused (apt's output above says why)") for n in names
            if _base(n) in refused]  # fmt: skip
    kept += [(n, "a package kept here needs it") for n in left if _base(n) in needed - refused]
    rest = [n for n in left if _base(n) not in needed]
    if rest:
        others = sorted(would_purge(host, rest) - {_base(n) for n in rest})
        if others:
            kept += [(n, f"purging it would remove {' '.join(others)}") for n in rest]
            rest = []
        else:
            _purge(host, rest)
    auto = [n for n, _why in kept if _base(n) in auto_before]
    if auto:
        _apt(host, ["apt-mark", "auto", *auto])
    gone = {k for k, _why in kept}
    return tuple(n for n in names if n not in gone), tuple(kept)


def _depends_closure(host: Host, names: set[str], within: set[str]) -> set[str]:
    """`names` and, within `within`, every package they depend on (Depends, Pre-Depends: each
    alternative counts), from dpkg's status file."""
    text = host.read("/var/lib/dpkg/status") or ""
    native = native_arch(text)
    depends: dict[str, set[str]] = {}
    for stanza in text.split("\n\n"):
        found = re.search(r"^Package:[ \t]*(\S+)", stanza, re.M)
        if not found:
            continue
        arch = re.search(r"^Architecture:[ \t]*(\S+)", stanza, re.M)
        key = found.group(1)  # as apt names it: another architecture's as name:arch
        if arch and arch.group(1) not in (native, "all"):
            key += ":" + arch.group(1)
        fields = re.findall(r"^(?:Pre-)?Depends:[ \t]*(.*)$", stanza, re.M)
        wanted = {re.split(r"[\s(:]", alt.strip(), maxsplit=1)[0] for f in fields
                  for alt in re.split(r"[,|]", f) if alt.strip()}  # fmt: skip
        depends[key] = wanted
    out, todo = set(names), list(names)
    while todo:
        for dep in depends.get(todo.pop(), set()) & within:
            if dep not in out:
                out.add(dep)
                todo.append(dep)
    return out


def _purge(host: Host, names: Sequence[str]) -> None:
    if not names:
        return
    argv = ["apt-get", "-y", *OPTIONS, "purge", *names]
    env = {**APT_ENV, **IMAGE_ENV} if host.kind == "root" else APT_ENV
    _apt(host, argv, env, show_line)


def _apt(
    host: Host,
    argv: list[str],
    env: dict[str, str] = APT_ENV,
    on_line: Callable[[str], None] | None = None,
) -> Result:
    """apt-get, its lock held elsewhere past the timeout a BusyError (exit 5), as for install."""
    try:
        return host.run_checked(argv, env=env, on_line=on_line, timeout=LOCK_TIMEOUT_S + 600)
    except ExecutionError as exc:
        raise_if_locked(host, exc.stderr_tail, LOCK_TIMEOUT_S)
        raise


def _base(name: str) -> str:
    """`libfoo:amd64` as dpkg's status file names it: `libfoo` (one architecture here)."""
    return name.split(":", 1)[0]
