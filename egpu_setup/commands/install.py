"""`egpu-setup install`: detect -> resolve -> render -> plan -> show, or execute under the lock."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from typing import Any

import click

from egpu_setup.commands._options import complete_profile, echo_json, from_option, json_option

log = logging.getLogger("egpu_setup.install")

EPILOG = """\b
Examples:
  egpu-setup install --profile rtx4090 --dry-run        # the plan and every file diff
  sudo egpu-setup install --profile rtx4090 --yes       # provision this laptop
  egpu-setup install --profile rtx4090 --only torch --cuda cpu --venv ~/torch-venv
  sudo egpu-setup install --profile lab.yaml --root /srv/image --from host-bundle/ --yes
  egpu-setup install --profile rtx4090 --dry-run --json | jq '.steps[].description'
  sudo egpu-setup install --bundle /media/usb/lab-bundle --yes   # offline, from `bundle`
\b
Exit codes: 0 done, 1 a step failed, 2 bad input, 3 done but reboot (run again after),
4 a person must act, 5 another run or the package manager holds a lock.
"""


@click.command(epilog=EPILOG)
@click.option(
    "--profile",
    "profile_name",
    shell_complete=complete_profile,
    default=None,
    help="Profile name or path to a YAML file (default with --bundle: the bundle's).",
)
@click.option(
    "--dry-run", is_flag=True, help="Show the resolution, every step and file diff; change nothing."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.option("--only", default=None, metavar="PARTS", help="Comma list of driver,torch,config.")
@click.option(
    "--venv", default=None, metavar="PATH", help="torch venv (default /opt/egpu-setup/venv)."
)
@click.option(
    "--torch",
    "torch_spec",
    default=None,
    metavar="SPEC",
    help="torch version, e.g. 2.9.1 or '>=2.8'.",
)
@click.option(
    "--cuda", default=None, metavar="VARIANT", help="torch variant: cu128, cu126, ... or cpu."
)
@click.option(
    "--driver-branch", type=int, default=None, metavar="N", help="NVIDIA driver branch, e.g. 550."
)
@click.option(
    "--mode",
    type=click.Choice(["compute", "display"]),
    default=None,
    help="Override the profile's mode.",
)
@click.option(
    "--index-url",
    default=None,
    metavar="URL",
    help="Lab mirror of the torch variant index (replaces it).",
)
@click.option(
    "--bundle",
    "bundle_dir",
    default=None,
    metavar="DIR",
    help="Install offline from a bundle written by `egpu-setup bundle`.",
)
@click.option(
    "--root", "root_dir", default=None, metavar="DIR", help="Install into the system image at DIR."
)
@from_option
@click.option(
    "--force", is_flag=True, help="Replace files edited since egpu-setup wrote them (backed up)."
)
@click.option(
    "--lock-timeout",
    type=click.IntRange(0, 86400),
    default=600,
    show_default=True,
    help="Seconds to wait for the package manager's lock.",
)
@click.option(
    "--verify/--no-verify",
    "run_verify",
    default=True,
    help="Run `verify --quick` after installing torch.",
)
def command(**kw: Any) -> None:
    """Provision this machine: NVIDIA driver, torch venv, hot-plug configuration.

    Shows the plan first (asks unless --yes); a second run changes nothing.
    `egpu-setup rollback` undoes the files; see README "What egpu-setup changes".
    """
    from egpu_setup.errors import EXIT_REBOOT

    run = prepare(**kw)
    if kw["dry_run"]:
        show(run, kw["as_json"])
        return
    rc = apply(run, kw)
    if rc:
        sys.exit(rc)
    if rc is None:
        sys.exit(EXIT_REBOOT)


@dataclasses.dataclass
class Prepared:
    facts: Any
    profile: Any
    resolution: Any
    rendered: Any
    plan: Any
    target: Any
    paths: Any
    plan_options: Any
    warnings: list[str]
    lock_holder: str | None


def _constraints(kw: dict[str, Any], profile: Any) -> Any:
    """The resolver's Constraints: the profile's, with our flags winning."""
    from egpu_setup.resolve.constraints import constraints_from_profile

    return constraints_from_profile(
        profile,
        torch_spec=kw["torch_spec"],
        cuda=kw["cuda"],
        driver_branch=kw["driver_branch"],
    )


def prepare(**kw: Any) -> Prepared:
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.errors import UsageError
    from egpu_setup.host.machine import LiveHost, RootHost, open_host
    from egpu_setup.plan.build import build_plan
    from egpu_setup.plan.options import DEFAULT_VENV, PlanOptions, parse_only
    from egpu_setup.profile.load import load_profile
    from egpu_setup.render.files import RenderSet, entry_point_path, render_set
    from egpu_setup.resolve.resolver import resolve
    from egpu_setup.state.journal import Journal
    from egpu_setup.state.lock import RunLock
    from egpu_setup.state.manifest import Manifest
    from egpu_setup.state.paths import StatePaths

    only = parse_only(kw["only"])
    bundle = _open_bundle(kw) if kw.get("bundle_dir") else None
    if not kw["profile_name"]:
        raise UsageError("--profile is required", "pass --profile NAME (or --bundle DIR)")
    if kw["from_dir"] and not kw["root_dir"] and not kw["dry_run"]:
        raise UsageError(
            "--from describes another machine: a real install there needs --root DIR",
            "add --dry-run to see the plan for that machine, or --root DIR to build an image",
        )
    if kw["index_url"]:
        from egpu_setup.plan.options import check_index_url

        check_index_url(kw["index_url"])
    profile = load_profile(kw["profile_name"])
    if kw["root_dir"]:
        target = RootHost(kw["root_dir"])
    elif kw["from_dir"]:
        target = open_host(kw["from_dir"])  # dry run against the recording's files
    else:
        target = LiveHost()
    facts_host = open_host(kw["from_dir"]) if kw["from_dir"] else target
    facts = detect_host(facts_host)
    _refuse_non_nvidia_egpu(facts)
    warnings: list[str] = []
    if facts.os.wsl:
        # The Windows host owns the driver and the device: nothing to render or apt-install.
        if only - {"torch"}:
            warnings.append("WSL2: the Windows driver serves the GPU; planning the torch part only")
        only = only & frozenset({"torch"})
    external = [g.pci_address for g in facts.nvidia_gpus if g.external]
    if len(external) > 1:
        warnings.append(
            f"{len(external)} external NVIDIA GPUs ({', '.join(external)}): the rules match them "
            "by device id; pin hotplug.enclosure_unique_id to say which enclosure to authorize"
        )
    elif facts.egpu is None and len(facts.nvidia_gpus) != 1:
        warnings.append(
            f"no external NVIDIA GPU detected: planning for the profile's GPU ({profile.gpu.name})"
        )
    resolution = resolve(facts, profile, _constraints(kw, profile))
    bundle_source = None
    if bundle is not None:
        resolution, bundle_source = _from_bundle(bundle, kw, resolution, only, target)
    mode = kw["mode"] or profile.mode
    venv = os.path.abspath(os.path.expanduser(kw["venv"])) if kw["venv"] else DEFAULT_VENV
    if only & {"driver", "config"}:
        rset = render_set(
            facts,
            profile,
            resolution,
            mode,
            venv=venv,
            tool_path=entry_point_path(sys.argv[0]),
            bolt_available=_bolt_usable(target),
        )
    else:
        rset = RenderSet(files=(), commands=(), notes=())
    paths = StatePaths.for_root(target.root)
    try:
        manifest = Manifest.load(paths)
    except PermissionError:
        manifest = Manifest(paths)
        warnings.append(f"cannot read {paths.manifest} (not root): edits to our files not checked")
    last = Journal(paths).last_run() if os.access(paths.state_dir, os.R_OK) else None
    pending = None
    if last is not None and last.status == "reboot" and target.kind == "live":
        from egpu_setup.execute.executor import boot_id

        if last.boot_id and last.boot_id == boot_id(target):
            pending = "the previous run installed changes that need a reboot"
    sudo_uid = target.getenv("SUDO_UID")
    options = PlanOptions(
        only=only,
        venv=venv,
        index_url=kw["index_url"],
        force=kw["force"],
        apt_lock_timeout=kw["lock_timeout"],
        # A recording is planned as the live machine it describes (it can never execute).
        target="root" if target.kind == "root" else "live",
        pending_reboot=pending,
        sudo_user=target.getenv("SUDO_USER"),
        sudo_uid=int(sudo_uid) if sudo_uid and sudo_uid.isdigit() else None,
        bundle=bundle_source,
    )
    plan = build_plan(
        facts, profile, resolution, rset.files, target, options, manifest, rset.commands, rset.links
    )
    holder = RunLock(paths.lock).holder()
    if holder:
        warnings.append(f"another run is in progress ({holder}): this plan may already be stale")
    warnings += list(getattr(resolution, "warnings", ())) + list(plan.warnings) + list(rset.notes)
    return Prepared(
        facts, profile, resolution, rset.files, plan, target, paths, options, warnings, holder
    )


def _bolt_usable(target: Any) -> bool | None:
    """Whether `boltctl enroll` can authorize the enclosure; else the one-UUID udev rule does.

    An image (--root) cannot enroll: boltd is not running in a chroot, so the rule it carries
    must authorize the enclosure on first boot, bolt or not. A recording cannot say (None:
    inferred from its facts)."""
    if target.kind == "root":
        return False
    if target.kind == "recorded":
        return None
    return target.which("boltctl") is not None


def _refuse_non_nvidia_egpu(facts: Any) -> None:
    """CUDA needs NVIDIA: an AMD or Intel eGPU alone is outside what egpu-setup provisions."""
    from egpu_setup.errors import UnsupportedHardware

    if facts.nvidia_gpus:
        return
    other = [g for g in facts.gpus if g.external]
    if other:
        g = other[0]
        what = g.name or ":".join(i for i in (g.vendor_id, g.device_id) if i)
        raise UnsupportedHardware(
            f"the external GPU at {g.pci_address} ({what}) is {g.vendor or 'not NVIDIA'}: "
            "egpu-setup provisions NVIDIA GPUs for CUDA",
            "connect an NVIDIA eGPU and run again (`egpu-setup detect` shows what is seen)",
        )


def _open_bundle(kw: dict[str, Any]) -> Any:
    """The bundle's manifest; its profile becomes the default; flags it decides are refused."""
    from pathlib import Path

    from egpu_setup.bundle.format import PROFILE_FILE, load_manifest
    from egpu_setup.errors import UsageError

    clash = [f for f, k in (("--index-url", "index_url"), ("--torch", "torch_spec"),
                            ("--cuda", "cuda")) if kw[k]]  # fmt: skip
    if clash:
        raise UsageError(
            f"{clash[0]} cannot be combined with --bundle: the bundle fixes what is installed",
            f"pass {clash[0]} to `egpu-setup bundle` when building it",
        )
    path = Path(kw["bundle_dir"]).resolve()
    if not path.is_dir():
        raise UsageError(f"--bundle {kw['bundle_dir']}: no such directory", "pass a bundle DIR")
    manifest = load_manifest(path)
    if not kw["profile_name"]:
        kw["profile_name"] = str(path / PROFILE_FILE)
    return manifest


