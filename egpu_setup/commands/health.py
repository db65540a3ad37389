"""`egpu-setup health sample`: one reading of the eGPU while people train (the timer's job)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from egpu_setup.commands._options import echo_json, from_option, json_option
from egpu_setup.text import plain

# profile.schema.json expect.max_temp_c: the same bounds, so the unit renders only what a
# profile may say
_TEMP = click.FloatRange(40, 110)


@click.group(
    "health",
    epilog="""\b
Examples:
  sudo egpu-setup health sample                  # what egpu-setup-health.timer runs
  egpu-setup health sample --from bug-report/ --json
""",
)
def command() -> None:
    """The eGPU's temperature, power, throttling, PCIe link and Xid events, sampled by a timer."""


@command.command(
    "sample",
    epilog="""\b
Examples:
  sudo egpu-setup health sample --max-temp-c 88
  egpu-setup health sample --from bug-report/ --json   # the sample a recording gives, kept nowhere
""",
)
@click.option(
    "--max-temp-c",
    type=_TEMP,
    default=None,
    help="The profile's temperature limit (expect.max_temp_c), kept with the samples for "
    "`egpu-setup report`.",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.IntRange(10, 3600),
    default=60,
    show_default=True,
    help="Seconds between the timer's samples: a gap longer than two is not counted as throttled.",
)
@from_option
@json_option
def sample(max_temp_c: float | None, interval_s: int, from_dir: str | None, as_json: bool) -> None:
    """Read nvidia-smi and the kernel log once and fold the result into
    /var/lib/egpu-setup/health.json (bounded: daily summaries, the newest readings).

    Exits 0 and keeps nothing when no NVIDIA GPU answers (the eGPU is unplugged) and the
    kernel logged no new Xid.
    """
    from egpu_setup.detect.health import probe_health
    from egpu_setup.execute.health import fold_sample, load_health, save_health
    from egpu_setup.host.identity import machine_id_sha256
    from egpu_setup.host.machine import open_host
    from egpu_setup.state.paths import StatePaths
    from egpu_setup.state.reports import current_boot_id

    host = open_host(from_dir)
    probe = probe_health(host)
    paths = StatePaths.for_root(Path("/"))
    previous = None if from_dir is not None else load_health(paths.state_dir)
    doc = fold_sample(
        previous,
        probe,
        now=time.time(),
        boot_id=None if from_dir is not None else current_boot_id(),
        limit_c=max_temp_c,
        interval_s=interval_s,
        machine_id=machine_id_sha256(host),
    )
    if doc is not None and from_dir is None:
        save_health(paths.state_dir, paths.anchor, doc)
    if as_json:
        echo_json({"schema": "egpu-setup/health-sample/1", "kept": doc})
    elif doc is None:
        click.echo("no NVIDIA GPU answered and no new Xid: nothing kept")
    else:
        for r in probe.readings:
            click.echo(
                f"{plain(r.pci_bus_id or '?')}: {_n(r.temperature_c)} C, {_n(r.power_w)} W, link "
                f"gen {_n(r.link_gen)} x{_n(r.link_width)}, throttled: "
                f"{', '.join(r.throttle) or 'no'}"
            )
        if probe.error:
            click.echo(f"nvidia-smi: {plain(probe.error)}")


def _n(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"
