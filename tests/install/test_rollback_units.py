"""rollback stops and disables the units it removes on the running system, before their files go.

systemd is not PID 1 here, so `systemctl` is a stand-in on host/process.SYSTEM_PATH that logs
its argv and which unit files exist when it is called (the order is what is checked), and
/run/systemd/system, which systemd makes at boot (sd_booted(3)), is a tmpfs directory. The rest
is real: install writes the health unit, its timer and the timer's wants/ link on the running
system (LiveHost) and rollback removes them, in a private mount namespace whose
/etc/systemd/system is a directory of the test, so this machine's own is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RunCli
from helpers import install_values as values

UNITS = "/etc/systemd/system"
TIMER, SERVICE = "egpu-setup-health.timer", "egpu-setup-health.service"
WANTS = f"{UNITS}/timers.target.wants/{TIMER}"

STANDIN = """#!/bin/sh
echo "systemctl $*" >> {log}
for a in "$@"; do
  case "$a" in *.timer|*.service) [ -e "/etc/systemd/system/$a" ] && echo "  present $a" >> {log};; esac
done
[ "$1" = stop ] && [ -e {log}.fail ] && {{ echo "Failed to stop egpu-setup-health.timer: Access denied" >&2; exit 1; }}
exit 0
"""

# In the namespace: the test's directories over /etc/systemd/system (and /run/systemd, with or
# without its `system`), the stand-in first on the gateway's PATH, then install and rollback.
SCENARIO = """
import json, subprocess, sys
units, run, bindir, booted, header = sys.argv[1:6]
subprocess.run(["mount", "--bind", units, "/etc/systemd/system"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run/systemd"], check=True)
if booted == "1":
    subprocess.run(["mkdir", "/run/systemd/system"], check=True)
import egpu_setup.host.process as p
p.SYSTEM_PATH = bindir + ":" + p.SYSTEM_PATH
from pathlib import Path
from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.host.machine import LiveHost
from egpu_setup.plan.steps import EnableUnit, Plan, WriteFile
from egpu_setup.state.lock import RunLock
from egpu_setup.state.paths import StatePaths
d = "/etc/systemd/system/"
steps = (
    WriteFile(d + "egpu-setup-health.service", header + "[Service]\\nType=oneshot\\n", 0o644,
              "test", "create", ""),
    WriteFile(d + "egpu-setup-health.timer", header + "[Timer]\\nOnUnitActiveSec=60\\n", 0o644,
              "test", "create", ""),
    EnableUnit("egpu-setup-health.timer", d + "egpu-setup-health.timer",
               (d + "timers.target.wants/egpu-setup-health.timer",)),
)
paths = StatePaths.for_root(Path("/"))
with RunLock(paths.lock):
    execute(Plan(steps), LiveHost(), paths, ExecOptions(), progress=lambda _t: None)
open(run + "/installed", "w").write("\\n".join(sorted(str(x) for x in Path(d).rglob("*"))))
open(bindir + "/systemctl.log", "w").close()  # what install ran is not what is checked
from egpu_setup.cli import main
main(["rollback", "--yes", "--json"])
"""


def _scenario(
    tmp_path: Path, booted: bool, stop_fails: bool = False
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private mount namespace needs root and unshare(1)")
    units, run, bindir = tmp_path / "units", tmp_path / "run", tmp_path / "bin"
    for d in (units, run, bindir):
        d.mkdir()
    (bindir / "systemctl").write_text(STANDIN.format(log=bindir / "systemctl.log"))
    (bindir / "systemctl").chmod(0o755)
    if stop_fails:
        (bindir / "systemctl.log.fail").touch()
    env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(tmp_path / "state")}
    argv = [
        sys.executable,
        "-c",
        SCENARIO,
        str(units),
        str(run),
        str(bindir),
        "1" if booted else "0",
    ]
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", *argv, values.HEADER],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    return proc, units, bindir / "systemctl.log"


def test_rollback_stops_and_disables_the_timer_and_its_service_before_removing_them(
    tmp_path: Path,
) -> None:
    proc, units, log = _scenario(tmp_path, booted=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = (tmp_path / "run/installed").read_text()
    assert TIMER in installed and WANTS.split("/")[-2] in installed  # install wrote them for real
    assert log.read_text().splitlines() == [
        f"systemctl stop -- {TIMER} {SERVICE}",  # the timer first: it would start the service
        f"  present {TIMER}",
        f"  present {SERVICE}",
        f"systemctl disable --no-reload -- {TIMER} {SERVICE}",
        f"  present {TIMER}",
        f"  present {SERVICE}",
        "systemctl daemon-reload",  # after the files went
    ]
    assert sorted(p.name for p in units.rglob("*")) == []  # files, link and wants/ gone
    commands = json.loads(proc.stdout)["commands"]
    assert [(c["argv"][:2], c["status"]) for c in commands] == [
        (["systemctl", "stop"], "done"),
        (["systemctl", "disable"], "done"),
    ]


def test_without_systemd_running_the_files_go_and_nothing_is_stopped(tmp_path: Path) -> None:
    proc, units, log = _scenario(tmp_path, booted=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stop" not in log.read_text() and "disable" not in log.read_text()
    assert sorted(p.name for p in units.rglob("*")) == []
    commands = json.loads(proc.stdout)["commands"]
    assert {c["status"] for c in commands} == {"not-run"}
    assert "systemd does not run this system" in commands[0]["detail"]


def test_under_root_only_the_files_go(tmp_path: Path) -> None:
    from egpu_setup.execute.executor import ExecOptions, execute
    from egpu_setup.host.machine import RootHost
    from egpu_setup.plan.steps import Plan, WriteFile
    from egpu_setup.rollback.core import RollbackOptions, plan_rollback, preview
    from egpu_setup.state.lock import RunLock
    from egpu_setup.state.paths import StatePaths

    root = tmp_path / "image"
    (root / UNITS.lstrip("/")).mkdir(parents=True)
    (root / "run/systemd/system").mkdir(parents=True)  # even an image that says systemd runs it
    host, paths = RootHost(root), StatePaths.for_root(root)
    step = WriteFile(f"{UNITS}/{TIMER}", values.HEADER + "[Timer]\n", 0o644, "t", "create", "")
    with RunLock(paths.lock):
        execute(Plan((step,)), host, paths, ExecOptions(), progress=lambda _t: None)
    plan = plan_rollback(RollbackOptions(yes=True, root_dir=str(root)))
    assert [u.path for u in plan.undo] == [f"{UNITS}/{TIMER}"]
    assert preview(plan).followups == ()


def test_a_stop_that_fails_is_said_the_files_still_go_and_rollback_exits_1(tmp_path: Path) -> None:
    proc, units, _log = _scenario(tmp_path, booted=True, stop_fails=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "Access denied" in proc.stderr  # said, with systemctl's own words
    assert sorted(p.name for p in units.rglob("*")) == []
    stop, disable, *_ = json.loads(proc.stdout)["commands"]
    assert stop["status"] == "failed" and "Access denied" in stop["detail"]
    assert disable["status"] == "done"


def test_doctor_takes_one_of_root_from_and_venv(cli: RunCli, tmp_path: Path) -> None:
    res = cli("doctor", "--root", str(tmp_path), "--from", str(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: --root diagnoses an image") and "\nhint: " in res.stderr