def _from_bundle(
    manifest: Any, kw: dict[str, Any], resolution: Any, only: frozenset[str], target: Any
) -> tuple[Any, Any]:
    """This machine's target in the bundle, its files verified; the resolution narrowed to it."""
    from egpu_setup.bundle.format import find_target, repository_files, verify_files
    from egpu_setup.errors import UsageError
    from egpu_setup.plan.options import BundleSource
    from egpu_setup.resolve.resolution import TorchPlan

    directory = manifest.path.parent
    wants_torch = "torch" in only and resolution.torch is not None
    wants_driver = "driver" in only and resolution.driver.action in ("install", "upgrade")
    distro = resolution.archive or resolution.distro
    entry = find_target(
        manifest, resolution.python if wants_torch else None, distro if wants_driver else None
    )
    torch, driver = entry.get("torch"), entry.get("driver")
    for wanted, part, name in ((wants_torch, torch, "torch"), (wants_driver, driver, "driver")):
        if wanted and not part:
            raise UsageError(
                f"bundle {directory} target {entry['name']} has no {name} part",
                f"rebuild it with `egpu-setup bundle` including {name}, or pass --only",
            )
    if wants_torch and target.kind != "live":
        raise UsageError(
            "--bundle with --root installs the driver and configuration; torch into an image "
            "from a bundle is not supported",
            "pass --only driver,config (install torch on the running machine)",
        )
    prefixes = []
    if wants_torch:
        prefixes += [torch["wheels"], torch["requirements_file"]]
    if wants_driver:
        prefixes.append(driver["repository"])
    checked = verify_files(directory, manifest, prefixes)
    log.warning("bundle %s: %s verified (%.1f MB)", directory, entry["name"], checked / 1e6)
    if wants_torch:
        resolution = dataclasses.replace(
            resolution,
            torch=TorchPlan(
                torch["version"], torch["variant"], torch["index_url"], tuple(torch["requirements"])
            ),
        )
    if wants_driver:
        resolution = dataclasses.replace(
            resolution,
            driver=dataclasses.replace(resolution.driver, packages=tuple(driver["packages"])),
        )
    packages = manifest.files().get(f"{driver['repository']}/Packages") if driver else None
    source = BundleSource(
        directory=str(directory),
        target=entry["name"],
        distro=entry["distro"] if wants_driver else None,
        find_links=str(directory / torch["wheels"]) if wants_torch else None,
        requirements_file=str(directory / torch["requirements_file"]) if wants_torch else None,
        repository=str(directory / driver["repository"]) if wants_driver else None,
        packages_sha256=packages["sha256"] if packages else None,
        repository_sha256=repository_files(manifest, driver["repository"]) if wants_driver else (),
    )
    return resolution, source


