"""The driver planner: the apt source the driver comes from, then its packages (and headers)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import EgpuSetupError
from egpu_setup.host.machine import Host
from egpu_setup.plan.apt_sources import KEYRINGS_DIR, SOURCES_DIR, AptSource, apt_sources
from egpu_setup.plan.installed import installed_packages
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import AptInstall, AptRepository, Step
from egpu_setup.resolve.resolution import DriverPlan, NvidiaRepo, Resolution


def driver_steps(
    facts: HostFacts, resolution: Resolution, host: Host, options: PlanOptions, warnings: list[str]
) -> list[Step]:
    driver = resolution.driver
    # "in-kernel" (amdgpu): no driver, but the firmware package it loads
    if driver.action not in ("install", "upgrade", "in-kernel"):
        return []
    steps: list[Step] = []
    os_id = (facts.os.id or "").lower()
    codename = facts.os.codename
    if options.bundle is not None:
        return _bundle_driver_steps(driver, host, options)
    if driver.source == "nvidia-repo" and driver.repo is not None:
        steps.append(_nvidia_repo_step(driver.repo))
    elif driver.apt_components:
        what = "the AMD GPU firmware" if driver.action == "in-kernel" else "the NVIDIA driver"
        step = _components_step(host, tuple(driver.apt_components), codename, os_id, warnings, what)
        if step is not None:
            steps.append(step)
    installed = installed_packages(host)
    wanted = list(driver.packages)
    pin = driver.repo.pin if driver.source == "nvidia-repo" and driver.repo else None
    if pin and pin not in wanted:
        # NVIDIA's branch-pinning package (branches >= 590) keeps apt on the resolved branch
        wanted.insert(0, pin)
    kernel = facts.os.kernel
    if os_id == "debian" and any("nvidia" in p for p in wanted):
        wanted += _debian_headers(facts, host, options, wanted, kernel, warnings)
    missing = tuple(p for p in wanted if p not in installed)
    if missing or driver.action == "upgrade":
        steps.append(
            AptInstall(
                missing or tuple(wanted),
                # Recommends stay on: trixie's dkms only Recommends gcc, and the driver's
                # Recommends carry nvidia-persistenced (docs/sources.md, "Measured here")
                no_install_recommends=False,
                lock_timeout=options.apt_lock_timeout,
                reason=f"NVIDIA driver branch {driver.branch}"
                if driver.branch
                else "NVIDIA driver"
                if driver.action != "in-kernel"
                else "AMD GPU firmware (amdgpu itself is part of the kernel)",
            )
        )
    return steps


# A Debian/Ubuntu kernel release as its linux-headers-<release> package is named:
# "6.1.0-37-amd64", "6.12.57+deb13-amd64", "6.12.38+deb13-rt-amd64", "6.8.0-45-generic".
# Lowercase package-name characters only (Debian Policy, section 5.6.1), so it is safe in an argv.
_KERNEL_RELEASE = re.compile(r"^[0-9]+\.[0-9]+(?:\.[0-9]+)?(?:[-+~.][a-z0-9]+)*-[a-z0-9]+$")


def _debian_headers(
    facts: HostFacts,
    host: Host,
    options: PlanOptions,
    wanted: Sequence[str],
    kernel: str | None,
    warnings: list[str],
) -> list[str]:
    """Headers DKMS needs to build the module: the meta package, and on a live system the
    running kernel's own headers too.

    Debian 13's dkms no longer Recommends any headers (docs/sources.md, "Measured here"), and
    the meta package (which the resolver names) only follows the *newest* kernel: a machine
    running an older ABI would get no module for the kernel it boots until it boots the new
    one. An image (--root) has no running kernel: there, the headers of every kernel it can
    boot (/boot/vmlinuz-* with its /lib/modules), so DKMS builds the module for each."""
    arch = "amd64" if (facts.os.arch or "x86_64") in ("x86_64", "amd64") else facts.os.arch
    extra: list[str] = []
    if not any(p.startswith("linux-headers-") for p in wanted):
        extra.append(f"linux-headers-{arch}")
    if options.target == "root":
        from egpu_setup.host.image_root import boot_kernels

        for release in boot_kernels(host):
            extra += _kernel_headers(host, release, wanted, warnings, image=True)
        return extra
    if not kernel:
        return extra
    return extra + _kernel_headers(host, kernel, wanted, warnings, image=False)


def _kernel_headers(
    host: Host, kernel: str, wanted: Sequence[str], warnings: list[str], *, image: bool
) -> list[str]:
    """linux-headers-<kernel> when apt can install it (or may: it cannot be asked), else a
    warning that DKMS builds for the other kernels only."""
    which = f"image kernel {kernel}" if image else f"running kernel {kernel!r}"
    if not _KERNEL_RELEASE.match(kernel):
        warnings.append(
            f"{which} is not a Debian kernel package name: its headers are "
            "not installed; DKMS builds the module for the archive kernel only"
        )
        return []
    name = f"linux-headers-{kernel}"
    if name in wanted or name in installed_packages(host):
        return []
    known = _apt_candidate(host, name)
    if known is False:
        warnings.append(
            f"{name} is not in the apt cache (the archive has moved on to a newer kernel): the "
            "module is built for the newest kernel only; boot it before using the eGPU"
        )
        return []
    return [name]  # True, or None (cannot ask apt here): apt says clearly if it is gone


def _apt_candidate(host: Host, package: str) -> bool | None:
    """Does apt have an installation candidate for `package`? None when apt cannot be asked."""
    if host.kind not in ("live", "root"):
        return None
    try:
        res = host.run(["apt-cache", "policy", package], timeout=60, env={"LC_ALL": "C.UTF-8"})
    except (EgpuSetupError, OSError):  # no apt-cache there: plan it and let apt say
        return None
    if res.rc != 0:
        return None
    m = re.search(r"^\s*Candidate:\s*(\S+)", res.out, re.M)
    return m is not None and m.group(1) != "(none)"


def bundle_sources_content(stage_to: str) -> str:
    return (
        "# Written by egpu-setup: the offline bundle's packages, copied to this machine.\n"
        "# Trusted: yes is safe only because this is a local directory that egpu-setup filled\n"
        "# after checking every .deb and the Packages index against the sha256 in the bundle's\n"
        "# manifest; a flat local repository has no signed Release file for apt to check.\n"
        "# Never copy this line to a remote source. Remove with `egpu-setup rollback`.\n"
        f"Types: deb\nURIs: file:{stage_to}\nSuites: ./\nTrusted: yes\n"
    )


def _bundle_driver_steps(driver: DriverPlan, host: Host, options: PlanOptions) -> list[Step]:
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
                stage_sha256=b.repository_sha256,
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
    host: Host,
    components: tuple[str, ...],
    codename: str | None,
    os_id: str,
    warnings: list[str],
    what: str,
) -> Step | None:
    """A drop-in that enables `components` on the distro archive's suites the host uses for `main`.

    Only the distribution's own archive is mirrored, never a PPA or third-party repository that
    happens to have a `main` component: our stanza would repeat its URI and suite without its key
    (apt: "Conflicting values set for option Signed-By", or NO_PUBKEY), and that archive has no
    contrib/non-free anyway. Signed-By is copied only when it names a keyring file."""
    sources = [s for s in apt_sources(host) if "deb" in s.types]
    ours = f"{SOURCES_DIR}/egpu-setup-{os_id or 'distro'}-components.sources"
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
        f"# Written by egpu-setup: the archive components {what} lives in.\n"
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


def _is_distro_archive(host: Host, src: AptSource, os_id: str) -> bool:
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


def _release_origin(host: Host, src: AptSource) -> str | None:
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


def _nvidia_repo_step(repo: NvidiaRepo) -> AptRepository:
    name = "nvidia-cuda"
    keyring = f"{KEYRINGS_DIR}/egpu-setup-{name}.gpg"
    content = (
        "# Written by egpu-setup: NVIDIA's CUDA repository, trusted only through its own key.\n"
        f"Types: deb\nURIs: {repo.url}\nSuites: /\nSigned-By: {keyring}\n"
    )
    return AptRepository(
        name=name,
        sources_path=f"{SOURCES_DIR}/egpu-setup-{name}.sources",
        content=content,
        summary="NVIDIA CUDA repository",
        keyring_path=keyring,
        keyring_url=repo.keyring_url,
        fingerprint=repo.fingerprint,
    )
