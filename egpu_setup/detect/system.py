"""OS, kernel, WSL, Secure Boot, session type and the target Python's PEP 668 state."""

from __future__ import annotations

import re

from egpu_setup.detect.facts import OsFacts, PythonFacts
from egpu_setup.host.machine import Host

# EFI global variable GUID (UEFI specification, "Globally Defined Variables"); efivarfs gives 4
# attribute bytes, then the value byte (Linux Documentation/filesystems/efivarfs.rst).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def parse_secure_boot_var(data: bytes | None) -> bool | None:
    if data is None or len(data) != 5:
        return None
    return {0: False, 1: True}.get(data[4])


def parse_mokutil_state(text: str | None) -> bool | None:
    """`mokutil --sb-state`: "SecureBoot enabled" / "SecureBoot disabled" / not EFI."""
    if not text:
        return None
    m = re.search(r"SecureBoot\s+(enabled|disabled)", text, re.IGNORECASE)
    return m.group(1).lower() == "enabled" if m else None


def probe_secure_boot(host: Host) -> bool | None:
    state = parse_secure_boot_var(host.read_bytes(SECURE_BOOT_VAR, 64))
    if state is not None:
        return state
    state = parse_mokutil_state(host.command("mokutil", ["mokutil", "--sb-state"]))
    if state is not None:
        return state
    if host.is_dir("/sys/firmware") and not host.is_dir("/sys/firmware/efi"):
        return False  # booted through legacy BIOS: Secure Boot cannot be on
    return None


def is_wsl(release: str | None, proc_version: str | None) -> bool | None:
    text = " ".join(t for t in (release, proc_version) if t)
    if not text:
        return None
    return bool(re.search(r"microsoft|WSL", text, re.IGNORECASE))


def parse_session_type(text: str | None) -> str | None:
    """`loginctl show-session ID -p Type` ("Type=wayland") or `--value` output ("x11")."""
    if not text:
        return None
    for line in text.splitlines():
        value = line.split("=", 1)[1] if line.startswith("Type=") else line
        value = value.strip()
        if value in ("x11", "wayland", "mir", "tty", "unspecified"):
            return value
    return None


def probe_session_type(host: Host) -> str | None:
    # Under sudo the environment is root's; the user's own session says what the display runs.
    if not host.getenv("SUDO_USER"):
        env = host.getenv("XDG_SESSION_TYPE")
        if env:
            return env
    if host.kind == "recorded":
        return parse_session_type(host.command("loginctl", ["loginctl"]))
    user = host.getenv("SUDO_USER") or host.getenv("USER")
    if not user or host.which("loginctl") is None:
        return None
    session = host.command(
        "loginctl", ["loginctl", "show-user", user, "--property=Display", "--value"]
    )
    session = (session or "").strip()
    if not session:
        return None
    return parse_session_type(
        host.command("loginctl", ["loginctl", "show-session", session, "--property=Type"])
    )


def probe_os(host: Host) -> OsFacts:
    from egpu_setup.detect.osrelease import parse_os_release

    text = host.read("/etc/os-release") or host.read("/usr/lib/os-release")
    rel = parse_os_release(text) if text else {}
    if rel.get("UBUNTU_CODENAME") and not rel.get("VERSION_CODENAME"):
        rel["VERSION_CODENAME"] = rel["UBUNTU_CODENAME"]  # Ubuntu 16.04 writes only this one
    if not all(rel.get(k) for k in ("ID", "VERSION_ID", "VERSION_CODENAME", "PRETTY_NAME")):
        rel = _release_files(host, rel)
    release, machine = host.uname()
    release = release or host.read_attr("/proc/sys/kernel/osrelease")
    return OsFacts(
        id=rel.get("ID") or None,
        version_id=rel.get("VERSION_ID") or None,
        kernel=release,
        arch=machine,
        wsl=is_wsl(release, host.read("/proc/version")),
        secure_boot=probe_secure_boot(host),
        session_type=probe_session_type(host),
        id_like=tuple(rel.get("ID_LIKE", "").split()),
        codename=rel.get("VERSION_CODENAME") or None,
        pretty_name=rel.get("PRETTY_NAME") or None,
    )


def _release_files(host: Host, rel: dict[str, str]) -> dict[str, str]:
    """What os-release leaves out (Debian testing's version, Gentoo's, a system with no
    os-release at all), from the distribution's other release files as the `distro` package
    reads them (detect/release_files.py), then /etc/lsb-release; os-release wins for what it
    says, all read through the Host."""
    from egpu_setup.detect.release_files import KEYS, distro_release, parse_lsb_release

    found = distro_release(host, rel)
    lsb: dict[str, str] | None = None
    merged = dict(rel)
    for key in KEYS:
        if merged.get(key):
            continue
        if found.get(key):
            merged[key] = found[key]
            continue
        if lsb is None:
            lsb = parse_lsb_release(host.read("/etc/lsb-release", 64 * 1024) or "")
        if lsb.get(key):
            merged[key] = lsb[key]
    return merged


_PYTHON = re.compile(r"python(3\.\d+)$")


def probe_python(host: Host, executable: str = "/usr/bin/python3") -> PythonFacts:
    """The distro Python a venv would be built from, and its PEP 668 marker."""
    real = host.resolve(executable)
    if not real or not host.exists(executable):
        return PythonFacts(executable=None)
    m = _PYTHON.search(real)
    version = m.group(1) if m else None
    managed = None
    if version:
        marker_dirs = (f"/usr/lib/python{version}", f"/usr/lib64/python{version}")
        managed = any(host.exists(f"{d}/EXTERNALLY-MANAGED") for d in marker_dirs)
    return PythonFacts(version=version, externally_managed=managed, executable=executable)
