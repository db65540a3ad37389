"""Hostile: a recorded host (`--from DIR`) is read inside itself, and a `--root` that is the running
system is refused.

How each attack is planted and checked: tests/helpers/sentinel.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from conftest import RunCli
from helpers.sentinel import TB4, Sentinel, clean_error

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks run as root")


@pytest.mark.parametrize("command", ["install", "rollback", "eject"])
@pytest.mark.parametrize("spelling", ["slash", "link-to-slash", "dotdot"])
def test_a_root_that_is_the_running_system_is_refused(
    cli: RunCli, tmp_path: Path, command: str, spelling: str
) -> None:
    """Was: `--root` resolving to / silently meant the live system."""
    root = {"slash": "/", "dotdot": str(tmp_path) + "/" + "../" * 12}.get(spelling)
    if root is None:
        (tmp_path / "slash").symlink_to("/")
        root = str(tmp_path / "slash")
    args = {
        "install": ["install", "--profile", "rtx4090", "--only", "config", "--from", str(TB4)],
        "rollback": ["rollback", "--yes"],
        "eject": ["eject", "--yes"],
    }[command]
    res = cli(*args, "--root", root)
    assert res.returncode == 2, res.stderr
    clean_error(res)
    assert "the running system, not an image" in res.stderr


# -- --from DIR: a recorded host is read inside itself ----------------------------------------


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A copy of a recorded laptop to plant things in."""
    dest = tmp_path / "bundle"
    shutil.copytree(TB4, dest, symlinks=True)
    return dest


@pytest.mark.parametrize("name", ["centos-release", "redhat-release", "lsb-release"])
def test_release_files_are_read_inside_the_bundle(
    cli: RunCli, bundle: Path, sentinel: Sentinel, name: str
) -> None:
    """Was: the `distro` fallback read etc/*-release through a link to a host file (detect
    printed the first line of a fake shadow file)."""
    for rel in ("etc/os-release", "usr/lib/os-release"):
        if os.path.lexists(bundle / "root" / rel):
            (bundle / "root" / rel).unlink()
    (bundle / "root/etc" / name).symlink_to(sentinel.shadow)
    res = cli("detect", "--json", "--from", str(bundle))
    assert res.returncode == 0, res.stderr
    assert not sentinel.leaked(res.stdout, res.stderr)
    assert json.loads(res.stdout)["os"]["id"] != "sentinel"  # what the link pointed at, unread
    assert sentinel.unchanged()


@pytest.mark.parametrize("name", ["centos-release", "lsb-release", "os-release"])
def test_no_byte_sequence_in_a_release_file_crashes_a_command(
    cli: RunCli, bundle: Path, name: str
) -> None:
    """Was: non-UTF-8 bytes in a release file crashed every command (exit 70)."""
    for rel in ("etc/os-release", "usr/lib/os-release"):
        if os.path.lexists(bundle / "root" / rel):
            (bundle / "root" / rel).unlink()
    body = b"CentOS \xff\xfe release 7.\xc3 (\x80Core)\n"
    if name != "centos-release":
        body = b'ID=\xff\xfeubuntu\nDISTRIB_ID=Ub\xc3untu\nVERSION_ID="\x80"\n'
    (bundle / "root/etc" / name).write_bytes(body)
    for args in (["detect"], ["doctor"], ["resolve"]):
        res = cli(*args, "--from", str(bundle))
        assert res.returncode in (0, 1, 2), res.stderr
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "rel", ["commands/dmesg.txt", "commands/lspci.txt", "meta.json", "commands/torch.json"]
)
def test_bundle_files_beside_root_are_read_inside_it(
    cli: RunCli, bundle: Path, sentinel: Sentinel, rel: str
) -> None:
    target = bundle / rel
    target.parent.mkdir(exist_ok=True)
    if os.path.lexists(target):
        target.unlink()
    target.symlink_to(sentinel.shadow)
    res = cli("doctor", "--json", "--from", str(bundle))
    assert res.returncode in (0, 1, 2), res.stderr
    assert "Traceback" not in res.stderr
    assert not sentinel.leaked(res.stdout, res.stderr)
    assert sentinel.unchanged()


@pytest.mark.parametrize("part", ["root", "commands"])
def test_a_bundle_whose_root_is_a_link_is_refused(cli: RunCli, tmp_path: Path, part: str) -> None:
    b = tmp_path / "b"
    b.mkdir()
    (b / part).symlink_to("/")
    res = cli("detect", "--from", str(b))
    assert res.returncode == 2
    clean_error(res)
    assert f"{b / part} is a symbolic link" in res.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_in_a_bundle_is_not_read(cli: RunCli, bundle: Path, kind: str) -> None:
    target = bundle / "root/proc/cmdline"
    if os.path.lexists(target):
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(target)  # a plain open() would block for ever
    else:
        os.mknod(target, 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: never ends
    res = cli("doctor", "--json", "--from", str(bundle), timeout=60)
    assert res.returncode in (0, 1), res.stderr


def test_a_pci_address_with_a_newline_never_reaches_a_rule(
    cli: RunCli, bundle: Path, tmp_path: Path
) -> None:
    """A device directory named "0000:…0\\n" passed `^…$`: its address would split a udev rule."""
    devices = bundle / "root/sys/bus/pci/devices"
    for link in list(devices.iterdir()):
        os.rename(link, devices / (link.name + "\n"))
    out = tmp_path / "out"
    res = cli("render", "--profile", "rtx4090", "--out", str(out), "--from", str(bundle))
    assert "Traceback" not in res.stderr
    for path in out.rglob("*"):
        if path.is_file() and not path.is_symlink():
            text = path.read_text()
            assert not any(
                line.rstrip().endswith(('"0000:', ":00.0")) for line in text.splitlines()
            ), path


def test_a_recorded_kernel_log_over_the_cap_keeps_its_newest_part(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: the cap kept the oldest 64 MiB of dmesg.txt, silently: the eGPU's errors, at the
    end, were never seen."""
    from egpu_setup.host import machine

    monkeypatch.setattr(machine, "MAX_READ", 4096)
    newest = "[ 9999.1] NVRM: Xid (PCI:0000:2f:00): 79, GPU has fallen off the bus.\n"
    (bundle / "commands/dmesg.txt").write_text("[    0.0] old boot line\n" * 1000 + newest)
    with caplog.at_level("WARNING", logger="egpu_setup"):
        text = machine.RecordedHost(bundle).command("dmesg", ["dmesg"])
    assert text is not None and text.endswith(newest) and len(text) == 4096
    assert "reading its last" in caplog.text
