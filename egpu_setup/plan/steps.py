"""The step types of a plan: typed, frozen, each describing itself for the dry run and JSON.

Order matters (see plan.build): package sources, packages, files, units, commands that consume
files (initramfs, reloads), the torch venv, and a reboot marker last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

DEFAULT_APT_LOCK_TIMEOUT = 600  # seconds apt waits for the dpkg lock (DPkg::Lock::Timeout)
# seconds a download may go without a byte before apt gives it up (Acquire::http::Timeout and
# Acquire::https::Timeout, apt.conf(5): "applies to the connection as well as the data
# timeout"); set on the command line so a machine's own apt.conf cannot make it hang for hours
DEFAULT_APT_FETCH_TIMEOUT = 60
# seconds the whole apt-get install may take past its lock wait: the driver's ~400 packages,
# unpacking them, and DKMS compiling the module on a slow laptop fit in it many times over
DEFAULT_APT_DEADLINE = 3600
# seconds pip/uv may take over a whole torch install (install --download-timeout): a CUDA torch
# and its libraries are about 3 GB, an hour at 7 Mbit/s
DEFAULT_DOWNLOAD_TIMEOUT = 3600


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
    fetch_timeout: int = DEFAULT_APT_FETCH_TIMEOUT
    deadline: int = DEFAULT_APT_DEADLINE
    # every dpkg run apt starts gets --no-triggers (dpkg(1)): the packages' triggers (the
    # initramfs above all) run once, in the plan's trigger step after the files that feed them
    # (plan/triggers.py), not again and again in the middle of apt's `--configure --pending`
    defer_triggers: bool = False

    def argv(self, reinstall: tuple[str, ...] = ()) -> list[str]:
        """The apt-get command; with `reinstall`, the packages dpkg left half-installed, named
        after `--reinstall` with the step's own (the executor reads dpkg's status as the step
        starts)."""
        argv = [
            "apt-get",
            "-y",
            *bundle_apt_options(self.sources_list),
            "-o",
            f"DPkg::Lock::Timeout={self.lock_timeout}",
            "-o",
            f"Acquire::http::Timeout={self.fetch_timeout}",
            "-o",
            f"Acquire::https::Timeout={self.fetch_timeout}",
            # a user-modified conffile is kept, never prompts (dpkg(1), --force-conf*)
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
        ]
        if self.defer_triggers:
            argv += ["-o", "Dpkg::Options::=--no-triggers"]
        argv.append("install")
        if reinstall:
            argv.append("--reinstall")
        if self.no_install_recommends:
            argv.append("--no-install-recommends")
        return [*argv, *self.packages, *(p for p in reinstall if p not in self.packages)]

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
    # the venv is there but half-made by a failed run (plan/venv.py): made again in place
    rebuild_venv: bool = False
    requirements_sha256: str | None = None  # the executor installs only from these bytes
    download_timeout: int = DEFAULT_DOWNLOAD_TIMEOUT  # the install's deadline (execute/pip.py)
    # NAME==VERSION of each installed distribution whose files fail its RECORD (a venv not
    # egpu-setup's own, so not rebuilt): reinstalled first, --force-reinstall --no-deps
    repair: tuple[str, ...] = ()

    @property
    def temp_dir(self) -> str:
        """The installer's TMPDIR (0700, its own): inside the venv, so what pip downloads and
        unpacks lands on the venv's filesystem, the one preflight counted, and a small /tmp
        (a tmpfs) cannot fail a multi-GB CUDA install; removed after the step."""
        return f"{self.venv.rstrip('/')}/.egpu-setup-tmp"

    def describe(self) -> str:
        create = f"create venv {self.venv}; " if self.create_venv else ""
        if self.rebuild_venv:
            create = f"rebuild the half-made venv {self.venv}; "
        if self.repair:
            create += f"reinstall the damaged {' '.join(self.repair)}; "
        who = f" as {self.run_as}" if self.run_as else ""
        source = (
            f" offline from {self.find_links} (hashes from {self.requirements_file})"
            if self.find_links
            else f" --index-url {self.index_url}"
        )
        return f"{create}install {' '.join(self.requirements)} into {self.venv}{source}{who}"


@dataclass(frozen=True)
class InstallTool(Step):
    """egpu-setup itself into a root-owned venv on the target, the one its units and helpers run.

    Made by the target's own Python (`python`, a path on the target), filled offline from the
    wheels egpu-setup keeps of itself or a pinned bundle's tool/ (install/tool_wheels.py): the
    files `wheels` names in `wheels_from`, each copied and checked against its sha256 before pip
    sees it."""

    kind: ClassVar[str] = "install-tool"
    part: ClassVar[str] = "config"
    venv: str
    version: str
    python: str
    create_venv: bool
    wheels_from: str
    wheels: tuple[tuple[str, str], ...]  # (file name, sha256)
    reason: str = ""

    def describe(self) -> str:
        create = f"create venv {self.venv} with {self.python}; " if self.create_venv else ""
        why = f" ({self.reason})" if self.reason else ""
        return (
            f"{create}install egpu-setup {self.version} into {self.venv} from the "
            f"{len(self.wheels)} wheels in {self.wheels_from}, pinned by sha256{why}"
        )


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
class CopyFile(Step):
    """A file copied from this machine into the target (`install --root --mok-key`: a private
    key), its bytes never in the plan, the dry run or a report: only where it comes from and its
    sha256, which the executor checks before it writes (a file swapped after planning)."""

    kind: ClassVar[str] = "copy-file"
    part: ClassVar[str] = "driver"
    path: str
    source: str
    sha256: str
    mode: int
    purpose: str
    action: str  # create / replace

    def describe(self) -> str:
        return (
            f"{self.action} {self.path} (mode {self.mode:04o}) from {self.source}: {self.purpose}"
        )


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
class HoldDriver(Step):
    """The driver held for the term (profile `driver.hold`): after the driver's apt step, the
    pin file and the unattended-upgrades drop-in written from dpkg's status then (render/hold.py),
    each a managed file that rollback removes."""

    kind: ClassVar[str] = "hold-driver"
    part: ClassVar[str] = "driver"
    named: tuple[str, ...]  # the resolution's driver packages: their sources are what is held
    profile: str
    mode: str
    held: tuple[tuple[str, str], ...] = ()  # (name, version) installed now; () before the apt step
    release: bool = False  # both files emptied, so apt may move the driver: before an apt step,
    for_good: bool = False  # or because the driver is no longer to be held

    def describe(self) -> str:
        from egpu_setup.detect.dpkg_status import HOLD_PIN, HOLD_UNATTENDED

        if self.release:
            why = (
                "the profile holds the driver no more (driver.hold, --hold-driver)"
                if self.for_good
                else "for the apt step; it is held again after it"
            )
            return f"release the driver hold ({HOLD_PIN}, {HOLD_UNATTENDED}): {why}"
        if self.held:
            versions = sorted({v for _, v in self.held})
            what = f"{len(self.held)} packages at {', '.join(versions)}"
        else:
            what = "its packages at the versions this run installs"
        return (
            f"hold the NVIDIA driver for the term: {what} (apt pin {HOLD_PIN}, "
            f"unattended-upgrades blacklist {HOLD_UNATTENDED})"
        )


@dataclass(frozen=True)
class RebootNeeded(Step):
    kind: ClassVar[str] = "reboot-needed"
    part: ClassVar[str] = "driver"
    reason: str

    def describe(self) -> str:
        return f"reboot needed: {self.reason}"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not self.steps

    @property
    def conflicts(self) -> tuple[WriteFile | EnableUnit | CreateLink, ...]:
        """Steps that would replace somebody else's file (each has a `path`)."""
        return tuple(
            s
            for s in self.steps
            if isinstance(s, WriteFile | EnableUnit | CreateLink) and s.conflict
        )

    @property
    def consent_steps(self) -> tuple[RunCommand, ...]:
        """Steps that change the boot configuration: `--yes` alone must not run them."""
        return tuple(s for s in self.steps if isinstance(s, RunCommand) and s.consent)

    @property
    def needs_root(self) -> bool:
        return any(not isinstance(s, PipInstall) for s in self.steps)

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.steps]
