"""Display mode and suspend: video-memory preservation and NVIDIA's own units, together and only
where the driver's packages ship the units (render/sleep.py, data/sleep.yaml)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from egpu_setup.execute.undo import owned_path
from egpu_setup.host.machine import RootHost
from egpu_setup.render.files import MODPROBE_NVIDIA, XORG_DROPIN, RenderSet, render_set
from egpu_setup.render.sleep import probe_sleep_units
from helpers.install_values import resolution
from helpers.render_cases import DEBIAN12_TB3_4090, UBUNTU2404_USB4_5090, profile

# the Ubuntu laptop before its driver is installed: the resolver plans nvidia-driver-N(-open)
UBUNTU_NO_DRIVER = replace(
    UBUNTU2404_USB4_5090,
    nvidia=replace(UBUNTU2404_USB4_5090.nvidia, driver_version=None, module_loaded=False),
)
PRESERVE = "NVreg_PreserveVideoMemoryAllocations=1 NVreg_TemporaryFilePath=/var/tmp"


def _modprobe(result: RenderSet) -> str:
    return next(f.content for f in result.files if f.path == MODPROBE_NVIDIA)


def _sleep_links(result: RenderSet) -> dict[str, str]:
    return {ln.path: ln.target for ln in result.links if ln.path != XORG_DROPIN}


def test_ubuntu_driver_package_pulls_the_units_in_so_display_mode_enables_them() -> None:
    res = resolution(facts_=UBUNTU_NO_DRIVER)
    assert any(p.startswith("nvidia-driver-") for p in res.driver.packages)
    result = render_set(UBUNTU_NO_DRIVER, profile("rtx5090", ("2b85",)), res, "display")
    assert f"options nvidia {PRESERVE}\n" in _modprobe(result)
    unit_dir = "/lib/systemd/system"  # nvidia-kernel-common-N's file list
    assert _sleep_links(result) == {
        "/etc/systemd/system/systemd-suspend.service.requires/nvidia-suspend.service": (
            f"{unit_dir}/nvidia-suspend.service"
        ),
        "/etc/systemd/system/systemd-hibernate.service.requires/nvidia-hibernate.service": (
            f"{unit_dir}/nvidia-hibernate.service"
        ),
        "/etc/systemd/system/systemd-suspend.service.requires/nvidia-resume.service": (
            f"{unit_dir}/nvidia-resume.service"
        ),
        "/etc/systemd/system/systemd-hibernate.service.requires/nvidia-resume.service": (
            f"{unit_dir}/nvidia-resume.service"
        ),
    }
    # rollback may take each link back, and nothing of NVIDIA's own
    assert all(owned_path(p) for p in _sleep_links(result))
    assert not owned_path(f"{unit_dir}/nvidia-suspend.service")
    assert not owned_path("/etc/systemd/system/nvidia-suspend.service")


def test_compute_mode_never_preserves_video_memory() -> None:
    res = resolution(facts_=UBUNTU_NO_DRIVER)
    result = render_set(UBUNTU_NO_DRIVER, profile("rtx5090", ("2b85",)), res, "compute")
    assert "PreserveVideoMemoryAllocations" not in _modprobe(result)
    assert _sleep_links(result) == {}


def test_without_the_units_the_option_stays_off_and_a_note_names_the_package() -> None:
    # Debian's driver does not pull nvidia-suspend-common in: the option alone would make every
    # suspend fail ("attempted without driver procfs suspend interface")
    result = render_set(DEBIAN12_TB3_4090, profile(), resolution(), "display")
    assert "PreserveVideoMemoryAllocations=1" not in _modprobe(result)
    assert _sleep_links(result) == {}
    assert any("install nvidia-suspend-common" in n for n in result.notes)


def test_units_already_on_the_target_are_enabled_where_they_lie(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib/systemd/system").mkdir(parents=True)
    assert probe_sleep_units(RootHost(root)) is None
    (root / "usr/lib/systemd/system/nvidia-suspend.service").write_text("[Unit]\n")
    found = probe_sleep_units(RootHost(root))
    assert found == "/usr/lib/systemd/system"
    result = render_set(DEBIAN12_TB3_4090, profile(), None, "display", sleep_units_dir=found)
    text = _modprobe(result)
    # both of Debian's module names get it, like every other option
    assert f"options nvidia {PRESERVE}\n" in text
    assert f"options nvidia-current {PRESERVE}\n" in text
    assert set(_sleep_links(result).values()) == {
        f"/usr/lib/systemd/system/nvidia-{u}.service" for u in ("suspend", "hibernate", "resume")
    }
    assert not any("not installed here" in n for n in result.notes)


# -- the sleep guard (hotplug.sleep_inhibit) ----------------------------------------------------


def _guard_unit(result: RenderSet) -> str | None:
    from egpu_setup.render.files import UNIT_SLEEP_GUARD

    return next((f.content for f in result.files if f.path == UNIT_SLEEP_GUARD), None)


def _enabled(result: RenderSet) -> tuple[str, ...]:
    return next(c.argv for c in result.commands if c.argv[:2] == ("systemctl", "enable"))


def test_guard_unit_runs_the_profiles_mode_and_is_enabled() -> None:
    for mode in ("block", "delay"):
        result = render_set(DEBIAN12_TB3_4090, profile(sleep_inhibit=mode), resolution(), "compute")
        unit = _guard_unit(result)
        assert unit is not None
        exec_start = (
            "ExecStart=/opt/egpu-setup/tool/bin/egpu-setup sleep-guard "
            f"--inhibit {mode} --inhibitor /usr/bin/systemd-inhibit --node /dev/nvidia-uvm\n"
        )
        assert exec_start in unit
        assert "egpu-setup-sleep-guard.service" in _enabled(result)


def test_guard_off_renders_and_enables_nothing() -> None:
    result = render_set(DEBIAN12_TB3_4090, profile(sleep_inhibit="off"), resolution(), "compute")
    assert _guard_unit(result) is None
    assert "egpu-setup-sleep-guard.service" not in _enabled(result)
    reload = next(c for c in result.commands if c.argv == ("systemctl", "daemon-reload"))
    assert not any("sleep-guard" in p for p in reload.after)


def test_guard_mode_outside_the_schema_is_refused_before_anything_renders() -> None:
    import pytest

    from egpu_setup.errors import UsageError

    with pytest.raises(UsageError, match=r"hotplug\.sleep_inhibit: 'sideways' is not one of"):
        render_set(DEBIAN12_TB3_4090, profile(sleep_inhibit="sideways"), resolution(), "compute")
