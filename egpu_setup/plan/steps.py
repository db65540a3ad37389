"""The install plan: ordered, typed steps computed as a diff against the host.

Pure over its inputs (facts, profile, resolution, rendered files) plus what it *reads* through the
Host to diff: current file contents, the dpkg status database, apt sources, unit links, and the
torch version in an existing venv (read from its dist-info METADATA, never by importing torch).
So a second run on a converged machine plans nothing (reference/hotplug-security.md §6.6).

Order matters: package sources, packages, files, units, commands that consume files (initramfs,
reloads), the torch venv, and a reboot marker last, so a reboot never blocks the parts that do not
need it, and a failed torch download never leaves a written file's command undone. A command whose
trigger file an earlier run wrote but which never succeeded is owed (`Manifest.pending_commands`)
and planned again even though its files no longer differ.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from egpu_setup.errors import EgpuSetupError, UsageError

PARTS = ("driver", "torch", "config")
DEFAULT_VENV = "/opt/egpu-setup/venv"
DEFAULT_APT_LOCK_TIMEOUT = 600  # seconds apt waits for the dpkg lock (reference §6.7)
_SOURCES_DIR = "/etc/apt/sources.list.d"
_KEYRINGS_DIR = "/etc/apt/keyrings"  # admin-managed keys, APT >= 2.4 (reference §5.5)
_OUR_MARK = "egpu-setup"  # rendered files carry a header naming us (DESIGN.md, "render")


# -- steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    kind: ClassVar[str] = "step"
    part: ClassVar[str] = "config"

    def describe(self) -> str:
        raise NotImplementedError

    @property
    def part_name(self) -> str:
        """The `--only` part this step belongs to (a field overrides the class default)."""
        return self.__dict__.get("for_part") or self.part

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "description": self.describe()}
        for name, value in self.__dict__.items():
            data[name] = list(value) if isinstance(value, tuple) else value
        data.pop("for_part", None)
        data["part"] = self.part_name
        return data


@dataclass(frozen=True)
class AptRepository(Step):
    """A deb822 drop-in (and for third-party repos a keyring verified by fingerprint, a pin)."""

    kind: ClassVar[str] = "apt-repository"
    part: ClassVar[str] = "driver"
    name: str
    sources_path: str
    content: str
    summary: str
    keyring_path: str | None = None
    keyring_url: str | None = None
    fingerprint: str | None = None
    pin_path: str | None = None
    pin_content: str | None = None
    # an offline bundle's repository: copied from stage_from (a directory on this machine) to
    # stage_to (a host path, inside --root when there is one) before the source is written
    stage_from: str | None = None
    stage_to: str | None = None
    # (file name, sha256) of every file to stage, from the bundle's manifest: the executor hashes
    # the bytes it copies and stages nothing unless each matches (a .deb swapped after planning)
    stage_sha256: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        key = f", key {self.fingerprint[-16:]} checked" if self.fingerprint else ""
        if self.stage_from:
            return (
                f"copy the bundle's packages to {self.stage_to}, add apt source "
                f"{self.sources_path} ({self.summary}) and apt-get update (that source only)"
            )
        return (
            f"add apt source {self.sources_path} ({self.summary}{key}) "
            "and apt-get update (that source only)"
        )


@dataclass(frozen=True)
class AptInstall(Step):
    kind: ClassVar[str] = "apt-install"
    part: ClassVar[str] = "driver"
    packages: tuple[str, ...]
    no_install_recommends: bool = False
    lock_timeout: int = DEFAULT_APT_LOCK_TIMEOUT
    reason: str = ""
    for_part: str = "driver"
    sources_list: str | None = None  # offline bundle: apt sees this one source and nothing else

    def argv(self, simulate: bool = False) -> list[str]:
        argv = [
            "apt-get",
            "-y",
            *bundle_apt_options(self.sources_list),
            "-o",
            f"DPkg::Lock::Timeout={self.lock_timeout}",
            # a user-modified conffile is kept, never prompts (reference §6.3)
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
        ]
        if simulate:
            argv.append("-s")
        argv.append("install")
        if self.no_install_recommends:
            argv.append("--no-install-recommends")
        return [*argv, *self.packages]

    def describe(self) -> str:
        rec = " --no-install-recommends" if self.no_install_recommends else ""
        why = f" ({self.reason})" if self.reason else ""
        only = f" from {self.sources_list} only" if self.sources_list else ""
        return f"apt-get install{rec} {' '.join(self.packages)}{only}{why}"


def bundle_apt_options(sources_list: str | None) -> list[str]:
    """apt options that make `sources_list` the only source apt reads.

    Offline (a bundle), another source's cached lists could offer a newer version of some
    dependency that cannot be downloaded; with only the bundle's repository in view, apt either
    finds everything in the bundle or says what is missing. For `apt-get update` after adding any
    of our sources: refresh that source only, so a stale third-party repository elsewhere on the
    machine (exit 100) cannot make our good source look broken. List-Cleanup=0: `update` must not
    delete the lists of the sources it was told to ignore."""
    if not sources_list:
        return []
    return [
        "-o",
        f"Dir::Etc::SourceList={sources_list}",
        "-o",
        "Dir::Etc::SourceParts=/nonexistent-egpu-setup",
        "-o",
        "APT::Get::List-Cleanup=0",
    ]


@dataclass(frozen=True)
class PipInstall(Step):
    kind: ClassVar[str] = "pip-install"
    part: ClassVar[str] = "torch"
    venv: str
    requirements: tuple[str, ...]
    index_url: str
    create_venv: bool
    python: str  # interpreter that creates the venv
    run_as: str | None = None  # the sudo user owning the venv
    reason: str = ""
    # offline bundle: --no-index --find-links DIR --require-hashes -r FILE (index_url unused)
    find_links: str | None = None
    requirements_file: str | None = None

    def describe(self) -> str:
        create = f"create venv {self.venv}; " if self.create_venv else ""
        who = f" as {self.run_as}" if self.run_as else ""
        source = (
            f" offline from {self.find_links} (hashes from {self.requirements_file})"
            if self.find_links
            else f" --index-url {self.index_url}"
        )
        return f"{create}install {' '.join(self.requirements)} into {self.venv}{source}{who}"


@dataclass(frozen=True)
class WriteFile(Step):
    kind: ClassVar[str] = "write-file"
    part: ClassVar[str] = "config"
    path: str
    content: str
    mode: int
    purpose: str
    action: str  # create / replace
    diff: str
    conflict: bool = False  # the user edited it since our last write (needs --force)
    for_part: str = "config"

    def describe(self) -> str:
        note = " [edited by someone since our last write: needs --force]" if self.conflict else ""
        return f"{self.action} {self.path} (mode {self.mode:04o}): {self.purpose}{note}"


@dataclass(frozen=True)
class EnableUnit(Step):
    """`systemctl enable` done as what it is: a wants/ link; works in a chroot without systemd."""

    kind: ClassVar[str] = "enable-unit"
    part: ClassVar[str] = "config"
    unit: str
    unit_path: str
    links: tuple[str, ...]  # /etc/systemd/system/<target>.wants/<unit>
    conflict: bool = False  # a regular file sits where a link goes: somebody's, needs --force

    @property
    def path(self) -> str:
        return self.links[0]

    def describe(self) -> str:
        note = " [a regular file is in the way: needs --force]" if self.conflict else ""
        return f"enable {self.unit} (link {', '.join(self.links)}){note}"


@dataclass(frozen=True)
class CreateLink(Step):
    """A managed symlink (display mode: xorg.conf.d -> the snippet egpu-hotplug writes at boot)."""

    kind: ClassVar[str] = "create-link"
    part: ClassVar[str] = "config"
    path: str
    target: str
    purpose: str
    conflict: bool = False

    def describe(self) -> str:
        note = " [a file is in the way: needs --force]" if self.conflict else ""
        return f"link {self.path} -> {self.target}: {self.purpose}{note}"


@dataclass(frozen=True)
class RunCommand(Step):
    kind: ClassVar[str] = "run-command"
    part: ClassVar[str] = "config"
    argv: tuple[str, ...]
    reason: str
    skip_if_missing: bool = True  # e.g. no initramfs-tools in a minimal image: nothing to rebuild
    live_only: bool = False  # reloads make sense only on a running system, not in --root
    for_part: str = "config"
    # the files whose change makes this command due; the executor marks it owed before writing
    # them and clears it when it succeeded, so a failed or killed run re-plans it (`owed`)
    triggers: tuple[str, ...] = ()
    owed: bool = False  # planned because an earlier run wrote a trigger and never ran it
    # changes the boot configuration (update-grub, grubby): never run on --yes alone; the
    # installer asks, or refuses it without an explicit opt-in (see `Plan.consent_steps`)
    consent: bool = False

    def describe(self) -> str:
        notes = [self.reason]
        if self.owed:
            notes.append("owed by an earlier run that did not finish it")
        if self.consent:
            notes.append("changes the boot configuration: needs your explicit consent")
        return f"run {' '.join(self.argv)} ({'; '.join(notes)})"


@dataclass(frozen=True)
class RebootNeeded(Step):
    kind: ClassVar[str] = "reboot-needed"
    part: ClassVar[str] = "driver"
    reason: str

    def describe(self) -> str:
        return f"reboot needed: {self.reason}"


@dataclass(frozen=True)
class PlanOptions:
    only: frozenset[str] = frozenset(PARTS)
    venv: str = DEFAULT_VENV
    index_url: str | None = None  # a lab mirror of the variant index; replaces it, never extra
    force: bool = False
    apt_lock_timeout: int = DEFAULT_APT_LOCK_TIMEOUT
    target: str = "live"  # live / root: what kind of system the steps land on
    pending_reboot: str | None = None  # reason from the journal when a reboot is still owed
    sudo_user: str | None = None
    sudo_uid: int | None = None
    bundle: BundleSource | None = None  # install --bundle: everything from there, offline


@dataclass(frozen=True)
class BundleSource:
    """What `install --bundle DIR` takes from the bundle for this machine's target."""

    directory: str  # the bundle on this machine (absolute)
    target: str  # "py3.11-debian-12"
    distro: str | None  # the driver part's repository; None: bundle has no driver part
    find_links: str | None  # absolute wheel pool
    requirements_file: str | None  # absolute requirements file with --hash lines
    repository: str | None  # absolute directory holding the .debs and Packages
    packages_sha256: str | None = None  # of repository/Packages, from the manifest
    # (file name, sha256) of every file in `repository`, from the manifest; empty: read from
    # the bundle's manifest.json when the plan is built
    repository_sha256: tuple[tuple[str, str], ...] = ()

    def repository_hashes(self) -> tuple[tuple[str, str], ...]:
        """What the bundle's manifest says each repository file must hash to."""
        if self.repository_sha256 or self.repository is None:
            return self.repository_sha256
        import posixpath
        from pathlib import Path

        from egpu_setup.bundle.builder import load_manifest

        rel = posixpath.relpath(self.repository, self.directory).rstrip("/") + "/"
        out = []
        for path, entry in load_manifest(Path(self.directory)).files().items():
            name = path[len(rel) :]
            if path.startswith(rel) and name and "/" not in name:
                out.append((name, str(entry.get("sha256", ""))))
        return tuple(sorted(out))

    @property
    def stage_to(self) -> str:
        return f"/var/lib/egpu-setup/bundle-apt/{self.distro}"

    @property
    def sources_path(self) -> str:
        return f"{_SOURCES_DIR}/egpu-setup-bundle.sources"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not self.steps

    @property
    def conflicts(self) -> tuple[Step, ...]:
        """Steps that would replace somebody else's file (each has a `path`)."""
        return tuple(s for s in self.steps if getattr(s, "conflict", False))

    @property
    def consent_steps(self) -> tuple[RunCommand, ...]:
        """Steps that change the boot configuration: `--yes` alone must not run them."""
        return tuple(s for s in self.steps if isinstance(s, RunCommand) and s.consent)

    @property
    def needs_root(self) -> bool:
        return any(not isinstance(s, PipInstall) for s in self.steps)

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.steps]


