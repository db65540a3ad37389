"""A lab's own module signing key for Secure Boot: made once, put into every image it builds.

Where the driver is built by DKMS inside an image (Debian's nvidia-kernel-dkms), every copy
carries the module DKMS signed at build time; the firmware of each laptop loads it only once it
trusts the signing certificate (shim's MOK list). Without a key of its own, DKMS makes one per
image build (/var/lib/dkms/mok.key, dkms.in prepare_mok), so a new image means a new enrolment
on every laptop. With `--mok-key DIR` the lab's key signs every image's module instead:

- `egpu-setup mok-key new DIR` makes it: an RSA key (`openssl genpkey`, 0600), its self-signed
  certificate in DER (what `mokutil --import` takes), and the SHA-512 crypt hash of a one-time
  password the admin chooses (`openssl passwd -6 -stdin`: the password goes on stdin, never into
  an argv or a file). Or the admin brings their own three files under those names.
- `install --root IMAGE --mok-key DIR` copies them into the image, before the driver's packages,
  to /etc/egpu-setup/mok/ (the key and the hash 0600 root, the certificate 0644), and points
  DKMS at them with /etc/dkms/framework.conf.d/egpu-setup-mok.conf (dkms reads
  /etc/dkms/framework.conf and framework.conf.d/*.conf; `mok_signing_key`, `mok_certificate`:
  the dkms README, "Module signing").
- the image's first boot (install/firstboot.py) queues the enrolment: `mokutil --import CERT
  --hash-file HASH`, non-interactive since the password's hash is given (mokutil(1),
  --hash-file); the only step left at the laptop is MokManager's confirmation at the next boot.

The private key stays in the image, 0600 root: a later kernel's module is rebuilt by DKMS on
each laptop (the kernel's postinst, the kernels hook) and must be signed by the same, enrolled
key, or it would not load. The trade-off: root on any one laptop can read the key and sign a
module every laptop of the lab then loads; the key is one lab's, never shared wider. A lab that
cannot accept that turns Secure Boot off or uses a distribution that ships signed modules.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from egpu_setup.errors import EgpuSetupError, UsageError
from egpu_setup.host.machine import Host, LiveHost
from egpu_setup.plan.steps import AptInstall, CopyFile, Plan, Step, WriteFile
from egpu_setup.state.atomic import atomic_write, make_dirs, sha256

KEY_NAME = "mok.key"
CERT_NAME = "mok.der"
HASH_NAME = "mok.hash"
IMAGE_DIR = "/etc/egpu-setup/mok"
IMAGE_KEY = f"{IMAGE_DIR}/{KEY_NAME}"
IMAGE_CERT = f"{IMAGE_DIR}/{CERT_NAME}"
IMAGE_HASH = f"{IMAGE_DIR}/{HASH_NAME}"
DKMS_CONF = "/etc/dkms/framework.conf.d/egpu-setup-mok.conf"
MOKUTIL = "/usr/bin/mokutil"  # Debian's and Ubuntu's package `mokutil`, in main
DEFAULT_NAME = "egpu-setup lab module signing key"
# DKMS makes its own key valid for 36500 days (dkms.in prepare_mok); shim does not check the
# validity of a MOK when it verifies, and neither does the kernel for a module signature
DAYS = 36500
OPENSSL_TIMEOUT_S = 120  # an RSA key on a slow laptop takes a second or two
# mokutil's limits for the password (src/mokutil.c PASSWORD_MIN, PASSWORD_MAX); printable ASCII
# only, since it is typed at MokManager's firmware console, which has no input method
PASSWORD_MAX = 256
_PASSWORD = re.compile(rf"[\x20-\x7e]{{1,{PASSWORD_MAX}}}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()-]{0,63}")
# SHA-512 crypt, what `mokutil --generate-hash` prints and `openssl passwd -6` too:
# $6$[rounds=N$]salt$hash, salt up to 16 characters, hash 86 (https://www.akkadia.org/drepper/
# SHA-crypt.txt)
_HASH = re.compile(r"\$6\$(?:rounds=\d{4,9}\$)?[./0-9A-Za-z]{1,16}\$[./0-9A-Za-z]{86}")
_PEM = re.compile(r"-----BEGIN (CERTIFICATE|PRIVATE KEY)-----\n(.*?)-----END \1-----", re.S)


@dataclass(frozen=True)
class LabKey:
    """The lab's three files, checked (a pair, a hash, a private key closed to others), with
    the sha256 of each as planned: the executor copies nothing that changed since."""

    directory: str
    key_sha256: str
    cert_sha256: str
    hash_sha256: str

    def source(self, name: str) -> str:
        return os.path.join(self.directory, name)


# -- pure parsers ----------------------------------------------------------------------------------


def parse_hash(text: str | None) -> str | None:
    """The SHA-512 crypt hash on the file's one line, or None."""
    line = (text or "").strip()
    return line if _HASH.fullmatch(line) else None


