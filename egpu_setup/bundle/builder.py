"""Building an offline bundle: one download for a whole lab (its layout: bundle/format.py).

Downloads follow the one-index rule (docs/sources.md, "One index"): torch comes through the
variant's `--index-url` (or the lab's mirror of it) with pip's configuration switched off, in a
call of its own; the dependencies that live on the general index come through this machine's own
pip configuration in a SEPARATE call. Never `--extra-index-url`, never both in one resolver run.
The driver's .debs come from `apt-get install --download-only` inside a debootstrap root of the
target distribution with an empty dpkg status, so the set is self-contained: a laptop a few point
releases behind still finds every dependency in the bundle (tests/test_bundle.py installs from it
with no network).

Incremental: each part (a wheel pool, a distro's debs, the tool) records its inputs; a second run
with the same inputs whose files still match their hashes downloads nothing.

Processes (pip, debootstrap, apt-get in the root, dpkg-scanpackages) run through the Host, and
none of them writes into the bundle: pip downloads into a private directory of root's (mkdtemp,
0700), apt into the debootstrap root, and what they made is copied into `--out` through its
OutputTree (state/output.py), one directory descriptor at a time with no link followed. A folder
of the bundle swapped for a link while pip downloads (by a user who owns `--out`) is refused
there, exit 2, and nothing is written through it.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from egpu_setup.bundle.format import (
    MANIFEST,
    PIN_FILE,
    PROFILE_FILE,
    SCHEMA,
    load_manifest,
    sha256_file,
)
from egpu_setup.bundle.targets import Target
from egpu_setup.bundle.wheels import (
    Wheel,
    closure,
    direct_requirements,
    glibc_minor,
    manylinux_minor,
    matching,
    platform_tags,
    read_wheel,
    requirements_text,
    root_names,
    wheel_pool,
    without_marker,
)
from egpu_setup.errors import EgpuSetupError, ExecutionError, UsageError
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger
from egpu_setup.profile.types import Profile
from egpu_setup.state.atomic import atomic_write
from egpu_setup.state.output import OutputTree
from egpu_setup.state.tool_wheels import KEPT, SUMS, KeptWheels, for_python
from egpu_setup.state.tool_wheels import own as own_wheels

log = get_logger("egpu_setup.bundle")


DOWNLOAD_TIMEOUT = 3600  # seconds for one pip/apt download call (3 GB of CUDA wheels)


_APT_WORK = "/var/lib/egpu-setup-bundle"  # inside the debootstrap root


DEB_ARCH = "amd64"


@dataclass(frozen=True)
class BuildOptions:
    out: Path
    index_url: str | None = None  # the lab's mirror of the variant index (replaces it)
    parts: frozenset[str] = frozenset({"torch", "driver", "tool"})
    refresh: bool = False
    cache: Path | None = None  # debootstrap roots; default $EGPU_SETUP_CACHE or /var/cache/...


@dataclass
class BuildReport:
    targets: list[str]
    downloaded: list[str]  # parts that ran a download
    reused: list[str]  # parts whose inputs and files were unchanged
    files: int
    total_bytes: int
    seconds: float
    manifest_sha256: str = ""  # the pin `install --bundle-sha256` needs

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest_sha256": self.manifest_sha256,
            "targets": self.targets,
            "downloaded": self.downloaded,
            "reused": self.reused,
            "files": self.files,
            "total_bytes": self.total_bytes,
            "seconds": round(self.seconds, 1),
        }


class Builder:
    def __init__(self, host: Host, profile: Profile, targets: Sequence[Target], opts: BuildOptions):
        self.host = host
        self.profile = profile
        self.targets = list(targets)
        self.opts = opts
        self.out = Path(os.path.abspath(opts.out))
        self.tree: OutputTree | None = None
        self.stage: Path | None = None
        self.old: dict[str, Any] = {}
        self.parts: dict[str, dict[str, Any]] = {}
        self.downloaded: list[str] = []
        self.reused: list[str] = []

    # -- the whole run ----------------------------------------------------------------------------

    def build(self) -> BuildReport:
        import time

        started = time.monotonic()
        self.tree = OutputTree.open(self.out, what="--out")
        self.out = self.tree.path
        self.tree.mkdir(self.out)
        _refuse_links(self.out)  # a bundle holds regular files only: say so before any download
        self.stage = Path(tempfile.mkdtemp(prefix="egpu-setup-bundle-"))  # 0700, root's
        try:
            return self._build(started)
        finally:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None

    @property
    def _tree(self) -> OutputTree:
        assert self.tree is not None, "build() opens the tree"
        return self.tree

    def _staging(self, name: str) -> Path:
        """A fresh, empty directory in the private one, for a child to write into."""
        assert self.stage is not None, "build() makes the private directory"
        path = self.stage / name.replace("/", "_")
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700)
        return path

    def _publish(self, staged: Path, folder: Path, names: Iterable[str], suffix: str) -> None:
        """`names` from `staged` into `folder` of the bundle; its other `*suffix` files (from an
        older build) removed."""
        keep = set(names)
        self._tree.mkdir(folder)
        for name in sorted(keep):
            self._tree.copy_in(folder / name, staged / name)
        for name in self._tree.names(folder):
            if name.endswith(suffix) and name not in keep:
                log.info("removing %s (no target needs it)", name)
                self._tree.remove(folder / name)

    def _build(self, started: float) -> BuildReport:
        import time

        try:
            self.old = load_manifest(self.out).data if (self.out / MANIFEST).exists() else {}
        except UsageError:
            log.warning("%s: unreadable old manifest, building from scratch", self.out / MANIFEST)
        self._write_profile()
        if "torch" in self.opts.parts:
            by_python: dict[str, list[Target]] = {}
            for t in self.targets:
                by_python.setdefault(t.python, []).append(t)
            for python, group in by_python.items():
                self._wheels(python, group)
        if "driver" in self.opts.parts:
            for distro in dict.fromkeys(t.distro for t in self.targets):
                target = next(t for t in self.targets if t.distro == distro)
                self._debs(target)
        if "tool" in self.opts.parts:
            self._tool()
        manifest, pin = self._write_manifest()
        return BuildReport(
            [t.name for t in self.targets],
            self.downloaded,
            self.reused,
            len(manifest["files"]),
            manifest["total_bytes"],
            time.monotonic() - started,
            pin,
        )

    # -- incremental bookkeeping ------------------------------------------------------------------

    def _unchanged(self, part: str, inputs: dict[str, Any]) -> bool:
        """True when `part` was built from the same inputs and its files still match."""
        old = (self.old.get("parts") or {}).get(part)
        if self.opts.refresh or not old or old.get("inputs") != inputs:
            return False
        hashes = {f["path"]: f for f in self.old.get("files", [])}
        for rel in old.get("files", []):
            entry = hashes.get(rel)
            found = self._tree.digest(self.out / rel)
            if entry is None or found is None or found[1] != entry["size"]:
                return False
            if found[0] != entry["sha256"]:
                log.warning("%s changed since the last build: %s downloads again", rel, part)
                return False
        self.parts[part] = old
        self.reused.append(part)
        log.warning("%s: up to date (%d files verified)", part, len(old.get("files", [])))
        return True

    def _record(self, part: str, inputs: dict[str, Any], files: Iterable[str]) -> None:
        self.parts[part] = {"inputs": inputs, "files": sorted(files)}
        self.downloaded.append(part)

    def _run(
        self,
        argv: Sequence[str],
        what: str,
        timeout: float = DOWNLOAD_TIMEOUT,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> str:
        log.warning("%s", what)
        log.info("run: %s", " ".join(argv))
        res = self.host.run(list(argv), timeout=timeout, env=env, cwd=cwd)
        if res.rc != 0:
            tail = (res.err or res.out).strip().splitlines()[-15:]
            raise ExecutionError(
                f"{what} failed: `{' '.join(argv[:6])} ...` exited with {res.rc}",
                "the output above says why (network, index, package name); fix it and run "
                "`egpu-setup bundle` again: finished parts are kept",
                argv=argv,
                rc=res.rc,
                stderr_tail="\n".join(tail),
            )
        return res.out

    # -- profile ----------------------------------------------------------------------------------

    def _write_profile(self) -> None:
        src = Path(self.profile.path) if self.profile.path else None
        if src is None or not src.is_file():
            raise UsageError(f"profile {self.profile.name} has no file", "pass a profile file")
        data = src.read_bytes()
        dest = self.out / PROFILE_FILE
        if self._tree.read(dest, len(data)) != data:
            self._tree.write(dest, data, 0o644)

    # -- (a) wheels -------------------------------------------------------------------------------

    def _pip(self) -> list[str]:
        return [sys.executable, "-m", "pip"]

    def _download_args(self, python: str, distros: Iterable[str], dest: Path) -> list[str]:
        tags: list[str] = []
        for d in distros:
            tags += [t for t in platform_tags(d) if t not in tags]
        # the intersection of what every target distro runs: a wheel for glibc 2.39 must not
        # reach a 2.35 laptop sharing this Python's pool
        lowest = min(glibc_minor(d) for d in distros)
        tags = [t for t in tags if not t.startswith("manylinux_2_") or manylinux_minor(t) <= lowest]
        args = [
            "download",
            "--progress-bar",
            "off",
            "--disable-pip-version-check",
            "--dest",
            str(dest),
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            python,
        ]
        for tag in tags:
            args += ["--platform", tag]
        return args

    def _wheels(self, python: str, group: list[Target]) -> None:
        """One wheel pool per Python: torch per target from its index, then the dependencies."""
        from egpu_setup.compat.index_url import check_index_url

        rel_pool = group[0].pool
        pool_dir = self.out / rel_pool
        index = {
            t.name: check_index_url(self.opts.index_url or t.resolution.torch.index_url)
            for t in group
        }
        inputs = {
            "python": python,
            "platform": platform_tags(min((t.distro for t in group), key=glibc_minor)),
            "targets": {
                t.name: {
                    "requirements": list(t.resolution.torch.requirements),
                    "index": index[t.name],
                }
                for t in group
            },
        }
        if self._unchanged(rel_pool, inputs):
            return
        staged = self._staging(rel_pool)
        base = self._download_args(python, [t.distro for t in group], staged)
        for t in group:
            self._download_torch(t, base, index[t.name])
        pool = self._download_dependencies(python, group, base, staged)
        hashes = {p.name: sha256_file(p) for p in staged.glob("*.whl")}
        needs = {t.name: closure(pool, t.resolution.torch.requirements, python) for t in group}
        keep = {w.path.name for wheels in needs.values() for w in wheels}
        self._publish(staged, pool_dir, keep, ".whl")  # what no target needs now goes
        for t in group:
            self._write_requirements(t, requirements_text(needs[t.name], hashes, _header(t)))
        written = [t.requirements_file for t in group]
        self._record(rel_pool, inputs, [f"{rel_pool}/{n}" for n in sorted(keep)] + written)

    def _download_torch(self, target: Target, base: list[str], index: str) -> None:
        """torch (+ extras) from the variant index alone: pip's configuration is switched off
        (PIP_CONFIG_FILE=/dev/null, its source variables unset), so no find-links or
        extra-index-url of this machine can mix a second source into it; --no-deps keeps the
        general-index packages out of this call."""
        # the child's environment is clean already (host/process.py: no PIP_* of the caller);
        # pip's own configuration files are switched off here, so the Python is started
        # directly (isolated with -I), not through `env`, whose child the gateway cannot see
        argv = [
            *self._pip(),
            *base,
            "--no-deps",
            "--index-url",
            index,
            *target.resolution.torch.requirements,
        ]
        self._run(
            argv, f"{target.name}: torch wheels from {index}", env={"PIP_CONFIG_FILE": os.devnull}
        )

    def _download_dependencies(
        self, python: str, group: list[Target], base: list[str], staged: Path
    ) -> dict[str, list[Wheel]]:
        """What the torch wheels depend on, in a separate call through this machine's own pip
        configuration (never in the same resolver run as the variant index)."""
        pool = wheel_pool(staged)
        roots = root_names(group)
        deps: list[str] = []
        for t in group:
            for root in t.resolution.torch.requirements:
                for whl in matching(pool, root):
                    for req in direct_requirements(whl, python):
                        text = without_marker(req)
                        if canonicalize_name(req.name) not in roots and text not in deps:
                            deps.append(text)
        if not deps:
            return pool
        self._run(
            [*self._pip(), *base, *deps],
            f"Python {python}: {len(deps)} dependencies from this machine's pip index",
        )
        return wheel_pool(staged)

    def _write_requirements(self, target: Target, text: str) -> None:
        dest = self.out / target.requirements_file
        data = text.encode()
        if self._tree.read(dest, len(data)) != data:
            self._tree.write(dest, data, 0o644)

    # -- (b) driver .debs --------------------------------------------------------------------------

    def _debs(self, target: Target) -> None:
        driver = target.resolution.driver
        part = target.debs
        if driver.action not in ("install", "upgrade") or driver.source != "distro":
            if driver.source == "nvidia-repo":
                raise UsageError(
                    f"{target.distro}: the driver comes from NVIDIA's CUDA repository, which "
                    "bundles do not mirror yet",
                    "pass --only torch,tool, or a --distro whose archive has the branch",
                )
            log.warning("%s: no driver packages to bundle (%s)", target.distro, driver.action)
            return
        from egpu_setup.compat.matrix import load_matrix
        from egpu_setup.resolve.constraints import parse_distro

        matrix = load_matrix()
        distro = matrix.distro(*parse_distro(target.distro, matrix))
        if distro is None:  # resolve_targets checked it: a matrix without it is not ours
            raise UsageError(f"--distro {target.distro}: no driver packages known for it")
        packages = list(driver.packages)
        if distro.scheme == "debian" and not any(p.startswith("linux-headers") for p in packages):
            packages.append(f"linux-headers-{DEB_ARCH}")  # trixie's dkms dropped the Recommends
        sources = self._archive_sources(distro)
        inputs = {
            "distro": target.distro,
            "suite": distro.codename,
            "packages": packages,
            "components": ["main", *driver.apt_components],
            "sources": sources,
        }
        if self._unchanged(part, inputs):
            return
        root = self._build_root(distro.codename, sources[0]["uri"])
        debs = self._apt_download(root, distro, inputs, packages)
        archives = debs[0].parent  # in the root, root's: apt's archive holds exactly these
        names = {src.name for src in debs}
        index = self._run(
            ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
            f"{target.distro}: Packages index for {len(names)} .debs",
            timeout=600,
            cwd=archives,  # the index names each file as ./NAME.deb, as a flat repository wants
        )
        dest = self.out / part
        self._publish(archives, dest, names, ".deb")
        self._tree.write(dest / "Packages", index.encode(), 0o644)
        # the lists (~50 MB) are not kept in the shared root: a rebuild fetches them again
        self._run(
            ["rm", "-rf", "--one-file-system", str(root / _APT_WORK.lstrip("/"))],
            f"{target.distro}: cleaning the apt work directory in the root",
            timeout=300,
        )
        self._record(part, inputs, [f"{part}/{n}" for n in sorted(names)] + [f"{part}/Packages"])

    def _archive_sources(self, distro: Any) -> list[dict[str, Any]]:
        """The archive (and its security archive) this machine's apt uses for distro's family."""
        from egpu_setup.compat.matrix import load_matrix
        from egpu_setup.plan.apt_sources import apt_sources

        family = {d.codename for d in load_matrix().distros if d.scheme == distro.scheme}
        if distro.scheme == "debian":
            family |= {"stable", "oldstable", "testing", "unstable", "sid"}
        main: str | None = None
        security: str | None = None
        signed_by: str | None = None
        for src in apt_sources(self.host):
            if "deb" not in src.types:
                continue
            if not any(s.split("-")[0] in family for s in src.suites):
                continue
            for uri in src.uris:
                if not uri.startswith(("http://", "https://", "file:")):
                    continue
                if any(s.endswith("-security") for s in src.suites) or "security" in uri:
                    security = security or uri
                else:
                    main = main or uri
                    signed_by = signed_by or src.signed_by
        if main is None:
            raise UsageError(
                f"{distro.label}: this machine's apt sources name no {distro.scheme} archive "
                "to download the driver from",
                f"build the bundle on a {distro.scheme} machine, or pass --only torch,tool",
            )
        c = distro.codename
        out = [{"uri": main, "suites": [c, f"{c}-updates"], "signed_by": signed_by}]
        if security:
            out.append({"uri": security, "suites": [f"{c}-security"], "signed_by": signed_by})
        return out

    def _cache(self) -> Path:
        if self.opts.cache is not None:
            return Path(self.opts.cache)
        env = self.host.getenv("EGPU_SETUP_CACHE")
        return Path(env) if env else Path("/var/cache/egpu-setup")

    def _build_root(self, suite: str, mirror: str) -> Path:
        """A minbase debootstrap root of `suite`, cached: it lends apt its keyring and version.

        Same layout and completion marker as tests/helpers/debroot.py, so both can share a cache."""
        if os.geteuid() != 0:
            raise UsageError(
                "bundling driver packages needs root (debootstrap and chroot)",
                "run it with sudo, or pass --only torch,tool",
            )
        if self.host.which("debootstrap") is None:
            raise UsageError(
                "debootstrap is not installed", "apt-get install debootstrap (or --only torch,tool)"
            )
        root = self._cache() / "debroot" / suite
        if (root / ".egpu-setup-debroot-complete").is_file():
            return root
        root.parent.mkdir(parents=True, exist_ok=True)
        # one builder at a time per root (another bundle run, or the tests' own root builder,
        # which takes the same lock): two debootstraps into one `.building` break each other
        fd = os.open(
            root.with_name(root.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return self._build_root_locked(suite, mirror, root)
        finally:
            os.close(fd)

    def _build_root_locked(self, suite: str, mirror: str, root: Path) -> Path:
        if (root / ".egpu-setup-debroot-complete").is_file():
            return root  # the builder we waited for made it
        work = root.with_name(root.name + ".building")
        if work.exists():
            self._run(["rm", "-rf", "--one-file-system", str(work)], "removing a half-built root")
        work.parent.mkdir(parents=True, exist_ok=True)
        self._run(
            ["debootstrap", "--variant=minbase", "--components=main", suite, str(work), mirror],
            f"debootstrap {suite} (once, cached in {root.parent})",
        )
        policy = work / "usr/sbin/policy-rc.d"  # nothing in the root may start a service
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        (work / ".egpu-setup-debroot-complete").write_text(f"{suite} for egpu-setup bundle\n")
        if root.exists():
            self._run(["rm", "-rf", "--one-file-system", str(root)], "replacing a broken root")
        work.rename(root)
        return root

    def _apt_download(
        self, root: Path, distro: Any, inputs: dict[str, Any], packages: list[str]
    ) -> list[Path]:
        from egpu_setup.host.machine import RootHost

        work_host = _APT_WORK
        work = root / work_host.lstrip("/")
        for sub in ("lists/partial", "archives/partial", "sources.d"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        for old in (work / "archives").glob("*.deb"):
            old.unlink()
        (work / "status").write_text("")
        stanzas = []
        for src in inputs["sources"]:
            lines = [
                "Types: deb",
                f"URIs: {src['uri']}",
                f"Suites: {' '.join(src['suites'])}",
                f"Components: {' '.join(inputs['components'])}",
            ]
            keyring = src.get("signed_by")
            if keyring and (root / keyring.lstrip("/")).is_file():
                lines.append(f"Signed-By: {keyring}")
            stanzas.append("\n".join(lines) + "\n")
        (work / "sources.d/bundle.sources").write_text("\n".join(stanzas))
        # a private apt state inside the root: its own sources, lists, archive and an EMPTY
        # dpkg status, so apt downloads the whole dependency closure (libc6 included), not just
        # what a minbase root happens to lack
        opts = [
            "-o", f"Dir::Etc::SourceList={work_host}/sources.d/bundle.sources",
            "-o", f"Dir::Etc::SourceParts={work_host}/sources.d/none",
            "-o", f"Dir::State::Lists={work_host}/lists",
            "-o", f"Dir::Cache::archives={work_host}/archives",
            "-o", f"Dir::State::status={work_host}/status",
            "-o", f"APT::Architecture={DEB_ARCH}",
        ]  # fmt: skip
        chroot = RootHost(root)
        for argv, what in (
            (["apt-get", *opts, "update"], f"{distro.label}: apt-get update (archive lists)"),
            (
                ["apt-get", *opts, "-y", "--download-only", "install", *packages],
                f"{distro.label}: downloading {' '.join(packages)} and their dependencies",
            ),
        ):
            log.warning("%s", what)
            res = chroot.run(
                argv, timeout=DOWNLOAD_TIMEOUT, env={"DEBIAN_FRONTEND": "noninteractive"}
            )
            if res.rc != 0:
                raise ExecutionError(
                    f"{what} failed (exit {res.rc})",
                    "check the archive in /etc/apt/sources.list* and the package names",
                    argv=argv,
                    rc=res.rc,
                    stderr_tail="\n".join((res.err or res.out).strip().splitlines()[-15:]),
                )
        debs = sorted((work / "archives").glob("*.deb"))
        if not debs:
            raise EgpuSetupError(f"{distro.label}: apt downloaded no packages", "see the log above")
        return debs

    # -- (c) the tool itself ----------------------------------------------------------------------

    def _tool(self) -> None:
        """egpu-setup's own wheels, from those it keeps (install/tool_wheels.py: never built
        from a source tree, never fetched by name), and its dependencies for each target Python
        these lack, from this machine's pip index."""
        from egpu_setup import __version__

        kept = own_wheels()
        if kept is None:
            raise UsageError(
                f"this egpu-setup keeps no wheels of its own ({sys.prefix}/{KEPT}, "
                "root's): a bundle's tool part is made from them",
                "install egpu-setup with `sudo bash scripts/install.sh`, or pass --only "
                "torch,driver",
            )
        dest = self.out / "tool"
        pythons = sorted({t.python for t in self.targets})
        distros = sorted({t.distro for t in self.targets})
        inputs = {
            "version": __version__,
            "pythons": pythons,
            "distros": distros,
            "kept": [list(f) for f in kept.files],
        }
        if self._unchanged("tool", inputs):
            return
        staged = self._staging("tool")
        _copy_pinned(kept, staged)
        ours = next(iter(staged.glob("egpu_setup-*.whl")), None)
        if ours is None:
            raise EgpuSetupError(
                f"{kept.directory} keeps no egpu-setup wheel",
                "install egpu-setup again with `sudo bash scripts/install.sh`",
            )
        for python in pythons:
            if _complete(staged, python):
                continue
            reqs = [without_marker(r) for r in direct_requirements(read_wheel(ours), python)]
            self._run(
                [*self._pip(), *self._download_args(python, distros, staged), *reqs],
                f"egpu-setup's dependencies for Python {python}",
            )
            closure(_pool_for(staged, python), ["egpu-setup"], python)  # complete, or an error now
        names = sorted(p.name for p in staged.glob("*.whl"))
        self._publish(staged, dest, names, ".whl")
        self._record("tool", inputs, [f"tool/{n}" for n in names])

    # -- (d) manifest -----------------------------------------------------------------------------

    def _write_manifest(self) -> tuple[dict[str, Any], str]:
        """Write manifest.json and its pin (manifest.sha256); return both."""
        from egpu_setup import __version__

        old_files = {f["path"]: f for f in self.old.get("files", [])}
        reused = {rel for p in self.reused for rel in self.parts[p]["files"]}
        files = []
        for rel in sorted({*(r for p in self.parts.values() for r in p["files"]), PROFILE_FILE}):
            if rel in reused and rel in old_files:
                files.append(old_files[rel])  # verified by _unchanged a moment ago
                continue
            found = self._tree.digest(self.out / rel)
            if found is None:
                raise UsageError(
                    f"--out {self.out}: {rel} is gone or no longer a regular file",
                    "someone else writes in the bundle: make --out yours alone, then run again",
                )
            files.append({"path": rel, "sha256": found[0], "size": found[1]})
        # keep what an earlier build held that this run did not touch (another --only)
        for name, part in (self.old.get("parts") or {}).items():
            if name not in self.parts and all(
                self._tree.digest(self.out / r) is not None for r in part["files"]
            ):
                self.parts[name] = part
                files += [old_files[r] for r in part["files"] if r in old_files]
        targets = []
        for t in self.targets:
            res = t.resolution
            entry: dict[str, Any] = {
                "name": t.name,
                "python": t.python,
                "distro": t.distro,
                "torch": None,
                "driver": None,
            }
            if t.pool in self.parts:
                entry["torch"] = {
                    "version": res.torch.version,
                    "variant": res.torch.variant,
                    "index_url": self.opts.index_url or res.torch.index_url,
                    "requirements": list(res.torch.requirements),
                    "wheels": t.pool,
                    "requirements_file": t.requirements_file,
                }
            if t.debs in self.parts:
                entry["driver"] = {
                    "branch": res.driver.branch,
                    "flavour": res.driver.flavour,
                    "packages": self.parts[t.debs]["inputs"]["packages"],
                    "repository": t.debs,
                }
            targets.append(entry)
        manifest = {
            "schema": SCHEMA,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "tool_version": __version__,
            "profile": {"name": self.profile.name, "file": PROFILE_FILE},
            "targets": targets,
            "parts": self.parts,
            "files": sorted(files, key=lambda f: f["path"]),
            "total_bytes": sum(f["size"] for f in files),
        }
        if {**self.old, "created": None} == {**manifest, "created": None}:
            manifest["created"] = self.old.get("created")  # nothing changed: the same pin
        data = (json.dumps(manifest, indent=2) + "\n").encode()
        self._tree.write(self.out / MANIFEST, data, 0o644)
        pin = hashlib.sha256(data).hexdigest()
        self._tree.write(self.out / PIN_FILE, f"{pin}  {MANIFEST}\n".encode(), 0o644)
        return manifest, pin