def parse_only(text: str | None, known: tuple[str, ...] = PARTS) -> frozenset[str]:
    """`--only a,b`: a subset of `known` (all of it when not given); UsageError otherwise."""
    if text is None:
        return frozenset(known)
    parts = {p.strip() for p in text.split(",") if p.strip()}
    bad = sorted(parts - set(known))
    if bad or not parts:
        raise UsageError(
            f"--only {text!r}: unknown part {', '.join(bad) or '(empty)'}",
            f"choose from {','.join(known)}",
        )
    return frozenset(parts)


def check_index_url(url: str) -> str:
    """https for anything remote; plain http only on this machine (a loopback mirror)."""
    from urllib.parse import urlsplit

    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise UsageError(
            f"--index-url {url!r}: a URL has no spaces or control characters",
            "pass one URL: the mirror of the resolved variant's index",
        )
    parts = urlsplit(url)
    if parts.username or parts.password:
        # It would be printed in the plan and kept in reports a lab collects.
        raise UsageError(
            "--index-url carries credentials: they would end up in the plan and the reports",
            "put them in ~/.netrc (pip and uv read it) and pass the URL without them",
        )
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and loopback:
        return url
    if parts.scheme == "file" and parts.path:
        return url
    raise UsageError(
        f"--index-url {url!r}: only https:// (or http:// on 127.0.0.1, file://) is accepted",
        "pass the https URL of your lab's mirror of the PyTorch index",
    )


