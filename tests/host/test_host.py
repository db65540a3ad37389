"""The host gateway: recorded trees behave like the kernel's, and nothing escapes a root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conftest import RunCli
from egpu_setup.errors import ExecutionError, UnsupportedHardware, UsageError
from egpu_setup.host.machine import LiveHost, RecordedHost, check_platform


def make_bundle(tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    dev = b / "root/sys/devices/pci0000:00/0000:00:1c.4/0000:3c:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_bytes(b"\x00\x01garbage")
    bus = b / "root/sys/bus/pci/devices"
    bus.mkdir(parents=True)
    (bus / "0000:3c:00.0").symlink_to("../../../devices/pci0000:00/0000:00:1c.4/0000:3c:00.0")
    (b / "root/etc").mkdir()
    (b / "root/usr/lib").mkdir(parents=True)
    (b / "root/usr/lib/os-release").write_text("ID=debian\n")
    (b / "root/etc/os-release").symlink_to("/usr/lib/os-release")  # absolute, as some distros do
    (b / "root/etc/escape").symlink_to("../../../../../../etc/hostname")
    (b / "commands").mkdir()
    (b / "commands/lspci.txt").write_text("00:02.0 VGA compatible controller: Intel\n")
    (b / "meta.json").write_text(
        '{"env": {"XDG_SESSION_TYPE": "wayland"},'
        ' "uname": {"release": "6.8.0", "machine": "x86_64"}}'
    )
    return b


def test_recorded_symlinks_resolve_inside_the_bundle(tmp_path: Path) -> None:
    host = RecordedHost(make_bundle(tmp_path))
    assert host.resolve("/sys/bus/pci/devices/0000:3c:00.0") == (
        "/sys/devices/pci0000:00/0000:00:1c.4/0000:3c:00.0"
    )
    assert host.read_attr("/sys/bus/pci/devices/0000:3c:00.0/vendor") == "0x10de"
    # An absolute link means "from the bundle's root", never this machine's /usr.
    assert host.read("/etc/os-release") == "ID=debian\n"


def test_links_cannot_escape_the_root(tmp_path: Path) -> None:
    host = RecordedHost(make_bundle(tmp_path))
    assert host.resolve("/etc/escape") == "/etc/hostname"
    assert host.read("/etc/escape") is None  # the bundle has no /etc/hostname
    assert host.read("/../../../../etc/passwd") is None


def test_binary_and_missing_files_are_none(tmp_path: Path) -> None:
    host = RecordedHost(make_bundle(tmp_path))
    assert host.read("/sys/bus/pci/devices/0000:3c:00.0/class") is None
    assert host.read("/proc/nope") is None
    assert host.listdir("/sys/nope") == []


def test_recorded_commands_env_and_uname(tmp_path: Path) -> None:
    host = RecordedHost(make_bundle(tmp_path))
    assert (host.command("lspci", ["lspci"]) or "").startswith("00:02.0 VGA")
    assert host.command("dmesg", ["dmesg"]) is None
    assert host.getenv("XDG_SESSION_TYPE") == "wayland"
    assert host.uname() == ("6.8.0", "x86_64")
    with pytest.raises(ExecutionError):
        host.run(["true"])


def test_malformed_meta_is_ignored(tmp_path: Path) -> None:
    b = make_bundle(tmp_path)
    (b / "meta.json").write_bytes(b"\xff\xfe[not json")
    host = RecordedHost(b)
    assert host.getenv("XDG_SESSION_TYPE") is None


def test_missing_bundle_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        RecordedHost(tmp_path / "nope")
    assert err.value.exit_code == 2 and err.value.hint


def test_symlink_loop_gives_none(tmp_path: Path) -> None:
    b = make_bundle(tmp_path)
    (b / "root/loop").symlink_to("loop")
    assert RecordedHost(b).read("/loop") is None


def test_live_host_runs_argv_lists_and_reports_missing_tools() -> None:
    host = LiveHost()
    res = host.run(["sh", "-c", 'printf "%s" "$LC_ALL"'])
    assert res.ok and res.out == "C.UTF-8"
    assert host.command("no-such-tool", ["no-such-tool-egpu"]) is None
    assert host.read_attr("/proc/sys/kernel/osrelease") == os.uname().release


def test_live_which_looks_only_where_root_may_start_programs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare name is looked up in SYSTEM_PATH and the running Python's own bin; a user's PATH
    is searched for that user only, its absolute entries only (an empty or relative one is the
    working directory); a file that is not executable is passed over; a name with a slash is
    checked as it is."""
    from egpu_setup.host import process

    here, there = tmp_path / "here", tmp_path / "bin"
    for d in (here, there):
        d.mkdir()
        tool = d / "tool"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain/tool").write_text("not executable\n")
    monkeypatch.chdir(tmp_path)
    host = LiveHost()
    monkeypatch.setenv("PATH", f"here::{there}")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert host.which("tool") is None  # root: the caller's PATH is not where root looks
    assert os.path.dirname(sys.executable) in process.search_dirs()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert host.which("tool") == str(there / "tool")  # a user: their PATH, "here" never
    monkeypatch.setenv("PATH", "here:")
    assert host.which("tool") is None
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(process, "SYSTEM_PATH", f"{tmp_path / 'plain'}:{there}")
    assert host.which("tool") == str(there / "tool")  # plain/tool is not executable
    assert host.which("./here/tool") == "./here/tool"
    assert host.which(str(tmp_path / "plain/tool")) is None