def parse_pem(text: str | None, label: str) -> bytes | None:
    """The DER bytes of the first PEM block `label` ("CERTIFICATE", "PRIVATE KEY") in openssl's
    output (RFC 7468), or None."""
    for m in _PEM.finditer(text or ""):
        if m.group(1) == label:
            try:
                return base64.b64decode("".join(m.group(2).split()), validate=True)
            except binascii.Error:
                return None
    return None


def check_password(password: str) -> str:
    """The one-time password MokManager asks for, or UsageError."""
    if not _PASSWORD.fullmatch(password):
        raise UsageError(
            f"the one-time password must be 1 to {PASSWORD_MAX} printable ASCII characters",
            "MokManager reads it at the firmware console: letters, digits, punctuation, spaces",
        )
    return password


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"--name {name!r}: 1 to 64 letters, digits, spaces and . _ ( ) -",
            f"e.g. --name 'Physics lab module signing key' (the default: {DEFAULT_NAME})",
        )
    return name


# -- making one ------------------------------------------------------------------------------------


def _openssl(host: Host, argv: list[str], what: str, input: bytes | None = None) -> str:
    try:
        res = host.run(["openssl", *argv], timeout=OPENSSL_TIMEOUT_S, input=input)
    except EgpuSetupError as exc:
        raise EgpuSetupError(
            f"openssl could not {what}: {exc.message}",
            "install openssl (Debian/Ubuntu: apt-get install openssl) and run again",
        ) from exc
    if res.rc != 0:
        tail = (res.err or res.out).strip().splitlines()[-1:] or [f"exit {res.rc}"]
        raise EgpuSetupError(f"openssl could not {what}: {tail[0]}", "see the message above")
    return res.out


def new_lab_key(directory: str, password: str, name: str = DEFAULT_NAME) -> LabKey:
    """Make the lab's key, certificate and password hash in `directory` (new or empty, made
    0700); every file is written by descriptor (state/atomic.py), openssl only prints."""
    check_password(password)
    check_name(name)
    where = Path(os.path.abspath(directory))
    if where.exists() and (not where.is_dir() or any(where.iterdir())):
        raise UsageError(
            f"{where} exists and is not an empty directory: a lab key is never overwritten",
            "pass a new directory (the lab's key must stay the one its laptops enrolled)",
        )
    host = LiveHost()
    key = _openssl(
        host, ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], "make a key"
    )
    if parse_pem(key, "PRIVATE KEY") is None:
        raise EgpuSetupError("openssl genpkey printed no private key", "run it by hand to see why")
    make_dirs(where, mode=0o700)
    atomic_write(where / KEY_NAME, key.encode(), 0o600)
    cert_argv = ["req", "-new", "-x509", "-key", str(where / KEY_NAME), "-sha256"]
    pem = _openssl(
        host, [*cert_argv, "-days", str(DAYS), "-subj", f"/CN={name}/"], "make the certificate"
    )
    der = parse_pem(pem, "CERTIFICATE")
    if der is None:
        raise EgpuSetupError("openssl req printed no certificate", "run it by hand to see why")
    atomic_write(where / CERT_NAME, der, 0o644)
    hashed = parse_hash(
        _openssl(host, ["passwd", "-6", "-stdin"], "hash the password", (password + "\n").encode())
    )
    if hashed is None:
        raise EgpuSetupError("openssl passwd -6 printed no SHA-512 hash", "openssl >= 1.1.1 has it")
    atomic_write(where / HASH_NAME, (hashed + "\n").encode(), 0o600)
    return load_lab_key(str(where))


# -- reading the lab's, for an image -----------------------------------------------------------