# -- reading the host (diff inputs) ---------------------------------------------------------------


def installed_packages(host: Any) -> dict[str, str]:
    """name -> version of every package dpkg says is installed (reads /var/lib/dpkg/status)."""
    text = host.read("/var/lib/dpkg/status") or ""
    out: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields = dict(
            (m.group(1), m.group(2).strip())
            for m in re.finditer(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M)
        )
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            out[fields["Package"]] = fields.get("Version", "")
    return out


@dataclass(frozen=True)
class AptSource:
    """One source entry as apt sees it (both formats)."""

    path: str
    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None  # the whole value: a path, fingerprints, or an inline key block

    @property
    def signed_by_path(self) -> str | None:
        """The keyring file Signed-By names, or None (no Signed-By, fingerprints, inline key)."""
        value = (self.signed_by or "").strip()
        if value.startswith("/") and "\n" not in value and " " not in value:
            return value
        return None

    @property
    def inline_key(self) -> bool:
        """Signed-By holds the key itself (deb822 multi-line value; PPAs written by apt 2.4+)."""
        return "BEGIN PGP" in (self.signed_by or "") or "\n" in (self.signed_by or "").strip()


def parse_deb822_sources(text: str, path: str) -> list[AptSource]:
    out: list[AptSource] = []
    for stanza in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
                continue
            if ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if not fields.get("uris") or fields.get("enabled", "yes").lower() == "no":
            continue
        out.append(
            AptSource(
                path,
                tuple(fields.get("types", "deb").split()),
                tuple(fields["uris"].split()),
                tuple(fields.get("suites", "").split()),
                tuple(fields.get("components", "").split()),
                fields.get("signed-by", "").strip() or None,
            )
        )
    return out


