"""Every rendered file passes the real checker for its format.

shellcheck + `bash -n` (scripts and the GRUB drop-in, which grub-mkconfig sources as shell),
`systemd-analyze verify` with EMPTY stderr (it exits 0 on unknown keys, printing them to stderr),
`udevadm verify` from Debian 13 (systemd >= 254; Debian 12's 252 lacks the verb), Xorg's own
config parser for the Xorg file the boot helper writes, and for xorg.conf.d with our link
dangling (eGPU absent) and resolving (present). A test skips only when its checker cannot be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import pytest

from egpu_setup.render.files import XORG_DROPIN, RenderedFile, render_set
from helpers import tiers
from helpers.render_cases import CASES, fake_sys, run_helper

RENDERS = [
    pytest.param(name, mode, id=f"{name}-{mode}")
    for name, (_, _, _, modes) in CASES.items()
    for mode in modes
]


def _files(name: str, mode: str) -> tuple[RenderedFile, ...]:
    facts, prof, opts, _ = CASES[name]
    return render_set(facts, prof, None, mode, **opts).files


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (.ci/run installs it)")
    return path


def _shell_files(files: Iterable[RenderedFile]) -> list[RenderedFile]:
    return [f for f in files if f.content.startswith("#!/bin/sh") or f.path.endswith(".cfg")]


@pytest.mark.parametrize(("name", "mode"), RENDERS)
def test_scripts_pass_bash_n_and_shellcheck(name: str, mode: str, tmp_path: Path) -> None:
    shellcheck = _need("shellcheck")
    scripts = _shell_files(_files(name, mode))
    assert any(f.path == "/usr/local/bin/egpu-hotplug" for f in scripts)
    for f in scripts:
        path = tmp_path / Path(f.path).name
        path.write_text(f.content)
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{f.path}: {syntax.stderr}"
        lint = subprocess.run(
            [shellcheck, "-s", "sh", "-f", "gcc", str(path)], capture_output=True, text=True
        )
        assert lint.returncode == 0 and lint.stdout == "", f"{f.path}:\n{lint.stdout}{lint.stderr}"


def test_shellcheck_catches_a_bad_script(tmp_path: Path) -> None:
    """The checker is live: an unquoted expansion is reported (SC2086)."""
    shellcheck = _need("shellcheck")
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\nx=$1\nrm $x\n")
    lint = subprocess.run(
        [shellcheck, "-s", "sh", "-f", "gcc", str(bad)], capture_output=True, text=True
    )
    assert lint.returncode != 0 and "SC2086" in lint.stdout


# -- systemd ---------------------------------------------------------------------------------------


def _fake_root(tmp_path: Path, files: tuple[RenderedFile, ...]) -> Path:
    """A root with the host's unit directory, usr-merged /bin and stubs for every ExecStart."""
    root = tmp_path / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for d in ("bin", "sbin", "lib"):
        (root / "usr" / d).mkdir(parents=True, exist_ok=True)
        (root / d).symlink_to(f"usr/{d}")
    (root / "usr/local/bin").mkdir(parents=True)
    stubs = (
        "usr/bin/rm",
        "usr/bin/nvidia-persistenced",
        "usr/local/bin/egpu-setup",
        "opt/egpu-setup/tool/bin/egpu-setup",
    )
    for stub in stubs:
        (root / stub).parent.mkdir(parents=True, exist_ok=True)
        (root / stub).write_text("#!/bin/sh\nexit 0\n")
        (root / stub).chmod(0o755)
    for f in files:
        target = root / f.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)
        target.chmod(f.mode)
    return root


@pytest.mark.parametrize(("name", "mode"), RENDERS)
def test_units_pass_systemd_analyze_verify(name: str, mode: str, tmp_path: Path) -> None:
    analyze = _need("systemd-analyze")
    files = _files(name, mode)
    units = [f.path for f in files if f.path.endswith((".service", ".timer"))]
    assert len(units) >= 3
    root = _fake_root(tmp_path, files)
    for unit in units:
        res = subprocess.run(
            [analyze, "verify", f"--root={root}", unit], capture_output=True, text=True
        )
        assert (res.returncode, res.stderr) == (0, ""), f"{unit}:\n{res.stderr}"


