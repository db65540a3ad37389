"""`egpu-setup profiles list|show|check`: the shipped and local GPU profiles, validated."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import click

from egpu_setup.commands._options import NonEmptyPath, echo_json, json_option
from egpu_setup.errors import UsageError
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.profiles")


class GpuRow(TypedDict):
    name: str
    architecture: str
    compute_capability: str | None
    device_ids: list[str]
    memory_gib: float | None


class ProfileRow(TypedDict, total=False):
    """One entry of `profiles list --json` (egpu-setup/profiles/1, docs/design.md): the first
    five keys always, the profile's own with a valid one, `error` with an invalid one."""

    name: str
    origin: str
    path: str
    shadows: list[str]
    valid: bool
    description: str
    extends: str | None
    gpu: GpuRow
    psu_watts: int | None
    error: str


SCHEMA_LIST = "egpu-setup/profiles/1"


@click.group(
    "profiles",
    epilog="""\b
Examples:
  egpu-setup profiles list                    # every profile and where it comes from
  egpu-setup profiles show rtx4090            # the resolved profile, as YAML
  egpu-setup profiles show rtx4090 > lab.yaml # a starting point for your own
  egpu-setup profiles check lab.yaml          # exit 0 when valid, 2 with file:line:column
""",
)
def command() -> None:
    """List, show and check GPU profiles.

    Profiles are found by name in the package, then /etc/egpu-setup/profiles, then
    ~/.config/egpu-setup/profiles (later ones override), or given as a path to a YAML file.
    """


@command.command(
    "list",
    epilog="""\b
Examples:
  egpu-setup profiles list
  egpu-setup profiles list --json | jq -r '.profiles[].name'
""",
)
@json_option
def list_profiles(as_json: bool) -> None:
    """List every profile in the search path (exit 2 when one of them is invalid)."""
    from egpu_setup.profile.load import iter_profiles
    from egpu_setup.profile.search import search_dirs
    from egpu_setup.profile.types import Profile

    rows: list[ProfileRow] = []
    errors: list[UsageError] = []
    for entry, loaded in iter_profiles():
        row: ProfileRow = {
            "name": entry.name,
            "origin": entry.origin,
            "path": str(entry.path),
            "shadows": list(entry.shadows),
            "valid": isinstance(loaded, Profile),
        }
        if isinstance(loaded, Profile):
            row["description"] = loaded.description
            row["extends"] = loaded.extends
            row["gpu"] = {
                "name": loaded.gpu.name,
                "architecture": loaded.gpu.architecture,
                "compute_capability": loaded.gpu.compute_capability,
                "device_ids": list(loaded.gpu.device_ids),
                "memory_gib": loaded.gpu.memory_gib,
            }
            row["psu_watts"] = loaded.power.psu_watts
        else:
            row["error"] = loaded.message
            errors.append(loaded)
        rows.append(row)
    if as_json:
        echo_json(
            {
                "schema": SCHEMA_LIST,
                "search_path": [{"origin": o, "path": str(p)} for o, p in search_dirs()],
                "profiles": rows,
            }
        )
    else:
        _print_table(rows)
    if errors:
        for err in errors[:-1]:
            click.echo(f"error: {err.message}", err=True)
            if err.hint:
                click.echo(f"hint: {err.hint}", err=True)
        raise errors[-1]


def _print_table(rows: list[ProfileRow]) -> None:
    table = [("NAME", "GPU", "ARCH", "CC", "MEM", "PSU", "FROM")]
    for r in rows:
        if not r["valid"]:
            table.append((r["name"], "INVALID (see below)", "", "", "", "", r["origin"]))
            continue
        g = r["gpu"]
        mem = f"{g['memory_gib']:g} GB" if g["memory_gib"] else "-"
        psu = f"{r['psu_watts']} W" if r["psu_watts"] else "-"
        table.append(
            (
                r["name"],
                g["name"],
                g["architecture"],
                g["compute_capability"] or "-",
                mem,
                psu,
                r["origin"],
            )
        )
    from egpu_setup.text import fit, terminal_width

    widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
    width = terminal_width()
    for row in table:
        line = "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        click.echo(fit(line, width))


@command.command(
    "show",
    epilog="""\b
Examples:
  egpu-setup profiles show rtx4090
  egpu-setup profiles show ./lab-4090.yaml --json
""",
)
@click.argument("name")
@json_option
def show(name: str, as_json: bool) -> None:
    """Print one profile with every default filled in and `extends:` merged."""
    from egpu_setup.profile.load import load_profile

    profile = load_profile(name)
    data = profile.to_json()
    if as_json:
        echo_json(data)
        return
    import yaml

    body = {k: v for k, v in data.items() if k not in ("origin", "path", "chain", "extends")}
    click.echo(f"# {profile.name}: {profile.path} ({profile.origin})")
    if profile.extends:
        click.echo(f"# merged from: {' <- '.join(profile.chain)}")
    click.echo(yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=100).rstrip())


@command.command(
    "check",
    epilog="""\b
Examples:
  egpu-setup profiles check lab-4090.yaml
  egpu-setup profiles check /etc/egpu-setup/profiles/*.yaml
""",
)
@click.argument("files", nargs=-1, required=True, type=NonEmptyPath(dir_okay=False, path_type=Path))
def check(files: tuple[Path, ...]) -> None:
    """Validate profiles (`name:` = file name): exit 0 when all are valid, 2 with file:line:col."""
    from egpu_setup.profile.load import load_file

    failures: list[UsageError] = []
    for path in files:
        if not path.is_file():
            failures.append(UsageError(f"profile file not found: {path}", "check the path"))
            continue
        try:
            # checked as install would find it in a profile directory: by file name, so a
            # `name:` that differs from it is refused here too (profile/document.py)
            profile = load_file(path, "custom")
        except UsageError as exc:
            failures.append(exc)
            continue
        click.echo(f"ok: {path} ({profile.name}: {profile.gpu.name})")
    if not failures:
        return
    if len(failures) == 1:
        raise failures[0]
    for err in failures:
        click.echo(f"error: {err.message}", err=True)
        if err.hint:
            click.echo(f"hint: {err.hint}", err=True)
    raise UsageError(
        f"{len(failures)} of {len(files)} profiles are invalid", "fix the errors listed above"
    )