def _refuse_links(out: Path) -> None:
    """UsageError naming the first symbolic link under the bundle directory."""
    for dirpath, dirnames, filenames in os.walk(out):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                raise UsageError(
                    f"--out {out}: {path} is a symbolic link (-> {os.readlink(path)}): a bundle "
                    "holds regular files only, and egpu-setup writes through no link",
                    "remove the link, or build into a new directory",
                )


def _header(t: Target) -> str:
    """The comment a requirements file starts with: its target, and how to install from it."""
    return (
        f"# egpu-setup bundle target {t.name}: torch {t.resolution.torch.version} "
        f"({t.resolution.torch.variant})\n"
        "# pip install --no-index --find-links "
        f"{t.pool} --require-hashes -r {t.requirements_file}"
    )


def _copy_pinned(kept: KeptWheels, dest: Path) -> None:
    """Each kept wheel into the bundle, its bytes read once and checked against its sha256."""
    from egpu_setup.host.machine import read_regular
    from egpu_setup.state.atomic import sha256

    for name, want in kept.files:
        data = read_regular(Path(kept.directory) / name, 256 << 20)
        if data is None or sha256(data) != want:
            raise EgpuSetupError(
                f"{kept.directory}/{name} does not match its sha256 in {SUMS}",
                "install egpu-setup again with `sudo bash scripts/install.sh`",
            )
        atomic_write(dest / name, data, 0o644)


def _pool_for(dest: Path, python: str) -> dict[str, list[Wheel]]:
    """The wheels in `dest` a CPython `python` can install."""
    fits = {w.file for w in for_python([(p.name, "") for p in dest.glob("*.whl")], python)}
    return {
        name: [w for w in wheels if w.path.name in fits]
        for name, wheels in wheel_pool(dest).items()
    }


def _complete(dest: Path, python: str) -> bool:
    """Whether `dest` already holds egpu-setup and all it needs on Python `python`."""
    try:
        closure(_pool_for(dest, python), ["egpu-setup"], python)
    except EgpuSetupError:
        return False
    return True
