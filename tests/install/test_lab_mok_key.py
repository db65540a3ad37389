"""A lab's Secure Boot key: `mok-key new` makes it with the real openssl, `install --root
--mok-key` plans and copies it into an image (never its bytes into a plan, a dry run or a
report), DKMS's drop-in names it, rollback takes it back, and first boot queues the enrolment.

mokutil cannot answer here (no EFI variables: the real one, from Debian's archive, prints "EFI
variables are not supported on this system" for every request, --generate-hash included), so
inside a real Debian root a stand-in prints mokutil's own --test-key lines (src/mokutil.c
test_key, 9ae73db) and records the argv and the files an import would read."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli
from egpu_setup.host.machine import Host, RootHost
from egpu_setup.install import mok_key
from egpu_setup.install.attention import LAB_CERT, LAB_HASH, mok_status, queue_lab_key
from egpu_setup.plan.steps import Plan
from helpers.debroot import DebrootUnavailable, copy_root

PASSWORD = "Lab one-time 2026!"


def _new(where: Path, stdin: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`egpu-setup mok-key new WHERE --password-stdin`, the password on stdin as a script gives it."""
    return subprocess.run(
        [sys.executable, "-m", "egpu_setup", "mok-key", "new", str(where), "--password-stdin",
         *argv],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("lab") / "mok"
    res = _new(where, PASSWORD + "\n", "--name", "Physics lab")
    assert res.returncode == 0, res.stderr
    return where


def _openssl(*argv: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["openssl", *argv], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def test_a_new_key_is_a_pair_closed_to_others_with_only_the_hash_of_the_password(
    lab: Path,
) -> None:
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in lab.iterdir()}
    assert modes == {"mok.key": 0o600, "mok.der": 0o644, "mok.hash": 0o600}, modes
    assert stat.S_IMODE(lab.stat().st_mode) == 0o700
    cert = str(lab / "mok.der")
    assert "CN = Physics lab" in _openssl("x509", "-inform", "DER", "-in", cert, "-noout",
                                          "-subject")  # fmt: skip
    assert _openssl("x509", "-inform", "DER", "-in", cert, "-noout", "-pubkey") == _openssl(
        "pkey", "-in", str(lab / "mok.key"), "-pubout"
    )
    # the hash is SHA-512 crypt of that password: openssl, given the same salt, agrees
    hashed = (lab / "mok.hash").read_text().strip()
    salt = hashed.split("$")[2]
    assert (
        _openssl("passwd", "-6", "-salt", salt, "-stdin", stdin=PASSWORD + "\n").strip() == hashed
    )
    assert not any(PASSWORD.encode() in p.read_bytes() for p in lab.iterdir())


@pytest.mark.parametrize(
    ("argv", "stdin", "said"),
    [
        ((), "", "1 to 256 printable ASCII"),
        ((), "mot de passe é\n", "1 to 256 printable ASCII"),
        ((), "x" * 257 + "\n", "1 to 256 printable ASCII"),
        (("--name", "a/CN=evil"), "pw\n", "--name"),
    ],
)
def test_a_bad_password_or_name_makes_nothing(
    tmp_path: Path, argv: Sequence[str], stdin: str, said: str
) -> None:
    where = tmp_path / "mok"
    res = _new(where, stdin, *argv)
    assert res.returncode == 2, res.stderr
    assert said in res.stderr and "\nhint: " in res.stderr and "Traceback" not in res.stderr
    assert not where.exists()


def test_a_lab_key_is_never_overwritten(lab: Path) -> None:
    before = {p.name: p.read_bytes() for p in lab.iterdir()}
    res = _new(lab, "other\n")
    assert res.returncode == 2 and "never overwritten" in res.stderr, res.stderr
    assert {p.name: p.read_bytes() for p in lab.iterdir()} == before


# -- the image's plan ------------------------------------------------------------------------


def _image(tmp_path: Path) -> Path:
    root = tmp_path / "image"
    shutil.copytree(FIXTURES / "fresh-debian12-no-venv" / "root", root, symlinks=True)
    return root


def test_the_dry_run_copies_the_key_first_and_never_shows_its_bytes(
    tmp_path: Path, lab: Path
) -> None:
    root = _image(tmp_path)
    res = run_cli("install", "--dry-run", "--json", "--profile", "rtx4090", "--root", str(root),
                  "--mok-key", str(lab))  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    kinds = [(s["kind"], s.get("path")) for s in data["steps"]]
    assert kinds[:5] == [
        ("apt-install", None),  # mokutil, which first boot queues the key with
        ("copy-file", "/etc/egpu-setup/mok/mok.key"),
        ("copy-file", LAB_CERT),
        ("copy-file", LAB_HASH),
        ("write-file", mok_key.DKMS_CONF),
    ], kinds
    assert data["steps"][0]["packages"] == ["mokutil"]
    assert data["steps"][1]["mode"] == 0o600 and data["steps"][1]["source"] == str(lab / "mok.key")
    driver = next(
        i for i, s in enumerate(data["steps"]) if "nvidia-kernel-dkms" in s["description"]
    )
    assert driver > 4  # DKMS builds (and signs) the module after the key is in place
    body = "".join((lab / "mok.key").read_text().splitlines()[1:-1])
    hashed = (lab / "mok.hash").read_text().strip()
    assert body[:40] not in res.stdout and hashed not in res.stdout
    mok = next(a for a in data["actions"] if a["id"] == "mok-enrolment")
    assert mok["when"] == "each-laptop" and "the lab's key" in mok["summary"], mok
    assert f"--hash-file {LAB_HASH}" in mok["summary"]
    assert not any("mokutil --import" in s for s in mok["steps"])  # first boot does it


def _copy_lab(tmp_path: Path, lab: Path) -> Path:
    other = tmp_path / "lab-copy"
    shutil.copytree(lab, other)
    return other


def test_bad_key_directories_are_refused_before_anything(tmp_path: Path, lab: Path) -> None:
    root = _image(tmp_path)
    before = sorted(str(p) for p in root.rglob("*"))

    def refused(directory: Path, said: str, *extra: str) -> None:
        argv = ["install", "--dry-run", "--profile", "rtx4090", "--mok-key", str(directory)]
        res = run_cli(*argv, *(extra or ("--root", str(root))))
        assert res.returncode == 2, res.stderr
        assert said in res.stderr and "\nhint: " in res.stderr and "Traceback" not in res.stderr

    refused(lab, "--mok-key is for a lab image", "--from", str(FIXTURES / "fresh-debian12-no-venv"))
    open_key = _copy_lab(tmp_path / "a", lab)
    (open_key / "mok.key").chmod(0o640)
    refused(open_key, "readable by others")
    no_hash = _copy_lab(tmp_path / "b", lab)
    (no_hash / "mok.hash").write_text("lab one-time password\n")
    (no_hash / "mok.hash").chmod(0o600)
    refused(no_hash, "holds no SHA-512 password hash")
    other = tmp_path / "other"
    assert _new(other, "x\n").returncode == 0
    mixed = _copy_lab(tmp_path / "c", lab)
    shutil.copy(other / "mok.der", mixed / "mok.der")
    refused(mixed, "is not the certificate of")
    missing = _copy_lab(tmp_path / "d", lab)
    (missing / "mok.der").unlink()
    refused(missing, "is missing or not a regular file")
    assert sorted(str(p) for p in root.rglob("*")) == before


# -- the copy, DKMS's drop-in and rollback, by the real executor -------------------------------


def _execute(root: Path, plan: Plan) -> None:
    from egpu_setup.execute.executor import ExecOptions, execute
    from egpu_setup.state.paths import StatePaths

    execute(plan, RootHost(root), StatePaths.for_root(root), ExecOptions.from_env())


def test_the_executor_copies_the_key_root_only_and_rollback_takes_it_back(
    tmp_path: Path, lab: Path
) -> None:
    root = tmp_path / "image"
    (root / "usr/bin").mkdir(parents=True)
    target = RootHost(root)
    plan = mok_key.with_lab_key(Plan(()), target, frozenset({"driver"}), str(lab), 60)
    assert [s.kind for s in plan.steps][:1] == ["apt-install"]  # no mokutil in the image yet
    (root / "usr/bin/mokutil").write_text("#!/bin/sh\n")  # as if mokutil were installed
    plan = mok_key.with_lab_key(Plan(()), target, frozenset({"driver"}), str(lab), 60)
    assert [s.kind for s in plan.steps] == ["copy-file"] * 3 + ["write-file"]
    _execute(root, plan)
    image = root / "etc/egpu-setup/mok"
    for name, mode in (("mok.key", 0o600), ("mok.der", 0o644), ("mok.hash", 0o600)):
        assert (image / name).read_bytes() == (lab / name).read_bytes()
        assert stat.S_IMODE((image / name).stat().st_mode) == mode, name
    # dkms sources its drop-ins as shell (dkms.in read_framework_conf): what it reads is ours
    conf = root / mok_key.DKMS_CONF.lstrip("/")
    said = subprocess.run(
        ["bash", "-c", f'. "{conf}"; echo "$mok_signing_key $mok_certificate"'],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert said == [mok_key.IMAGE_KEY, LAB_CERT]
    assert mok_key.with_lab_key(Plan(()), target, frozenset({"driver"}), str(lab), 60).empty
    assert mok_key.with_lab_key(Plan(()), target, frozenset({"torch"}), str(lab), 60).empty
    res = run_cli("rollback", "--root", str(root), "--yes", "--json")
    assert res.returncode == 0, res.stderr
    assert not image.exists() and not conf.exists(), sorted(map(str, root.rglob("*")))


def test_a_key_swapped_after_planning_is_not_copied(tmp_path: Path, lab: Path) -> None:
    from egpu_setup.errors import EgpuSetupError

    root = tmp_path / "image"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/mokutil").write_text("#!/bin/sh\n")
    mine = _copy_lab(tmp_path, lab)
    plan = mok_key.with_lab_key(Plan(()), RootHost(root), frozenset({"driver"}), str(mine), 60)
    (mine / "mok.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\nswapped\n")
    with pytest.raises(EgpuSetupError, match="changed"):
        _execute(root, plan)
    assert not (root / "etc/egpu-setup/mok/mok.key").exists()


# -- first boot queues the enrolment ---------------------------------------------------------

NOT_ENROLLED = f"{LAB_CERT} is not enrolled\n"
PENDING = f"{LAB_CERT} is already in the enrollment request\n"
ENROLLED = f"{LAB_CERT} is already enrolled\n"

# the stand-in: --test-key prints the state in /var/lib/mok-standin/state; --import checks what
# the real one would read (a DER certificate, a SHA-512 crypt hash) and queues it (state: pending)
_MOKUTIL = r"""#!/bin/sh
echo "$*" >> /var/lib/mok-standin/argv
case "$1" in
  --test-key) cat /var/lib/mok-standin/state; grep -q "not enrolled" /var/lib/mok-standin/state && exit 1; exit 0 ;;
  --import)
    [ "$3" = --hash-file ] || exit 2
    head -c 2 "$2" | od -An -tx1 | grep -q "30 82" || { echo "not DER" >&2; exit 1; }
    grep -Eq '^\$6\$[./0-9A-Za-z]{1,16}\$[./0-9A-Za-z]{86}$' "$4" || { echo "bad hash" >&2; exit 1; }
    echo "$2 is already in the enrollment request" > /var/lib/mok-standin/state ;;
esac
"""


class LiveLike(RootHost):
    """A real Debian root that answers like the running system (mokutil runs in the chroot)."""

    kind = "live"

    def command(self, name: str, argv: Sequence[str], timeout: float | None = None) -> str | None:
        return Host.command(self, name, argv, timeout)


@pytest.fixture(scope="module")
def laptop(tmp_path_factory: pytest.TempPathFactory, lab: Path) -> Path:
    try:
        root = copy_root("trixie", tmp_path_factory.mktemp("fb") / "root")
    except DebrootUnavailable as exc:
        pytest.skip(str(exc))
    image = root / "etc/egpu-setup/mok"
    image.mkdir(parents=True)
    for name in ("mok.der", "mok.hash"):
        shutil.copy(lab / name, image / name)
    tool = root / "usr/bin/mokutil"
    tool.write_text(_MOKUTIL)
    tool.chmod(0o755)
    with (root / "var/lib/dpkg/status").open("a") as status:
        status.write("\nPackage: nvidia-kernel-dkms\nStatus: install ok installed\n"
                     "Version: 535.247.01-1\nArchitecture: amd64\n")  # fmt: skip
    return root


def _state(root: Path, text: str) -> None:
    (root / "var/lib/mok-standin").mkdir(exist_ok=True)
    (root / "var/lib/mok-standin/state").write_text(text)
    (root / "var/lib/mok-standin/argv").write_text("")


@pytest.mark.debootstrap
def test_first_boot_queues_the_lab_key_once_and_reports_it_until_enrolled(laptop: Path) -> None:
    host = LiveLike(laptop)
    _state(laptop, NOT_ENROLLED)
    assert mok_status(host, True) == "mok-needed"
    _state(laptop, NOT_ENROLLED)  # the argv log from here on
    said = queue_lab_key(host, True)
    assert said is not None and "queued the lab's key" in said, said
    calls = (laptop / "var/lib/mok-standin/argv").read_text().splitlines()
    assert calls == [f"--test-key {LAB_CERT}", f"--import {LAB_CERT} --hash-file {LAB_HASH}"]
    assert mok_status(host, True) == "mok-needed"  # queued: MokManager has not confirmed it
    assert queue_lab_key(host, True) is None  # already in the enrolment request: not again
    _state(laptop, ENROLLED)  # after MokManager's "Enroll MOK"
    assert queue_lab_key(host, True) is None and mok_status(host, True) == "mok-enrolled"
    assert (laptop / "var/lib/mok-standin/argv").read_text().count("--import") == 0
    _state(laptop, NOT_ENROLLED)
    assert queue_lab_key(host, False) is None and queue_lab_key(host, None) is None
    assert "--import" not in (laptop / "var/lib/mok-standin/argv").read_text()


@pytest.mark.debootstrap
def test_a_failed_import_is_said_not_raised(laptop: Path) -> None:
    host = LiveLike(laptop)
    _state(laptop, PENDING.replace("already in the enrollment request", "not enrolled"))
    hashed = laptop / LAB_HASH.lstrip("/")
    good = hashed.read_bytes()
    hashed.write_text("lab one-time password\n")  # not what mokutil --hash-file reads
    try:
        said = queue_lab_key(host, True)
    finally:
        hashed.write_bytes(good)
    assert said is not None and "failed: bad hash" in said, said
    assert mok_status(host, True) == "mok-needed"


def test_an_image_tree_never_runs_mokutil(tmp_path: Path, lab: Path) -> None:
    """`firstboot --root` (an image, a fake sysfs tree) cannot ask the firmware: no import."""
    root = tmp_path / "tree"
    (root / "etc/egpu-setup/mok").mkdir(parents=True)
    for name in ("mok.der", "mok.hash"):
        shutil.copy(lab / name, root / "etc/egpu-setup/mok" / name)
    efivars = root / "sys/firmware/efi/efivars"
    efivars.mkdir(parents=True)
    # SecureBoot-8be4df61-...: 4 attribute bytes, then 1 = on (the efivarfs layout)
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\0\0\0\x01")
    res = run_cli("firstboot", "--profile", "rtx4090", "--root", str(root), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(Path(json.loads(res.stdout)["report"]).read_text())
    assert report["mok"] is None and not any("mokutil" in s for s in report["steps"]), report
    assert sorted(os.listdir(root / "etc/egpu-setup/mok")) == ["mok.der", "mok.hash"]