def show(run: Prepared, as_json: bool) -> None:
    if as_json:
        data = dict(run.resolution.to_json())
        data["steps"] = run.plan.to_json()
        data["plan_warnings"] = run.warnings
        echo_json(data)
        return
    for w in run.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(_resolution_lines(run.resolution))
    if run.plan.empty:
        click.echo("Nothing to do: this machine already matches the profile.")
        return
    n = len(run.plan.steps)
    click.echo(f"Plan ({n} step{'' if n == 1 else 's'}):")
    for i, step in enumerate(run.plan.steps, 1):
        click.echo(f"  {i:2d}. [{step.part_name}] {step.describe()}")
    for step in run.plan.steps:
        diff = getattr(step, "diff", "")
        if diff:
            click.echo("")
            click.echo(diff.rstrip("\n"))


def _resolution_lines(res: Any) -> str:
    d, t = res.driver, res.torch
    gpu = res.gpu
    ids = ", ".join(x for x in (gpu.pci_id, gpu.architecture) if x) if gpu else ""
    lines = [
        f"GPU:    {gpu.name} ({ids}, sm {gpu.compute_capability})"
        if gpu
        else "GPU:    none resolved",
        "driver: "
        + " ".join(str(x) for x in (d.action, d.branch, d.flavour) if x)
        + f" via {d.source}"
        + (f" (installed {d.installed})" if d.installed else ""),
        f"torch:  {t.version} {t.variant} from {t.index_url}" if t else "torch:  -",
        f"python: {res.python}",
    ]
    lines += [f"  - {r}" for r in getattr(res, "reasons", ())]
    return "\n".join(lines)