@pytest.mark.parametrize(("name", "mode"), [r for r in RENDERS if "fedora" not in str(r.id)])
def test_apt_hook_parses_and_its_command_passes_shellcheck(
    name: str, mode: str, tmp_path: Path
) -> None:
    """apt-config reads the rendered hook (header comments and all) as exactly one
    DPkg::Post-Invoke command, which apt runs with `sh -c`: that text passes shellcheck."""
    apt_config = _need("apt-config")
    shellcheck = _need("shellcheck")
    (hook,) = [f for f in _files(name, mode) if f.path.startswith("/etc/apt/apt.conf.d/")]
    conf = tmp_path / "hook.conf"
    conf.write_text(hook.content)
    (tmp_path / "parts").mkdir()
    empty = tmp_path / "main.conf"
    empty.write_text(f'Dir::Etc::parts "{tmp_path / "parts"}";\n')
    # APT_CONFIG names a main file of our own, so this machine's apt.conf.d stays out
    dump = subprocess.run(
        [apt_config, "-c", str(conf), "dump", "DPkg::Post-Invoke"],
        capture_output=True,
        text=True,
        env={**os.environ, "APT_CONFIG": str(empty)},
        check=True,
    ).stdout
    entries = [line for line in dump.splitlines() if line.startswith("DPkg::Post-Invoke::")]
    assert len(entries) == 1, dump
    command = entries[0].split('"', 1)[1].rsplit('"', 1)[0]
    assert command.startswith("if [ -x /opt/egpu-setup/tool/bin/egpu-setup ]"), command
    assert command.rstrip("; fi").endswith("|| true"), command
    script = tmp_path / "hook.sh"
    script.write_text("#!/bin/sh\n" + command + "\n")
    res = subprocess.run([shellcheck, "-s", "sh", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_resume_unit_ordered_after_nvidia_resume_passes_verify(tmp_path: Path) -> None:
    """Display mode with the driver's suspend units (render/sleep.py): the resume check is
    ordered after nvidia-resume.service, shipped by the driver (its Ubuntu unit, as
    nvidia-kernel-common-N installs it), and the links that enable NVIDIA's units resolve."""
    from dataclasses import replace

    from egpu_setup.render.files import UNIT_RESUME, render_set
    from helpers.install_values import resolution
    from helpers.render_cases import UBUNTU2404_USB4_5090, profile

    analyze = _need("systemd-analyze")
    facts = replace(
        UBUNTU2404_USB4_5090,
        nvidia=replace(UBUNTU2404_USB4_5090.nvidia, driver_version=None, module_loaded=False),
    )
    result = render_set(facts, profile("rtx5090", ("2b85",)), resolution(facts_=facts), "display")
    root = _fake_root(tmp_path, result.files)
    for unit in ("suspend", "resume", "hibernate"):
        shipped = root / f"lib/systemd/system/nvidia-{unit}.service"
        shipped.write_text(
            f"[Unit]\nDescription=NVIDIA system {unit} actions\n[Service]\nType=oneshot\n"
            f"ExecStart=/usr/bin/rm -f /run/nvidia-{unit}\n"
        )
    links = [ln for ln in result.links if ".requires/" in ln.path]
    assert len(links) == 4
    for ln in links:
        (root / ln.path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / ln.path.lstrip("/")).symlink_to(ln.target)
        assert (root / ln.target.lstrip("/")).is_file()
    resume = next(f for f in result.files if f.path == UNIT_RESUME)
    assert "After=nvidia-resume.service" in resume.content
    res = subprocess.run(
        [analyze, "verify", f"--root={root}", UNIT_RESUME, "nvidia-resume.service"],
        capture_output=True,
        text=True,
    )
    assert (res.returncode, res.stderr) == (0, ""), res.stderr


def test_systemd_analyze_catches_a_bad_unit(tmp_path: Path) -> None:
    """The reason for asserting empty stderr: a typo'd key still exits 0."""
    analyze = _need("systemd-analyze")
    root = _fake_root(tmp_path, ())
    unit = root / "etc/systemd/system/bad.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(
        "[Unit]\nAfterr=bolt.service\n[Service]\nType=oneshot\nExecStart=/usr/bin/rm -f /x\n"
    )
    res = subprocess.run(
        [analyze, "verify", f"--root={root}", "/etc/systemd/system/bad.service"],
        capture_output=True,
        text=True,
    )
    assert "Afterr" in res.stderr


# -- udev ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def udev_root() -> Path:
    from helpers.debroot import DebrootUnavailable
    from helpers.udev_root import udev_root as build

    try:
        return build()
    except DebrootUnavailable as exc:
        pytest.skip(f"no udevadm >= 254: {exc}")


@pytest.mark.debootstrap  # udevadm of a Debian 13 root
@pytest.mark.parametrize(("name", "mode"), RENDERS)
def test_rules_pass_udevadm_verify(name: str, mode: str, udev_root: Path) -> None:
    from helpers.udev_root import udevadm_verify

    rules = {Path(f.path).name: f.content for f in _files(name, mode) if f.path.endswith(".rules")}
    res = udevadm_verify(udev_root, rules)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Success: {len(rules)}" in res.stdout + res.stderr


@pytest.mark.debootstrap  # udevadm of a Debian 13 root
def test_udevadm_verify_catches_a_bad_rule(udev_root: Path) -> None:
    from helpers.udev_root import udevadm_verify

    res = udevadm_verify(udev_root, {"98-bad.rules": 'ACTION="add" SUBSYSTEM=="pci"\n'})
    assert res.returncode != 0


# -- Xorg ------------------------------------------------------------------------------------------


def _xorg_parse(conf: Path, tmp_path: Path, configdir: Path | None = None) -> str:
    tiers.require("xorg")
    xorg = _need("Xorg")
    log = tmp_path / "Xorg.log"
    log.unlink(missing_ok=True)
    extra = ["-configdir", str(configdir)] if configdir is not None else []
    subprocess.run(
        [
            "timeout",
            "10",
            xorg,
            ":97",
            "-config",
            str(conf),
            *extra,
            "-logfile",
            str(log),
            "-nolisten",
            "tcp",
            "-noreset",
            "-novtswitch",
            "-sharevts",
            "-keeptty",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return log.read_text(errors="replace") if log.exists() else ""


@pytest.mark.xorg
@pytest.mark.parametrize("slot", ["0000:3c:00", "10000:e1:00"])
def test_xorg_file_the_boot_helper_writes_parses(slot: str, tmp_path: Path) -> None:
    """The file egpu-hotplug writes at boot (display mode), through Xorg's own parser."""
    _need("Xorg")
    res = run_helper(tmp_path, fake_sys(tmp_path, slot=slot), "display", "5", slot=slot)
    assert res.returncode == 0, res.stderr
    conf = tmp_path / "run/egpu-setup/90-egpu-setup.conf"
    log = _xorg_parse(conf, tmp_path)
    assert log, "Xorg wrote no log"
    assert "Parse error" not in log and "Problem parsing" not in log, log[-3000:]
    assert '|-->Device "egpu-setup-egpu"' in log, log[-3000:]
    # It got past parsing to loading the driver (absent on a machine without a GPU).
    assert 'LoadModule: "nvidia"' in log or 'Failed to load module "nvidia"' in log, log[-3000:]


def _config_dir(tmp_path: Path, target: Path) -> tuple[Path, Path]:
    """An xorg.conf.d with a keyboard snippet and our link; a minimal -config next to it."""
    confd = tmp_path / "xorg.conf.d"
    confd.mkdir()
    (confd / "00-keyboard.conf").write_text(
        'Section "InputClass"\n    Identifier "kbd"\n    MatchIsKeyboard "on"\n'
        '    Option "XkbLayout" "us"\nEndSection\n'
    )
    (confd / Path(XORG_DROPIN).name).symlink_to(target)
    base = tmp_path / "base.conf"
    base.write_text('Section "ServerFlags"\n    Option "AutoAddDevices" "false"\nEndSection\n')
    return base, confd


@pytest.mark.xorg
def test_absent_egpu_leaves_xorg_without_an_egpu_device(tmp_path: Path) -> None:
    """Booted without the eGPU: the helper wrote nothing, the link dangles, and Xorg reads the
    directory as if our file were not there (scan.c skips what it cannot fopen)."""
    _need("Xorg")
    sysfs = fake_sys(tmp_path, authorized="0")
    res = run_helper(tmp_path, sysfs, "display", "1")
    assert res.returncode == 0, res.stderr
    runtime = tmp_path / "run/egpu-setup/90-egpu-setup.conf"
    assert not runtime.exists()
    base, confd = _config_dir(tmp_path, runtime)
    log = _xorg_parse(base, tmp_path, confd)
    assert f'Using config directory: "{confd}"' in log, log[-3000:]
    assert "egpu-setup-egpu" not in log and "Parse error" not in log, log[-3000:]
    assert "(EE) Unable to locate/open config directory" not in log


@pytest.mark.xorg
def test_present_egpu_reaches_xorg_through_the_link(tmp_path: Path) -> None:
    """The control for the test above: the same directory with the file present has the
    eGPU's Device section, so its absence there is the dangling link's doing."""
    _need("Xorg")
    res = run_helper(tmp_path, fake_sys(tmp_path), "display", "5")
    assert res.returncode == 0, res.stderr
    base, confd = _config_dir(tmp_path, tmp_path / "run/egpu-setup/90-egpu-setup.conf")
    log = _xorg_parse(base, tmp_path, confd)
    assert '|-->Device "egpu-setup-egpu"' in log, log[-3000:]


def test_display_mode_writes_no_fixed_xorg_file() -> None:
    for name, mode in [
        cast(tuple[str, str], p.values) for p in RENDERS if p.values[1] == "display"
    ]:
        assert not [f.path for f in _files(name, mode) if "xorg.conf.d" in f.path]


@pytest.mark.xorg
def test_xorg_parser_catches_a_broken_section(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text('Section "Device"\n    Identifier "x"\n    Driver "nvidia"\n')
    log = _xorg_parse(conf, tmp_path)
    assert "Parse error" in log or "Problem parsing" in log
