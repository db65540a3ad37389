"""Rollback acts only on paths egpu-setup writes (execute/undo.py owned_path): every path the
lab-image steps write must be one of them, or rollback of an image refuses it."""

from __future__ import annotations

from egpu_setup.detect.dpkg_status import HOLD_PIN, HOLD_UNATTENDED
from egpu_setup.execute.undo import owned_path
from egpu_setup.host.identity import MACHINE_ID
from egpu_setup.image.additions import DBUS_MACHINE_ID, DEBIAN_PERSISTENCED, PROFILES_DIR
from egpu_setup.image.tool import TOOL_LINK
from egpu_setup.state.verify_marker import FIRSTBOOT_MARKER


def test_every_path_an_image_step_writes_is_one_rollback_may_undo() -> None:
    written = [
        FIRSTBOOT_MARKER,
        f"{PROFILES_DIR}/lab-rtx3080.yaml",
        TOOL_LINK,
        DEBIAN_PERSISTENCED,
        MACHINE_ID,
        DBUS_MACHINE_ID,
    ]
    assert [p for p in written if not owned_path(p)] == []
    # and only those: a neighbour of each is not egpu-setup's
    for neighbour in (
        "/etc/hostname",
        "/var/lib/dbus/other",
        "/usr/local/bin/python3",
        f"{PROFILES_DIR}/sub/x.yaml",
        "/etc/systemd/system/ssh.service",
    ):
        assert not owned_path(neighbour), neighbour


def test_every_file_render_writes_is_one_rollback_may_undo() -> None:
    """Each file of every golden render (tests/golden/{render,hold}/<case>/, at its host path) is a
    path rollback may remove: a new drop-in left out of execute/undo.py's lists is refused by
    rollback and stays on the machine (the kernels hook once was)."""
    from pathlib import Path

    golden = Path(__file__).parents[1] / "golden"
    written = {
        "/" + p.relative_to(case).as_posix()
        for kind in ("render", "hold")  # hold: the driver hold's drop-ins (render/hold.py)
        for case in (golden / kind).iterdir()
        if case.is_dir()
        for p in case.rglob("*")
        if p.is_file() and not p.name.startswith("_")
    }
    assert "/etc/apt/apt.conf.d/99egpu-setup-kernels" in written
    assert {HOLD_PIN, HOLD_UNATTENDED} <= written
    assert sorted(p for p in written if not owned_path(p)) == []