def _read(path: str) -> bytes:
    data = LiveHost().read_bytes(path, 1 << 20)
    if data is None:
        raise UsageError(
            f"--mok-key: {path} is missing or not a regular file",
            "make the lab's key with `egpu-setup mok-key new DIR`, or put mok.key (PEM), "
            "mok.der (its certificate, DER) and mok.hash (`mokutil --generate-hash`) there",
        )
    return data


def load_lab_key(directory: str) -> LabKey:
    """The lab's key in `directory`, checked; UsageError (exit 2) for anything wrong."""
    where = os.path.abspath(directory)
    key_path, cert_path, hash_path = (
        os.path.join(where, n) for n in (KEY_NAME, CERT_NAME, HASH_NAME)
    )
    key, cert, hashed = _read(key_path), _read(cert_path), _read(hash_path)
    for secret in (key_path, hash_path):
        if stat.S_IMODE(os.lstat(secret).st_mode) & 0o077:
            raise UsageError(
                f"--mok-key: {secret} is readable by others than its owner",
                f"chmod 600 {secret} (and keep the directory the lab's admin's alone)",
            )
    if parse_hash(hashed.decode("ascii", errors="replace")) is None:
        raise UsageError(
            f"--mok-key: {hash_path} holds no SHA-512 password hash",
            "write it with `mokutil --generate-hash > mok.hash`, or make the key with "
            "`egpu-setup mok-key new DIR`",
        )
    host = LiveHost()
    cert_argv = ["x509", "-inform", "DER", "-in", cert_path, "-noout", "-pubkey"]
    cert_pub = _openssl(host, cert_argv, "read the certificate")
    key_pub = _openssl(host, ["pkey", "-in", key_path, "-pubout"], "read the key")
    if cert_pub.strip() != key_pub.strip():
        raise UsageError(
            f"--mok-key: {cert_path} is not the certificate of {key_path}",
            "use the pair as made together (`egpu-setup mok-key new DIR` makes one)",
        )
    return LabKey(where, sha256(key), sha256(cert), sha256(hashed))


# -- planning it into an image ---------------------------------------------------------------------

_DKMS_CONF = f"""\
# egpu-setup: DKMS signs the modules it builds with the lab's key (`install --mok-key`), the
# one each laptop enrols once at MokManager; the first-boot unit queues that enrolment.
mok_signing_key="{IMAGE_KEY}"
mok_certificate="{IMAGE_CERT}"
"""


def lab_key_steps(target: Host, lab: LabKey, lock_timeout: int) -> list[Step]:
    """The copies of the lab's files and DKMS's drop-in, each only where the image differs, and
    mokutil, which first boot queues the enrolment with."""
    from egpu_setup.plan.config import unified_diff

    steps: list[Step] = []
    if not target.exists(MOKUTIL):
        steps.append(
            AptInstall(
                ("mokutil",),
                no_install_recommends=True,
                lock_timeout=lock_timeout,
                reason="first boot queues the lab's key for MokManager with it",
            )
        )
    for name, digest, mode, what in (
        (KEY_NAME, lab.key_sha256, 0o600, "the lab's module signing key (DKMS signs with it)"),
        (CERT_NAME, lab.cert_sha256, 0o644, "its certificate, which first boot queues for MOK"),
        (HASH_NAME, lab.hash_sha256, 0o600, "the hash of the one-time MokManager password"),
    ):
        path = f"{IMAGE_DIR}/{name}"
        have = target.read_bytes(path, 1 << 20)
        if have is not None and sha256(have) == digest:
            continue
        action = "create" if have is None else "replace"
        steps.append(CopyFile(path, lab.source(name), digest, mode, what, action))
    current = target.read(DKMS_CONF)
    if current != _DKMS_CONF:
        steps.append(
            WriteFile(
                path=DKMS_CONF,
                content=_DKMS_CONF,
                mode=0o644,
                purpose="DKMS signs with the lab's key",
                action="create" if current is None else "replace",
                diff=unified_diff(DKMS_CONF, current, _DKMS_CONF),
                for_part="driver",
            )
        )
    return steps


def with_lab_key(
    plan: Plan, target: Host, only: frozenset[str], directory: str | None, lock_timeout: int
) -> Plan:
    """The plan with the lab's key first: before the driver's packages, whose DKMS build signs
    the module with it."""
    if not directory or "driver" not in only:
        return plan
    steps = lab_key_steps(target, load_lab_key(directory), lock_timeout)
    return Plan((*steps, *plan.steps), plan.warnings, plan.notes)