def parse_one_line_sources(text: str, path: str) -> list[AptSource]:
    out: list[AptSource] = []
    for line in text.splitlines():
        m = re.match(r"^\s*(deb|deb-src)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = dict(o.split("=", 1) for o in (m.group(2) or "").split() if "=" in o)
        out.append(
            AptSource(
                path,
                (m.group(1),),
                (m.group(3),),
                (m.group(4),),
                tuple(m.group(5).split()),
                opts.get("signed-by"),
            )
        )
    return out


def apt_sources(host: Any) -> list[AptSource]:
    sources: list[AptSource] = []
    main = host.read("/etc/apt/sources.list")
    if main:
        sources += parse_one_line_sources(main, "/etc/apt/sources.list")
    for path in host.glob(_SOURCES_DIR, "*.list"):
        sources += parse_one_line_sources(host.read(path) or "", path)
    for path in host.glob(_SOURCES_DIR, "*.sources"):
        sources += parse_deb822_sources(host.read(path) or "", path)
    return sources


def venv_versions(host: Any, venv: str) -> dict[str, str] | None:
    """Normalised distribution name -> version installed in `venv`; None when there is no venv."""
    if not host.exists(f"{venv}/bin/python"):
        return None
    out: dict[str, str] = {}
    for lib in host.glob(f"{venv}/lib", "python*"):
        for info in host.glob(f"{lib}/site-packages", "*.dist-info"):
            meta = host.read(f"{info}/METADATA", 16384) or ""
            name = re.search(r"^Name:\s*(\S+)", meta, re.M)
            version = re.search(r"^Version:\s*(\S+)", meta, re.M)
            if name and version:
                out[_norm(name.group(1))] = version.group(1)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unified_diff(path: str, old: str | None, new: str) -> str:
    a = (old or "").splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    lines = difflib.unified_diff(a, b, f"a{path}" if old is not None else "/dev/null", f"b{path}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


# -- building the plan ----------------------------------------------------------------------------


def build_plan(
    facts: Any,
    profile: Any,
    resolution: Any,
    rendered_files: Sequence[Any],
    host: Any,
    options: PlanOptions,
    manifest: Any = None,
    commands: Sequence[Any] = (),
    links: Sequence[Any] = (),
) -> Plan:
    """The steps that take `host` from what it is to what the profile and resolution ask for."""
    steps: list[Step] = []
    warnings: list[str] = []
    live = options.target == "live"
    if "driver" in options.only and host.listdir("/var/lib/dpkg/updates"):
        # apt refuses to work until this is done (reference §6.8); doing it first is what a
        # person would do, and it is shown in the plan so nobody is surprised
        steps.append(
            RunCommand(
                ("dpkg", "--configure", "-a"),
                "an earlier package installation was interrupted",
                skip_if_missing=False,
                for_part="driver",
            )
        )

    driver_steps = _driver_steps(facts, resolution, host, options, warnings)
    file_steps, unit_steps, cmd_steps = _config_steps(
        rendered_files, host, options, manifest, commands, facts
    )

    if "driver" in options.only:
        steps += driver_steps
    # the commands that consume the files (initramfs, udev/systemd reloads) come right after
    # them: a torch download that fails or is interrupted must not leave them undone
    steps += file_steps + unit_steps + _link_steps(links, host, options) + cmd_steps
    if "torch" in options.only:
        steps += _torch_steps(resolution, host, options, warnings)
    wants_reboot = [
        s for s in driver_steps if isinstance(s, AptInstall)
    ] and "driver" in options.only
    module_reason = _module_config_reboot(facts, file_steps)
    if live and (wants_reboot or module_reason):
        steps.append(
            RebootNeeded(
                "the new NVIDIA kernel module takes effect at the next boot"
                if wants_reboot
                else module_reason
            )
        )
    elif live and options.pending_reboot:
        steps.append(RebootNeeded(options.pending_reboot))
    return Plan(tuple(steps), tuple(warnings))


def _module_config_reboot(facts: Any, file_steps: Sequence[Step]) -> str | None:
    """Why changed modprobe.d files need a reboot, or None: they only matter to a module that is
    loaded now (a module loaded later, when the eGPU appears, reads them then)."""
    written = {s.path for s in file_steps if isinstance(s, WriteFile)}
    nv = getattr(facts, "nvidia", None)
    gpus = getattr(facts, "gpus", ())
    nouveau_in_use = bool(nv and nv.nouveau_loaded) or any(g.driver == "nouveau" for g in gpus)
    if any("nouveau" in p for p in written if p.startswith("/etc/modprobe.d/")) and nouveau_in_use:
        return "nouveau holds the GPU now: the blacklist takes effect at the next boot"
    nvidia_conf = any(p.startswith("/etc/modprobe.d/") and "nouveau" not in p for p in written)
    if nvidia_conf and nv is not None and nv.module_loaded:
        return "the NVIDIA module options take effect when the module loads again (next boot)"
    return None


def _driver_steps(
    facts: Any, resolution: Any, host: Any, options: PlanOptions, warnings: list[str]
) -> list[Step]:
    driver = resolution.driver
    if driver.action not in ("install", "upgrade"):
        return []
    steps: list[Step] = []
    os_id = (facts.os.id or "").lower() if facts is not None else ""
    codename = facts.os.codename if facts is not None else None
    if options.bundle is not None:
        return _bundle_driver_steps(driver, host, options)
    if driver.source == "nvidia-repo" and driver.repo is not None:
        steps.append(_nvidia_repo_step(driver, host))
    elif driver.apt_components:
        step = _components_step(host, tuple(driver.apt_components), codename, os_id, warnings)
        if step is not None:
            steps.append(step)
    installed = installed_packages(host)
    wanted = list(driver.packages)
    pin = getattr(driver.repo, "pin", None) if driver.source == "nvidia-repo" else None
    if pin and pin not in wanted:
        # NVIDIA's branch-pinning package (branches >= 590) keeps apt on the resolved branch
        wanted.insert(0, pin)
    kernel = facts.os.kernel if facts is not None else None
    if os_id == "debian" and any("nvidia" in p for p in wanted):
        wanted += _debian_headers(facts, host, options, wanted, kernel, warnings)
    missing = tuple(p for p in wanted if p not in installed)
    if missing or driver.action == "upgrade":
        steps.append(
            AptInstall(
                missing or tuple(wanted),
                # Recommends stay on: trixie's dkms only Recommends gcc, and the driver's
                # Recommends carry nvidia-persistenced (reference/fleet-and-testing.md §3)
                no_install_recommends=False,
                lock_timeout=options.apt_lock_timeout,
                reason=f"NVIDIA driver branch {driver.branch}"
                if driver.branch
                else "NVIDIA driver",
            )
        )
    return steps


# A Debian/Ubuntu kernel release as its linux-headers-<release> package is named:
# "6.1.0-37-amd64", "6.12.57+deb13-amd64", "6.12.38+deb13-rt-amd64", "6.8.0-45-generic".
# Lowercase package-name characters only (Debian Policy §5.6.1), so it is safe in an argv.
_KERNEL_RELEASE = re.compile(r"^[0-9]+\.[0-9]+(?:\.[0-9]+)?(?:[-+~.][a-z0-9]+)*-[a-z0-9]+$")


def _debian_headers(
    facts: Any,
    host: Any,
    options: PlanOptions,
    wanted: Sequence[str],
    kernel: str | None,
    warnings: list[str],
) -> list[str]:
    """Headers DKMS needs to build the module: the meta package, and on a live system the
    running kernel's own headers too.

    Debian 13's dkms no longer Recommends any headers (reference/fleet-and-testing.md §3), and
    the meta package (which the resolver names) only follows the *newest* kernel: a machine
    running an older ABI would get no module for the kernel it boots until it boots the new
    one. An image (--root) has no running kernel: the meta package is all it can name."""
    arch = "amd64" if (facts.os.arch or "x86_64") in ("x86_64", "amd64") else facts.os.arch
    extra: list[str] = []
    if not any(p.startswith("linux-headers-") for p in wanted):
        extra.append(f"linux-headers-{arch}")
    if options.target != "live" or not kernel:
        return extra
    if not _KERNEL_RELEASE.match(kernel):
        warnings.append(
            f"running kernel {kernel!r} is not a Debian kernel package name: its headers are "
            "not installed; DKMS builds the module for the archive kernel only"
        )
        return extra
    name = f"linux-headers-{kernel}"
    if name in wanted:
        return extra
    known = _apt_candidate(host, name)
    if known is False:
        warnings.append(
            f"{name} is not in the apt cache (the archive has moved on to a newer kernel): the "
            "module is built for the newest kernel only; boot it before using the eGPU"
        )
        return extra
    return [*extra, name]  # True, or None (cannot ask apt here): apt says clearly if it is gone


def _apt_candidate(host: Any, package: str) -> bool | None:
    """Does apt have an installation candidate for `package`? None when apt cannot be asked."""
    if getattr(host, "kind", None) not in ("live", "root"):
        return None
    try:
        res = host.run(["apt-cache", "policy", package], timeout=60, env={"LC_ALL": "C.UTF-8"})
    except (EgpuSetupError, OSError):  # no apt-cache there: plan it and let apt say
        return None
    if res.rc != 0:
        return None
    m = re.search(r"^\s*Candidate:\s*(\S+)", res.out, re.M)
    return bool(m) and m.group(1) != "(none)"


def bundle_sources_content(stage_to: str) -> str:
    return (
        "# Written by egpu-setup: the offline bundle's packages, copied to this machine.\n"
        "# Trusted: yes is safe only because this is a local directory that egpu-setup filled\n"
        "# after checking every .deb and the Packages index against the sha256 in the bundle's\n"
        "# manifest; a flat local repository has no signed Release file for apt to check.\n"
        "# Never copy this line to a remote source. Remove with `egpu-setup rollback`.\n"
        f"Types: deb\nURIs: file:{stage_to}\nSuites: ./\nTrusted: yes\n"
    )


def _bundle_driver_steps(driver: Any, host: Any, options: PlanOptions) -> list[Step]:
    """Offline: the bundle's repository (staged on the target) is the only apt source used."""
    b = options.bundle
    assert b is not None
    if b.repository is None:
        return []
    installed = installed_packages(host)
    missing = tuple(p for p in driver.packages if p not in installed)
    if not missing:
        return []
    steps: list[Step] = []
    content = bundle_sources_content(b.stage_to)
    staged = host.read_bytes(f"{b.stage_to}/Packages")
    fresh = staged is not None and hashlib.sha256(staged).hexdigest() == b.packages_sha256
    if host.read(b.sources_path) != content or not fresh:
        steps.append(
            AptRepository(
                name="bundle",
                sources_path=b.sources_path,
                content=content,
                summary=f"offline bundle {b.target}",
                stage_from=b.repository,
                stage_to=b.stage_to,
                stage_sha256=b.repository_hashes(),
            )
        )
    steps.append(
        AptInstall(
            missing,
            no_install_recommends=False,
            lock_timeout=options.apt_lock_timeout,
            reason=f"NVIDIA driver branch {driver.branch} from the bundle"
            if driver.branch
            else "NVIDIA driver from the bundle",
            sources_list=b.sources_path,
        )
    )
    return steps


def _components_step(
    host: Any, components: tuple[str, ...], codename: str | None, os_id: str, warnings: list[str]
) -> Step | None:
    """A drop-in that enables `components` on the distro archive's suites the host uses for `main`.

    Only the distribution's own archive is mirrored, never a PPA or third-party repository that
    happens to have a `main` component: our stanza would repeat its URI and suite without its key
    (apt: "Conflicting values set for option Signed-By", or NO_PUBKEY), and that archive has no
    contrib/non-free anyway. Signed-By is copied only when it names a keyring file."""
    sources = [s for s in apt_sources(host) if "deb" in s.types]
    ours = f"{_SOURCES_DIR}/egpu-setup-{os_id or 'distro'}-components.sources"
    stanzas: list[str] = []
    skipped: list[str] = []
    for src in sources:
        if src.path == ours or "main" not in src.components:
            continue
        if codename and not any(s.split("-")[0] == codename for s in src.suites):
            continue
        if not _is_distro_archive(host, src, os_id):
            skipped.append(f"{src.path} ({' '.join(src.uris)})")
            continue
        enabled = {
            c
            for other in sources
            if other.uris == src.uris and set(other.suites) & set(src.suites)
            for c in other.components
            if other.path != ours
        }
        need = [c for c in components if c not in enabled]
        if not need:
            continue
        lines = [
            "Types: deb",
            f"URIs: {' '.join(src.uris)}",
            f"Suites: {' '.join(src.suites)}",
            f"Components: {' '.join(need)}",
        ]
        if src.signed_by_path:
            lines.append(f"Signed-By: {src.signed_by_path}")
        stanza = "\n".join(lines) + "\n"
        if stanza not in stanzas:
            stanzas.append(stanza)
    if not stanzas:
        if not any("main" in s.components for s in sources):
            warnings.append("no apt source with the `main` component found; components not added")
        elif skipped and not any(_is_distro_archive(host, s, os_id) for s in sources):
            warnings.append(
                f"no {os_id or 'distribution'} archive source found (only "
                f"{', '.join(skipped)}): enable {' '.join(components)} yourself"
            )
        return None
    header = (
        "# Written by egpu-setup: the archive components the NVIDIA driver lives in.\n"
        "# Remove with `egpu-setup rollback`.\n"
    )
    content = header + "\n".join(stanzas)
    current = host.read(ours)
    if current == content:
        return None
    return AptRepository(
        name=f"{os_id or 'distro'}-components",
        sources_path=ours,
        content=content,
        summary=" ".join(components),
    )


# Origin of the distribution's own archive in its Release file, by os-release ID.
_ARCHIVE_ORIGIN = {"debian": "Debian", "ubuntu": "Ubuntu"}


def _is_distro_archive(host: Any, src: AptSource, os_id: str) -> bool:
    """Is `src` the distribution's own archive (or a mirror of it), not a PPA or third party?

    Evidence, strongest first: an inline key is never the archive's; the Origin field of the
    Release file apt already fetched for it (`Origin: Debian`; a PPA says `LP-PPA-…`); else its
    Signed-By keyring is the archive keyring, or it has no Signed-By at all (the archive keys
    are trusted globally from /etc/apt/trusted.gpg.d, as the installer writes sources.list)."""
    if src.inline_key or (src.signed_by and not src.signed_by_path):
        return False
    origin = _release_origin(host, src)
    if origin is not None:
        return origin == _ARCHIVE_ORIGIN.get(os_id, os_id.capitalize())
    if src.signed_by_path is None:
        return True
    name = src.signed_by_path.rsplit("/", 1)[-1]
    return name in (f"{os_id}-archive-keyring.gpg", f"{os_id}-archive-keyring.pgp")


def _release_origin(host: Any, src: AptSource) -> str | None:
    """`Origin:` of the (In)Release apt stored for src's first suite; None when not fetched yet.

    apt names list files after the URI without its scheme, '/' as '_' (apt-pkg URItoFileName)."""
    for uri in src.uris:
        base = re.sub(r"^[a-z0-9+]+:/*", "", uri).rstrip("/").replace("/", "_")
        for suite in src.suites[:1]:
            for name in ("InRelease", "Release"):
                text = host.read(f"/var/lib/apt/lists/{base}_dists_{suite}_{name}", 8192)
                if text:
                    m = re.search(r"^Origin:[ \t]*(.+?)[ \t]*$", text, re.M)
                    return m.group(1) if m else None
    return None


def _nvidia_repo_step(driver: Any, host: Any) -> AptRepository:
    repo = driver.repo
    name = "nvidia-cuda"
    keyring = f"{_KEYRINGS_DIR}/egpu-setup-{name}.gpg"
    content = (
        "# Written by egpu-setup: NVIDIA's CUDA repository, trusted only through its own key.\n"
        f"Types: deb\nURIs: {repo.url}\nSuites: /\nSigned-By: {keyring}\n"
    )
    return AptRepository(
        name=name,
        sources_path=f"{_SOURCES_DIR}/egpu-setup-{name}.sources",
        content=content,
        summary="NVIDIA CUDA repository",
        keyring_path=keyring,
        keyring_url=repo.keyring_url,
        fingerprint=repo.fingerprint,
    )


def _file_part(path: str) -> str:
    return "driver" if path.startswith("/etc/modprobe.d/") else "config"


def _not_a_link(host: Any, path: str) -> bool:
    """A regular file (or directory) where we would put a symlink: it is somebody's."""
    return host.readlink(path) is None and (host.exists(path) or host.is_dir(path))


def _link_steps(links: Iterable[Any], host: Any, options: PlanOptions) -> list[Step]:
    if "config" not in options.only:
        return []
    return [
        CreateLink(
            link.path,
            link.target,
            link.purpose,
            conflict=_not_a_link(host, link.path) and not options.force,
        )
        for link in links
        if host.readlink(link.path) != link.target
    ]


def _config_steps(
    rendered: Iterable[Any],
    host: Any,
    options: PlanOptions,
    manifest: Any,
    commands: Sequence[Any],
    facts: Any,
) -> tuple[list[Step], list[Step], list[Step]]:
    files: list[Step] = []
    units: list[Step] = []
    cmds: list[Step] = []
    live = options.target == "live"
    changed: set[str] = set()
    for rf in rendered:
        part = _file_part(rf.path)
        if part not in options.only:
            continue
        current = host.read_bytes(rf.path)
        if current != rf.content.encode() or _mode_of(host, rf.path) not in (None, rf.mode):
            ours = manifest is not None and manifest.is_ours(rf.path, current)
            known = manifest is not None and rf.path in manifest.files
            # not ours: edited after our last write, or somebody else's file without our header
            foreign = (
                current is not None and not ours and (known or _OUR_MARK not in _head(current))
            )
            old_text = current.decode("utf-8", errors="replace") if current is not None else None
            files.append(
                WriteFile(
                    path=rf.path,
                    content=rf.content,
                    mode=rf.mode,
                    purpose=rf.purpose,
                    action="create" if current is None else "replace",
                    diff=unified_diff(rf.path, old_text, rf.content),
                    conflict=foreign and not options.force,
                    for_part=part,
                )
            )
            changed.add(rf.path)
        if rf.path.startswith("/etc/systemd/system/") and rf.path.endswith(
            (".service", ".timer", ".path")
        ):
            unit = rf.path.rsplit("/", 1)[1]
            links = tuple(
                f"/etc/systemd/system/{target}.wants/{unit}"
                for target in _wanted_by(rf.content)
                if host.readlink(f"/etc/systemd/system/{target}.wants/{unit}") != rf.path
            )
            if links:
                blocked = any(_not_a_link(host, link) for link in links) and not options.force
                units.append(EnableUnit(unit, rf.path, links, conflict=blocked))
    # argv tuples an earlier run wrote a trigger for but never finished (state.Manifest); the
    # getattr default keeps a manifest without that record working
    owed_fn = getattr(manifest, "pending_commands", None)
    owed = {tuple(a) for a in (owed_fn() if callable(owed_fn) else ())}
    for cmd in commands:
        argv = tuple(cmd.argv)
        if argv[:2] == ("systemctl", "enable"):
            continue  # done as EnableUnit links: works in a chroot and rolls back exactly
        after = tuple(getattr(cmd, "after", ()) or ())
        reload_for_links = argv[:2] == ("systemctl", "daemon-reload") and bool(units)
        is_owed = argv in owed
        if after and not changed & set(after) and not reload_for_links and not is_owed:
            continue
        reloads = argv[0] in ("udevadm", "systemctl", "boltctl")
        if argv[0] == "boltctl" and _bolt_already_stored(facts, argv):
            continue
        part = "driver" if any(a.startswith("/etc/modprobe.d/") for a in after) else "config"
        if part not in options.only:
            continue
        if reloads and not live:
            continue  # nothing runs in an image: the services read the files at boot
        consent = bool(getattr(cmd, "consent", False))
        cmds.append(
            RunCommand(
                argv,
                cmd.purpose,
                live_only=reloads,
                for_part=part,
                triggers=after,
                owed=is_owed and not changed & set(after),
                consent=consent,
            )
        )
    return files, units, cmds


def _bolt_already_stored(facts: Any, argv: tuple[str, ...]) -> bool:
    uid = argv[-1]
    devices = getattr(getattr(facts, "thunderbolt", None), "devices", ()) or ()
    return any(d.unique_id == uid and d.policy for d in devices)


def _head(data: bytes) -> str:
    return data[:2048].decode("utf-8", errors="replace")


def _mode_of(host: Any, path: str) -> int | None:
    try:
        return host.real_path(path).stat().st_mode & 0o7777
    except OSError:
        return None


def _wanted_by(unit_text: str) -> list[str]:
    out: list[str] = []
    section = None
    for line in unit_text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Install]" and line.startswith("WantedBy="):
            out += line.split("=", 1)[1].split()
    return out


def _torch_steps(
    resolution: Any, host: Any, options: PlanOptions, warnings: list[str]
) -> list[Step]:
    torch = resolution.torch
    if torch is None or not torch.requirements:
        return []
    from packaging.requirements import InvalidRequirement, Requirement

    installed = venv_versions(host, options.venv)
    missing: list[str] = []
    for text in torch.requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise UsageError(f"torch requirement {text!r}: {exc}", "check --torch") from exc
        have = (installed or {}).get(_norm(req.name))
        if have is None or not req.specifier.contains(have, prereleases=True):
            missing.append(text)
    if not missing:
        return []
    b = options.bundle
    if b is not None:
        if b.find_links is None:
            return []
        return [
            PipInstall(
                venv=options.venv,
                requirements=tuple(torch.requirements),
                index_url="",
                create_venv=installed is None,
                python=_python_for(resolution, host),
                run_as=_run_as(host, options, installed),
                reason=f"torch {torch.version} ({torch.variant}) from the bundle",
                find_links=b.find_links,
                requirements_file=b.requirements_file,
            )
        ]
    index = check_index_url(options.index_url or torch.index_url)
    why = f"torch {torch.version} ({torch.variant})"
    return [
        PipInstall(
            venv=options.venv,
            requirements=tuple(torch.requirements),
            index_url=index,
            create_venv=installed is None,
            python=_python_for(resolution, host),
            run_as=_run_as(host, options, installed),
            reason=why,
        )
    ]


def _python_for(resolution: Any, host: Any) -> str:
    python = f"python{resolution.python}" if resolution.python else "python3"
    return python if host.which(python) is not None else "python3"


def _run_as(host: Any, options: PlanOptions, installed: dict[str, str] | None) -> str | None:
    if options.sudo_user and options.sudo_uid not in (None, 0):
        owner = _owner(host, options.venv if installed is not None else _parent(options.venv))
        if owner == options.sudo_uid:
            return options.sudo_user  # never leave root-owned files in a user's venv (§5.2)
    return None


def _parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] or "/"


def _owner(host: Any, path: str) -> int | None:
    try:
        return host.real_path(path).stat().st_uid
    except OSError:
        return None