@pytest.mark.parametrize(("platform", "hint_word"), [("darwin", "Linux"), ("win32", "WSL2")])
def test_macos_and_windows_are_refused_with_an_explanation(platform: str, hint_word: str) -> None:
    with pytest.raises(UnsupportedHardware) as err:
        check_platform(platform)
    assert err.value.exit_code == 2
    assert hint_word in (err.value.hint or "")
    check_platform("linux")  # and Linux passes


def test_cli_missing_from_dir_exits_2(cli: RunCli, tmp_path: Path) -> None:
    res = cli("detect", "--json", "--from", str(tmp_path / "missing"))
    assert res.returncode == 2
    assert res.stderr.startswith("error: recorded host not found")
    assert "hint: " in res.stderr and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_cli_unknown_option_is_error_and_hint(cli: RunCli) -> None:
    res = cli("detect", "--bogus")
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and "hint: see `" in res.stderr


def test_readlink_follows_parent_links_inside_the_root(tmp_path: Path) -> None:
    b = make_bundle(tmp_path)
    # /sys/bus/pci/devices/0000:3c:00.0 is a link; a link below it must be read in the bundle.
    dev = b / "root/sys/devices/pci0000:00/0000:00:1c.4/0000:3c:00.0"
    (dev / "driver").symlink_to("../../../../bus/pci/drivers/nvidia")
    (b / "root/abs").symlink_to("/sys/devices")  # an absolute link above the target
    host = RecordedHost(b)
    assert (
        host.readlink("/sys/bus/pci/devices/0000:3c:00.0/driver")
        == "../../../../bus/pci/drivers/nvidia"
    )
    assert host.readlink("/abs/pci0000:00/0000:00:1c.4/0000:3c:00.0/driver") is not None
    assert host.readlink("/etc/os-release") == "/usr/lib/os-release"
    assert host.readlink("/etc/nope") is None


def test_a_directory_that_is_not_a_bundle_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "random").mkdir()
    (tmp_path / "random" / "notes.txt").write_text("hello")
    with pytest.raises(UsageError) as err:
        RecordedHost(tmp_path / "random")
    assert "is not a recorded host" in err.value.message and err.value.hint


def test_a_failed_command_shows_what_it_said(capsys: pytest.CaptureFixture[str]) -> None:
    from egpu_setup.cli import fail

    exc = ExecutionError(
        "pip download failed", "check the index", argv=["pip"], rc=1,
        stderr_tail="Looking in indexes: http://127.0.0.1:9/\nERROR: No matching distribution\x1b[31m",
    )  # fmt: skip
    with pytest.raises(SystemExit) as code:
        fail(exc)
    err = capsys.readouterr().err.splitlines()
    assert code.value.code == 1
    assert err == [
        "error: pip download failed",
        "  | Looking in indexes: http://127.0.0.1:9/",
        "  | ERROR: No matching distribution\\x1b[31m",
        "hint: check the index",
    ]
