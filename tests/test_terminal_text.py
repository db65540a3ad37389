"""Text from the machine reaches a terminal only through egpu_setup/text.py's sanitizer.

Each case plants control characters in one field an attacker at the laptop (or whoever sent a
bundle or a report) controls, runs the real command, and checks that no raw control character
reached stdout or stderr while the field is still shown, escaped.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from egpu_setup.text import lines, plain

# ESC (a CSI that clears the screen, an OSC that retitles it), BEL, CR, VT, FF, NEL, DEL and a
# right-to-left override: each one changes what a terminal shows
EVIL = "x\x1b[2J\x1b]0;pwned\x07\ry\x0bz\x0c\x85\x7f\u202e"
SHOWN = "x\\x1b[2J\\x1b]0;pwned\\x07\\ry\\vz\\f\\x85\\x7f\\u202e"
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")
FIXTURES = Path(__file__).parent / "fixtures" / "hosts"
DOCTOR_DATA = Path(__file__).parent / "data" / "doctor"


def clean(text: str) -> bool:
    return RAW.search(text) is None


def test_plain_escapes_every_control_character_and_keeps_the_rest() -> None:
    assert plain(EVIL) == SHOWN
    assert plain(SHOWN) == SHOWN  # idempotent: a message escaped twice reads the same
    assert plain("RTX 4090 · ümlaut") == "RTX 4090 · ümlaut"
    assert plain("a\nb\tc") == "a\\nb\\tc"
    assert lines("one\x1b\ntwo") == "one\\x1b\ntwo"
    assert plain("\U000e0001") == "\\U000e0001"  # a tag character: not printable


def test_doctor_fix_line_escapes_a_bundle_file_name(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(FIXTURES / "tb3-rtx3090-ubuntu2204", bundle, symlinks=True)
    rules = bundle / "root/etc/udev/rules.d"
    rules.mkdir(parents=True, exist_ok=True)
    (rules / f"99-{EVIL}.rules").write_text((DOCTOR_DATA / "blanket-authorize.rules").read_text())
    res = run_cli("doctor", "--from", str(bundle))
    assert "thunderbolt-blanket-authorize-rule" in res.stdout, res.stdout + res.stderr
    assert clean(res.stdout) and clean(res.stderr)
    fix = res.stdout.split("fix: Remove the rule (", 1)[1]
    assert fix.startswith(f"/etc/udev/rules.d/99-{SHOWN}.rules)")


def test_eject_blocker_escapes_a_process_name(tmp_path: Path) -> None:
    from execute.test_eject import CHAIN, _process, fake_root

    root = fake_root(tmp_path)
    _process(root, 4242, EVIL, ["/dev/nvidia0"])
    res = run_cli("eject", "--yes", "--root", str(root))
    assert res.returncode == 5, res.stderr
    assert clean(res.stdout) and clean(res.stderr)
    assert f"pid 4242 ({SHOWN})" in res.stderr
    assert (root / CHAIN / "0000:3c:00.0/remove").read_text() == ""


def test_eject_plan_on_a_recording_escapes_the_enclosure_name(tmp_path: Path) -> None:
    from execute.test_eject import _process, fake_root

    root = fake_root(tmp_path)
    _process(root, 4242, EVIL, ["/dev/nvidia0"])
    res = run_cli("eject", "--root", str(root))  # no terminal, no --yes: blockers only
    assert clean(res.stdout) and clean(res.stderr)
    assert SHOWN in res.stderr


def test_verify_previous_run_step_is_escaped() -> None:
    from egpu_setup.verify.progress import parse_progress
    from egpu_setup.verify.report import render_check
    from egpu_setup.verify.session import previous_run_check

    log = "\n".join(
        json.dumps(e)
        for e in (
            {"event": "start", "time": 1.0, "options": {"device": "auto"}},
            {"event": "step", "step": EVIL, "time": 2.0, "pid": 7},
        )
    )
    previous = parse_progress(log)
    assert previous is not None and previous.step == EVIL
    shown = "\n".join(render_check(previous_run_check(previous)))
    assert clean(shown) and SHOWN in shown


def test_report_warning_about_a_hostile_file_name_is_escaped(tmp_path: Path) -> None:
    (tmp_path / f"verify-{EVIL}.json").write_text("{not json")
    (tmp_path / "verify-ok.json").write_text(
        json.dumps({"schema": "egpu-setup/verify/1", "ok": True, "hostname": "lab1"})
    )
    res = run_cli("report", str(tmp_path))
    assert clean(res.stdout) and clean(res.stderr)
    assert SHOWN in res.stderr + res.stdout


@pytest.mark.parametrize("field", ["message", "hint"])
def test_an_error_message_from_the_machine_is_escaped(field: str) -> None:
    from egpu_setup.cli import fail
    from egpu_setup.errors import UsageError

    exc = UsageError(EVIL, "h") if field == "message" else UsageError("m", EVIL)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        fail(exc)
    assert clean(err.getvalue()) and SHOWN in err.getvalue()
