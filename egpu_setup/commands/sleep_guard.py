"""`egpu-setup sleep-guard`: hold sleep off while a CUDA process uses the eGPU (its unit's job)."""

from __future__ import annotations

import click

from egpu_setup.install.sleep_guard import DEFAULT_INTERVAL_S


@click.command(
    "sleep-guard",
    epilog="""\b
Examples:
  sudo egpu-setup sleep-guard                  # what egpu-setup-sleep-guard.service runs
  sudo egpu-setup sleep-guard --inhibit delay  # only hold a sleep back for InhibitDelayMaxSec
  systemd-inhibit --list                       # the lock, naming each CUDA process
""",
)
@click.option(
    "--inhibit",
    "mode",
    default="block",
    show_default=True,
    help="block: refuse a requested sleep while CUDA runs on the eGPU; delay: hold it back for "
    "logind's InhibitDelayMaxSec only (the profile's hotplug.sleep_inhibit).",
)
@click.option(
    "--inhibitor",
    default=None,
    help="The systemd-inhibit that holds the lock, an absolute path (default: data/sleep.yaml's, "
    "/usr/bin/systemd-inhibit).",
)
@click.option(
    "--node",
    default=None,
    help="The device node every CUDA process holds, an absolute path (default: data/sleep.yaml's, "
    "/dev/nvidia-uvm).",
)
@click.option(
    "--interval",
    type=float,
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds between looks at the processes holding the node.",
)
@click.option(
    "--hold",
    is_flag=True,
    hidden=True,
    help="Run under the inhibitor: exit once the processes holding the node are no longer PIDS.",
)
@click.option("--guard", hidden=True, help="With --hold: the guard's PID:START.")
@click.argument("pids", nargs=-1, type=click.IntRange(1))
def command(
    mode: str,
    inhibitor: str | None,
    node: str | None,
    interval: float,
    hold: bool,
    guard: str | None,
    pids: tuple[int, ...],
) -> None:
    """While a process holds the CUDA node of the eGPU, hold a logind sleep inhibitor lock
    whose reason names each one (PID, command, user); let go when the last one ends.

    Runs until stopped. Exits 2 on a bad option, before it starts anything.
    """
    from egpu_setup.host.machine import open_host
    from egpu_setup.install import sleep_guard
    from egpu_setup.render.sleep import load_sleep_data

    data = load_sleep_data()
    node = node or data.cuda_node
    if hold:
        sleep_guard.check_node(node, interval)
        served = sleep_guard.parse_guard(guard or "")
        sleep_guard.hold(open_host(), node, interval, served, pids)
        return
    if pids:
        raise click.UsageError("PIDS go with --hold only")
    config = sleep_guard.check_config(inhibitor or data.inhibitor, node, mode, interval)
    sleep_guard.run_guard(open_host(), config)