def apply(run: Prepared, kw: dict[str, Any]) -> int | None:
    """Execute under the lock; 0 done, None reboot needed (exit 3)."""
    from egpu_setup.errors import EXIT_FAILED, EgpuSetupError
    from egpu_setup.execute.executor import ExecOptions, execute
    from egpu_setup.install.preflight import preflight
    from egpu_setup.state.lock import RunLock

    preflight(run.plan, run.target, run.paths, run.facts, run.plan_options)
    with RunLock(run.paths.lock):
        # plan again under the lock: another run may have finished meanwhile
        run = prepare(**{**kw, "dry_run": False})
        for w in run.warnings:
            if "stale" not in w:
                click.echo(f"warning: {w}", err=True)
        if run.plan.empty:
            _summary(kw, run, None, "Nothing to do: this machine already matches the profile.")
            return 0
        if run.plan.consent_steps and kw["yes"]:
            from egpu_setup.errors import UsageError

            what = ", ".join(" ".join(s.argv) for s in run.plan.consent_steps)
            raise UsageError(
                f"the plan changes the boot configuration ({what}): --yes cannot consent to that",
                "run without --yes and confirm the plan, or run those commands yourself",
            )
        if not kw["yes"]:
            show(run, as_json=False)
            if not sys.stdin.isatty():
                from egpu_setup.errors import UsageError

                raise UsageError("confirmation needed and stdin is not a terminal", "pass --yes")
            click.confirm("Apply this plan?", abort=True, err=True)
        installer = os.environ.get("EGPU_SETUP_INSTALLER", "auto")
        started = time.time()
        try:
            result = execute(
                run.plan,
                run.target,
                run.paths,
                ExecOptions.from_env(installer=installer, force=kw["force"]),
            )
        except EgpuSetupError as exc:
            _save_report(run, started, None, None, exc)
            raise
    driver_done = any(s.kind == "apt-install" and s.status == "done" for s in result.steps)
    from egpu_setup.install.preflight import builds_dkms_module, require_enrolled_key

    dkms = driver_done and builds_dkms_module(run.plan)
    if dkms and run.facts.os.secure_boot and run.target.kind == "live":
        try:
            require_enrolled_key(run.target)
        except EgpuSetupError as exc:
            _save_report(run, started, result, None, exc)
            raise
    verify = None
    torch_done = any(s.kind == "pip-install" and s.status == "done" for s in result.steps)
    if kw["run_verify"] and torch_done and not result.reboot_required and run.target.kind == "live":
        verify = _verify(run.plan_options.venv)
    _save_report(run, started, result, verify, None)
    _summary(kw, run, result, None, verify)
    if verify is not None and not verify.get("ok"):
        return EXIT_FAILED  # installed, but the eGPU does not train: that is a failed install
    return None if result.reboot_required else 0


