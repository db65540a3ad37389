"""`egpu-setup matrix show|update`: the compatibility data, its age, a refresh from the index."""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any

import click

from egpu_setup.commands._options import (
    echo_json,
    index_url_option,
    json_option,
    profile_option,
)


@click.group(
    epilog="""\b
Examples:
  egpu-setup matrix show
  egpu-setup matrix show --json | jq '.torch[0]'
  egpu-setup matrix update
  egpu-setup matrix update --index-url https://mirror.lab.example/whl/
  egpu-setup matrix update --profile lab.yaml      # what `--matrix updated` would change
"""
)
def command() -> None:
    """Show or update the driver/CUDA/torch compatibility data."""


@command.command(
    "show",
    epilog="""\b
Examples:
  egpu-setup matrix show
  egpu-setup matrix show --json
""",
)
@json_option
def show(as_json: bool) -> None:
    """Print the matrix: torch releases and variants, driver floors, distros, and its age."""
    from egpu_setup.compat.matrix import load_matrix
    from egpu_setup.compat.overlay import overlay_path, state_dir

    m = load_matrix()
    data = matrix_json(m, str(overlay_path()), str(state_dir()))
    if as_json:
        echo_json(data)
        return
    click.echo(format_matrix(data))


@command.command(
    "update",
    epilog="""\b
Examples:
  egpu-setup matrix update
  EGPU_SETUP_STATE_DIR=~/.cache/egpu-setup egpu-setup matrix update
  egpu-setup matrix update --index-url http://127.0.0.1:8000/whl/ --json
  egpu-setup matrix update --profile rtx4090 --profile lab.yaml
""",
)
@json_option
@index_url_option(
    "PyTorch wheel index root (default: the official one; env EGPU_SETUP_TORCH_INDEX)."
)
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Read timeout, s.")
@click.option("--retries", type=click.IntRange(0, 10), default=3, show_default=True)
@profile_option(
    "Show the drift for this profile on this machine (repeatable; default: no profile).",
    "profiles",
    multiple=True,
    metavar="NAME",
)
def update(
    as_json: bool,
    index_url: str | None,
    timeout: float,
    retries: int,
    profiles: tuple[str, ...],
) -> None:
    """Refresh the torch rows from the PyTorch wheel index (validated before anything changes).

    Installs keep deciding with the shipped snapshot, the same on every machine; the refreshed
    data decides only for `install/resolve/bundle --matrix updated`. What that would change on
    this machine (for each --profile) is printed as the drift; a profile's pins never drift.
    """
    from egpu_setup.compat.fetch import update_matrix
    from egpu_setup.log import get_logger

    log = get_logger("egpu_setup.matrix")
    if profiles:  # a bad profile is bad input: refused before the network is touched
        from egpu_setup.profile.load import load_profile

        loaded = [load_profile(p) for p in profiles]
    else:
        loaded = []
    log.info("reading the PyTorch wheel index ...")
    result = update_matrix(index_url=index_url, timeout=(5.0, timeout), retries=retries)
    drifts = _drifts(loaded)
    if as_json:
        echo_json(
            {
                "schema": "egpu-setup/matrix-update/1",
                **result.__dict__,
                "drift": [d.to_json() for d in drifts],
            }
        )
        return
    verb = "unchanged (HTTP 304)" if result.status == "not-modified" else "updated"
    click.echo(f"matrix {verb}: {result.versions} torch releases from {result.url}")
    if result.new_versions:
        click.echo(f"new releases: {', '.join(result.new_versions)}")
    for change in result.changes:
        click.echo(f"  {change}")
    click.echo(f"cached in {result.path}")
    click.echo(
        "installs still decide with the shipped snapshot; with --matrix updated they would "
        "choose (this machine):"
    )
    for d in drifts:
        click.echo(f"  {d.text()}")


def _drifts(profiles: list[Any]) -> list[Any]:
    """The drift of this machine, with each profile (or none), between the two matrices."""
    from egpu_setup.compat.matrix import select_matrix
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.host.machine import LiveHost
    from egpu_setup.resolve.constraints import constraints_from_profile
    from egpu_setup.resolve.drift import drift

    facts = detect_host(LiveHost())
    shipped, updated = select_matrix("shipped"), select_matrix("updated")
    return [
        drift(
            p.name if p is not None else "no profile",
            facts,
            p,
            constraints_from_profile(p),
            shipped,
            updated,
        )
        for p in (profiles or [None])
    ]


