"""A stand-in for the egpu-setup executable on a host the Ansible role provisions.

What it stands in for is the one thing this machine cannot do: install a driver that needs a
reboot and then boot into it. Everything else is the real tool, run by this script:

- `detect` is the real `egpu-setup detect` of a recorded real machine (`--from DIR`), so the
  role sees an external NVIDIA GPU and does not skip the host;
- `install` is the real `egpu-setup install ... --root ROOT --from DIR` into a per-host folder
  (its JSON, its report, moved from build-reports/ to ROOT/var/lib/egpu-setup/reports as a
  live run files it, its idempotence are real); the
  stand-in then answers exit 3 ("done, reboot required", docs/design.md) while the host has not booted
  since it asked for a reboot, as the real tool does from its journal's boot id;
- `verify` is the real `egpu-setup verify` (the role passes `--device cpu`);
- `standin-boot` is the test's reboot: it writes a new boot id, as booting does.

Usage: tool_standin.py CONFIG.json ARGS...  (a wrapper at the role's egpu_setup_bin adds CONFIG).
CONFIG: {"tool": argv of the real egpu-setup, "from": recorded host, "root": per-host folder,
"state": file for the stand-in's memory, "boot": boot-id file, "log": calls.jsonl,
"reboots_needed": boots the install asks for before it converges, "fail": an error message to
fail every install with (exit 1), or null}. Every call is logged as one JSON line, with the CPU
seconds the stand-in and the real tool spent (`cpu`): the host's share, not the controller's.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

EXIT_FAILED, EXIT_REBOOT = 1, 3


def _real(cfg: dict[str, Any], args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cfg["tool"], *args], capture_output=True, text=True, check=False)


def _install(cfg: dict[str, Any], args: list[str], boot: str) -> tuple[int, str, str]:
    if cfg.get("fail"):
        return EXIT_FAILED, "", f"error: {cfg['fail']}\nhint: see the install report\n"
    proc = _real(cfg, [*args, "--root", cfg["root"], "--from", cfg["from"]])
    _as_a_laptops(Path(cfg["root"]))
    if "--dry-run" in args or proc.returncode != 0:
        return proc.returncode, proc.stdout, proc.stderr
    state_file = Path(cfg["state"])
    state = json.loads(state_file.read_text()) if state_file.exists() else {"asked_in": []}
    asked_in: list[str] = state["asked_in"]
    if boot in asked_in:
        reason = "the previous run installed changes that need a reboot"
    elif len(asked_in) < cfg["reboots_needed"]:
        reason = "the new NVIDIA kernel module loads at the next boot"
        asked_in.append(boot)
        state_file.write_text(json.dumps(state))
    else:
        return proc.returncode, proc.stdout, proc.stderr
    out = json.loads(proc.stdout)
    out["result"]["reboot_required"] = reason
    _mark_report(Path(cfg["root"]), reason)
    return EXIT_REBOOT, json.dumps(out), proc.stderr + f"Reboot needed: {reason}.\n"


def _as_a_laptops(root: Path) -> None:
    """The laptop's install is a live one, so its report is a machine's (reports/); the real
    tool files a run under --root, which the stand-in needs, as an image build's
    (build-reports/, never collected as a machine's)."""
    state = root / "var/lib/egpu-setup"
    for report in sorted((state / "build-reports").glob("install-*.json")):
        (state / "reports").mkdir(exist_ok=True)
        # never over an older one: two runs within one second share a name (state/reports.py)
        target, n = state / "reports" / report.name, 1
        while target.exists():
            n += 1
            target = target.with_name(f"{report.stem}-{n}.json")
        report.rename(target)


def _mark_report(root: Path, reason: str) -> None:
    """The install report the real run just saved says what this run answered (exit 3)."""
    reports = sorted((root / "var/lib/egpu-setup/reports").glob("install-*.json"))
    if reports:
        data = json.loads(reports[-1].read_text())
        data.update(exit_code=EXIT_REBOOT, reboot_required=reason)
        reports[-1].write_text(json.dumps(data, indent=2))


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    args = argv[1:]
    boot_file = Path(cfg["boot"])
    boot = boot_file.read_text().strip()
    command = next((a for a in args if not a.startswith("-")), "")
    if command == "standin-boot":
        boot = f"boot-{int(boot.removeprefix('boot-')) + 1}"
        boot_file.write_text(boot + "\n")
        rc, out, err = 0, "", ""
    elif command == "install":
        rc, out, err = _install(cfg, args, boot)
    elif command == "detect":
        proc = _real(cfg, [*args, "--from", cfg["from"]])
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        proc = _real(cfg, args)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    with Path(cfg["log"]).open("a") as log:
        cpu = sum(
            u.ru_utime + u.ru_stime
            for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        )
        log.write(json.dumps({"argv": args, "rc": rc, "boot": boot, "cpu": cpu}) + "\n")
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