def _save_report(run: Prepared, started: float, result: Any, verify: Any, error: Any) -> None:
    """<state>/reports/install-<time>.json, on success and on failure, for `egpu-setup report`."""
    from egpu_setup.errors import EXIT_FAILED, EXIT_REBOOT
    from egpu_setup.state.reports import save_report

    steps = [s.to_json() for s in result.steps] if result else []
    torch = run.resolution.torch.version if run.resolution.torch else None
    ok = error is None and (verify is None or bool(verify.get("ok")))
    data = {
        "schema": "egpu-setup/install/1",
        "ok": ok,
        "exit_code": error.exit_code
        if error
        else EXIT_FAILED
        if not ok
        else (EXIT_REBOOT if result and result.reboot_required else 0),
        "changed": sum(1 for s in steps if s.get("status") == "done"),
        "reboot_required": result.reboot_required if result else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "profile": run.profile.name,
        "host": run.facts.fleet_summary(
            run.facts.egpu, hostname=run.target.read_attr("/proc/sys/kernel/hostname"), torch=torch
        ),
        "resolution": run.resolution.to_json(),
        "steps": steps,
        "verify_ok": verify.get("ok") if verify else None,
        "error": {"message": error.message, "hint": error.hint} if error else None,
    }
    try:
        path = save_report(run.paths.state_dir, "install", data, started)
    except OSError as exc:  # the report must never turn a good install into a failure
        log.warning("could not save the install report: %s", exc)
        return
    log.info("report: %s", path)


def _verify(venv: str) -> dict[str, Any] | None:
    """`egpu-setup verify --quick --json` in a child process (a hung GPU cannot hang us)."""
    import json

    from egpu_setup.errors import EgpuSetupError
    from egpu_setup.host.machine import LiveHost

    argv = [sys.executable, "-m", "egpu_setup", "verify", "--quick", "--json", "--venv", venv]
    try:
        res = LiveHost().run(argv, timeout=300)
    except EgpuSetupError as exc:  # verify's failure is reported, it does not undo the install
        log.warning("verify did not run: %s", exc.message)
        return None
    try:
        return json.loads(res.out)
    except ValueError:
        log.warning("verify printed no JSON (exit %s): %s", res.rc, res.err.strip()[-300:])
        return None


def _summary(
    kw: dict[str, Any], run: Prepared, result: Any, message: str | None, verify: Any = None
) -> None:
    if kw["as_json"]:
        data = dict(run.resolution.to_json())
        data["steps"] = run.plan.to_json()
        data["result"] = {
            "run": result.run_id if result else None,
            "steps": [s.to_json() for s in result.steps] if result else [],
            "reboot_required": result.reboot_required if result else None,
            "resumed_from": result.resumed_from if result else None,
            "verify": verify,
        }
        echo_json(data)
        return
    if message:
        click.echo(message)
        return
    changed = sum(1 for s in result.steps if s.status == "done")
    simulated = sum(1 for s in result.steps if s.status == "simulated")
    skipped = sum(1 for s in result.steps if s.status == "skipped")
    click.echo(
        f"Done: {changed} changed, {simulated} simulated, {skipped} skipped (run {result.run_id})."
    )
    for s in result.steps:
        if s.detail:
            click.echo(f"  {s.index + 1}. {s.status}: {s.detail}")
    if verify is not None:
        click.echo(f"verify: {'ok' if verify.get('ok') else 'FAILED'}")
    if result.reboot_required:
        click.echo(f"Reboot needed: {result.reboot_required}. Then run the same command again.")
