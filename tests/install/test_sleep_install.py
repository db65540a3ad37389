"""Display mode on a root that has the driver's suspend units (install --root, the recorded TB4
Ubuntu laptop, the config part): the `.requires/` links that enable NVIDIA's units are made, a second run plans nothing, rollback takes the links back and leaves the units."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import FIXTURES, RunCli

TB4 = str(FIXTURES / "tb4-rtx4090-ubuntu2404")
UNITS = "lib/systemd/system"  # where Ubuntu's nvidia-kernel-common-N puts them
LINKS = {
    "etc/systemd/system/systemd-suspend.service.requires/nvidia-suspend.service": "suspend",
    "etc/systemd/system/systemd-suspend.service.requires/nvidia-resume.service": "resume",
    "etc/systemd/system/systemd-hibernate.service.requires/nvidia-resume.service": "resume",
    "etc/systemd/system/systemd-hibernate.service.requires/nvidia-hibernate.service": "hibernate",
}


def _install(cli: RunCli, img: Path, state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "install", "--profile", "rtx4090", "--only", "config", "--root", str(img),
        "--from", TB4, "--yes", "--mode", "display", *extra,
        env={"EGPU_SETUP_STATE_DIR": str(state)},
    )  # fmt: skip


def test_display_mode_enables_the_shipped_units_and_rolls_them_back(
    cli: RunCli, tmp_path: Path
) -> None:
    img, state = tmp_path / "img", tmp_path / "state"
    (img / UNITS).mkdir(parents=True)
    for unit in ("suspend", "resume", "hibernate"):
        (img / UNITS / f"nvidia-{unit}.service").write_text(f"[Unit]\nDescription={unit}\n")
    res = _install(cli, img, state)
    assert res.returncode in (0, 3), res.stderr  # 3: the module options want a reboot
    for link, unit in LINKS.items():
        assert os.readlink(img / link) == f"/{UNITS}/nvidia-{unit}.service"
    # the option is the driver part's modprobe drop-in (tests/render/test_sleep.py)
    again = _install(cli, img, state, "--dry-run", "--json")
    assert json.loads(again.stdout)["steps"] == []
    back = cli("rollback", "--yes", "--root", str(img), env={"EGPU_SETUP_STATE_DIR": str(state)})
    assert back.returncode == 0, back.stderr
    assert not any(os.path.lexists(img / link) for link in LINKS)
    assert sorted(p.name for p in (img / UNITS).iterdir()) == [
        "nvidia-hibernate.service",
        "nvidia-resume.service",
        "nvidia-suspend.service",
    ]