def _age_days(day: str | None) -> int | None:
    if not day:
        return None
    try:
        then = date.fromisoformat(day[:10])
    except ValueError:
        return None
    return (datetime.now(timezone.utc).date() - then).days


def matrix_json(m: Any, overlay_file: str, state: str) -> dict[str, Any]:
    """The matrix as JSON (schema egpu-setup/matrix/1), with the data's age."""
    return {
        "schema": "egpu-setup/matrix/1",
        "snapshot": m.snapshot,
        "snapshot_age_days": _age_days(m.snapshot),
        "overlay": None
        if m.overlay is None
        else {
            "fetched_at": m.overlay.fetched_at,
            "age_days": _age_days(m.overlay.fetched_at),
            "index_url": m.overlay.index_url,
            "versions": m.overlay.versions,
            "path": overlay_file,
        },
        "state_dir": state,
        "notes": list(m.notes),
        "torch": [
            {
                "version": t.version,
                "released": t.released,
                "python": list(t.python),
                "index_only_python": list(t.index_only_python),
                "pypi_default": t.pypi_default,
                "variants": [
                    {
                        "name": v.name,
                        "status": v.status,
                        "arch": str(v.arch) if v.arch else None,
                        "python": list(v.python) if v.python is not None else None,
                        "source": v.source,
                    }
                    for v in t.variants
                ],
                "source": t.source,
            }
            for t in m.torch
        ],
        "cuda": [
            {
                "variant": c.variant,
                "cuda": c.cuda,
                "min_driver": str(c.min_driver),
                "min_driver_windows": str(c.min_driver_windows),
                "source": c.source,
            }
            for c in m.cuda
        ],
        "architectures": [
            {
                "name": a.name,
                "compute_capability": [str(a.cc_min), str(a.cc_max)],
                "first_driver": str(a.first_driver) if a.first_driver else None,
                "last_branch": a.last_branch,
                "open_modules": a.open_modules,
                "needs_open": a.needs_open,
                "source": a.source,
            }
            for a in m.architectures
        ],
        "distros": [
            {
                "distro": d.label,
                "codename": d.codename,
                "python": d.python,
                "branches": [b.branch for b in d.branches],
                "recommended_branch": d.recommended_branch,
                "nvidia_repo": d.nvidia_repo,
                "source": d.source,
            }
            for d in m.distros
        ],
    }


def format_matrix(data: dict[str, Any]) -> str:
    lines = [f"Snapshot  {data['snapshot']} ({data['snapshot_age_days']} days old)"]
    ov = data["overlay"]
    if ov:
        lines.append(
            f"Index     {ov['versions']} releases read {ov['fetched_at']} "
            f"({ov['age_days']} days ago) from {ov['index_url']}; decides only with "
            "--matrix updated"
        )
    else:
        lines.append("Index     never updated here (run `egpu-setup matrix update`)")
    lines.append("")
    lines.append(f"{'torch':<8} {'python':<11} variants (* = stable)")
    series_seen: set[str] = set()
    for t in data["torch"]:
        key = t["version"].rsplit(".", 1)[0]
        if key in series_seen:
            continue
        series_seen.add(key)
        py = t["python"] + t["index_only_python"]
        pys = f"{py[0]}-{py[-1]}" if py else "?"
        names = " ".join(
            v["name"] + ("*" if v["status"] == "stable" else "") for v in t["variants"]
        )
        lines.append(f"{t['version']:<8} {pys:<11} {names}")
    lines.append("")
    lines.append("CUDA variant -> minimum driver (Linux / Windows for WSL2)")
    lines.extend(
        f"  {c['variant']:<6} {c['min_driver']:<10} {c['min_driver_windows']}" for c in data["cuda"]
    )
    lines.append("")
    lines.append("Architecture (cc) -> driver branches")
    for a in data["architectures"]:
        last = f"<= {a['last_branch']}" if a["last_branch"] else "current"
        first = f">= {a['first_driver']}" if a["first_driver"] else "any"
        mods = (
            "open only"
            if a["needs_open"]
            else ("open/proprietary" if a["open_modules"] else "proprietary only")
        )
        cc = "-".join(dict.fromkeys(a["compute_capability"]))
        lines.append(f"  {a['name']:<17} {cc:<9} {first:<13} {last:<8} {mods}")
    lines.append("")
    lines.append("Distro packages")
    for d in data["distros"]:
        branches = ", ".join(map(str, d["branches"]))
        lines.append(
            f"  {d['distro']:<13} branches {branches} (recommended {d['recommended_branch']}), "
            f"NVIDIA repo {d['nvidia_repo']}"
        )
    for note in data["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
