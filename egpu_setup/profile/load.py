"""GPU profiles: declarative descriptions of one eGPU model, loaded strictly.

A profile is YAML (profiles/*.yaml in the package, /etc/egpu-setup/profiles, the user's
config directory, or any path). Loading is strict because a profile feeds templates that end up
in udev rules, modprobe options and shell helpers (hotplug-security.md §1.5, §5.7, §7 rows 18-20):

- YAML is read with a SafeLoader subclass, composed to nodes first so every key and value keeps
  its line and column, and so duplicate keys (which PyYAML silently lets the last one win),
  YAML 1.1 booleans (`yes`, `on`, `off`...), tags, anchors and merge keys can be refused.
- Values are then checked against the JSON Schema shipped in egpu_setup/data/profile.schema.json,
  interpreted here (a small subset of draft 2020-12, refused loudly if the schema ever uses a
  keyword this interpreter does not know), so editors and the loader apply the same rules.
- A few cross-field rules a JSON Schema cannot state follow (branch order, open modules need
  Turing or newer), and `extends:` is resolved with cycle detection.

Every failure is a UsageError (exit 2) reading `file:line:column: key.path: problem` with a hint.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_setup.errors import UsageError

SCHEMA_ID = "egpu-setup/profile/1"
ENV_PATH = "EGPU_SETUP_PROFILE_PATH"
SYSTEM_DIR = Path("/etc/egpu-setup/profiles")
MAX_PROFILE_BYTES = 256 * 1024
_MAX_EXTENDS_DEPTH = 16

# -------------------------------------------------------------------------------------------
# The pinned value types (brief: "Interfaces pinned between helpers"); fields may be added.
# -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    device_ids: tuple[str, ...]  # 4-hex lowercase, vendor 10de; empty = any NVIDIA GPU
    name: str
    architecture: str  # "Ada Lovelace"; "any" for a generic profile
    compute_capability: str | None
    memory_gib: float | None

    def matches(self, device_id: str | None) -> bool:
        """True when this spec covers a PCI device id (a generic spec covers every id)."""
        if not self.device_ids:
            return True
        return device_id is not None and device_id.lower() in self.device_ids


@dataclass(frozen=True)
class Expectations:
    fp32_tflops: float | None
    fp16_tflops: float | None
    min_link_gen: int | None
    min_link_width: int | None
    h2d_gbps: dict[str, float]  # keys: thunderbolt, usb4, oculink, pcie
    amp_steps: int
    amp_loss_drop: float  # final loss <= amp_loss_drop * first loss
    max_temp_c: float
    max_power_w: float | None


@dataclass(frozen=True)
class PowerAdvice:
    psu_watts: int | None
    note: str | None


@dataclass(frozen=True)
class DriverConstraints:
    min_branch: int | None
    preferred_branch: int | None
    max_branch: int | None
    flavour: str  # "open" / "proprietary" / "auto"


@dataclass(frozen=True)
class TorchConstraints:
    spec: str | None
    cuda: str | None
    extras: tuple[str, ...]  # "torchvision", "torchaudio"


@dataclass(frozen=True)
class HotplugOptions:
    thunderbolt_policy: str  # "iommu" / "auto" / "manual"
    runtime_pm_off: bool
    persistenced: bool
    enclosure_unique_id: str | None
    accept_no_iommu: bool
    connection: str  # "thunderbolt" / "usb4" / "oculink" / "any"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    path: str
    gpu: GpuSpec
    expect: Expectations
    power: PowerAdvice
    driver: DriverConstraints
    torch: TorchConstraints
    mode: str  # "compute" / "display"
    hotplug: HotplugOptions
    extends: str | None = None
    origin: str = "file"  # package / system / user / custom (EGPU_SETUP_PROFILE_PATH) / file
    chain: tuple[str, ...] = field(default=())  # files merged, most general first

    def to_json(self) -> dict[str, Any]:
        """The resolved profile as plain data (the shape of the YAML, every default filled in)."""
        return {
            "schema": SCHEMA_ID,
            "name": self.name,
            "description": self.description,
            "extends": self.extends,
            "mode": self.mode,
            "gpu": {
                "name": self.gpu.name,
                "architecture": self.gpu.architecture,
                "compute_capability": self.gpu.compute_capability,
                "device_ids": list(self.gpu.device_ids),
                "memory_gib": self.gpu.memory_gib,
            },
            "expect": {
                "fp32_tflops": self.expect.fp32_tflops,
                "fp16_tflops": self.expect.fp16_tflops,
                "min_link_gen": self.expect.min_link_gen,
                "min_link_width": self.expect.min_link_width,
                "h2d_gbps": dict(self.expect.h2d_gbps),
                "amp_steps": self.expect.amp_steps,
                "amp_loss_drop": self.expect.amp_loss_drop,
                "max_temp_c": self.expect.max_temp_c,
                "max_power_w": self.expect.max_power_w,
            },
            "power": {"psu_watts": self.power.psu_watts, "note": self.power.note},
            "driver": {
                "min_branch": self.driver.min_branch,
                "preferred_branch": self.driver.preferred_branch,
                "max_branch": self.driver.max_branch,
                "flavour": self.driver.flavour,
            },
            "torch": {
                "spec": self.torch.spec,
                "cuda": self.torch.cuda,
                "extras": list(self.torch.extras),
            },
            "hotplug": {
                "thunderbolt_policy": self.hotplug.thunderbolt_policy,
                "runtime_pm_off": self.hotplug.runtime_pm_off,
                "persistenced": self.hotplug.persistenced,
                "enclosure_unique_id": self.hotplug.enclosure_unique_id,
                "accept_no_iommu": self.hotplug.accept_no_iommu,
                "connection": self.hotplug.connection,
            },
            "origin": self.origin,
            "path": self.path,
            "chain": list(self.chain),
        }


# -------------------------------------------------------------------------------------------
# Positions and problems
# -------------------------------------------------------------------------------------------

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Mark:
    file: str
    line: int  # 1-based
    column: int  # 1-based


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile, where it is, and what to do about it."""

    mark: Mark
    path: KeyPath
    message: str
    hint: str

    def text(self) -> str:
        where = f"{self.mark.file}:{self.mark.line}:{self.mark.column}"
        key = format_path(self.path)
        return f"{where}: {key}: {self.message}" if key else f"{where}: {self.message}"

    def error(self, others: int = 0) -> UsageError:
        more = f" (and {others} more problem{'s' if others != 1 else ''})" if others else ""
        return UsageError(self.text() + more, self.hint)


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass
class _Marks:
    """Where each key and each value of a document starts."""

    file: str
    keys: dict[KeyPath, Mark] = field(default_factory=dict)
    values: dict[KeyPath, Mark] = field(default_factory=dict)

    def value(self, path: KeyPath) -> Mark:
        # The closest enclosing value that has a mark (a missing key is reported on its parent).
        for i in range(len(path), -1, -1):
            if path[:i] in self.values:
                return self.values[path[:i]]
        return Mark(self.file, 1, 1)

    def key(self, path: KeyPath) -> Mark:
        return self.keys.get(path) or self.value(path)


class _ProfileError(Exception):
    def __init__(self, problem: Problem):
        super().__init__(problem.text())
        self.problem = problem


# -------------------------------------------------------------------------------------------
# Strict YAML: safe_load semantics, plus positions and refusals
# -------------------------------------------------------------------------------------------

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null")}
# YAML 1.2 keeps only these spellings; PyYAML (YAML 1.1) also turns yes/no/on/off into booleans,
# which silently flips `connection: no`-style typos (hotplug-security.md §7 row 19).
_YAML12_BOOLS = {"true", "false", "True", "False", "TRUE", "FALSE"}


def _mark(file: str, m: Any) -> Mark:
    return Mark(file, m.line + 1, m.column + 1)


def parse_yaml(text: str, file: str) -> tuple[Any, _Marks]:
    """Parse one profile document; raise _ProfileError with a position on anything we refuse."""
    import yaml

    tab = text.find("\t")
    if tab >= 0:
        line = text.count("\n", 0, tab) + 1
        column = tab - (text.rfind("\n", 0, tab) + 1) + 1
        raise _ProfileError(
            Problem(
                Mark(file, line, column),
                (),
                "tab character",
                "YAML indentation must be spaces; replace the tab with spaces",
            )
        )

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader: only plain data can be built; we compose and construct ourselves."""

    loader = StrictLoader(text)
    try:
        _refuse_anchors(text, file)
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        m = exc.problem_mark or exc.context_mark
        where = _mark(file, m) if m is not None else Mark(file, 1, 1)
        what = " ".join(p for p in (exc.context, exc.problem) if p) or "malformed YAML"
        raise _ProfileError(
            Problem(where, (), f"YAML syntax: {what}", "check the indentation and quoting here")
        ) from None
    except yaml.YAMLError as exc:  # reader errors: control characters and the like
        raise _ProfileError(
            Problem(Mark(file, 1, 1), (), f"YAML: {exc}", "save the profile as plain UTF-8 text")
        ) from None
    finally:
        loader.dispose()
    marks = _Marks(file)
    if node is None:
        return None, marks
    marks.values[()] = _mark(file, node.start_mark)
    seen: set[int] = set()
    return _build(loader, node, (), marks, seen), marks


def _refuse_anchors(text: str, file: str) -> None:
    """Anchors and aliases are refused where they are written (a composed node forgets that)."""
    import yaml

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        name = getattr(event, "anchor", None)
        if name is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _ProfileError(
                Problem(
                    _mark(file, event.start_mark),
                    (),
                    f"{sign}{name}: anchors and aliases are not supported",
                    "repeat the value, or use `extends:` to share settings between profiles",
                )
            )


def _build(loader: Any, node: Any, path: KeyPath, marks: _Marks, seen: set[int]) -> Any:
    import yaml

    here = _mark(marks.file, node.start_mark)
    if id(node) in seen:
        raise _ProfileError(
            Problem(
                here,
                path,
                "anchors and aliases are not supported",
                "use `extends:` to share settings",
            )
        )
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        if node.tag != _TAG + "map":
            raise _tag_error(here, path, node.tag)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key_here = _mark(marks.file, key_node.start_mark)
            if key_node.tag == _TAG + "merge":
                raise _ProfileError(
                    Problem(
                        key_here,
                        path,
                        "merge keys (<<) are not supported",
                        "use `extends:` instead",
                    )
                )
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _TAG + "str":
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "a collection"
                raise _ProfileError(
                    Problem(
                        key_here,
                        path,
                        f"key {shown!r} is not a plain string",
                        "keys are names like `gpu` or `device_ids`; quote odd ones",
                    )
                )
            key = key_node.value
            sub = (*path, key)
            if key in out:
                first = marks.keys[sub]
                raise _ProfileError(
                    Problem(
                        key_here,
                        sub,
                        f"duplicate key (first defined at line {first.line})",
                        "keep one of the two; YAML would silently use the last",
                    )
                )
            marks.keys[sub] = key_here
            marks.values[sub] = _mark(marks.file, value_node.start_mark)
            out[key] = _build(loader, value_node, sub, marks, seen)
        return out
    if isinstance(node, yaml.SequenceNode):
        if node.tag != _TAG + "seq":
            raise _tag_error(here, path, node.tag)
        items = []
        for i, item in enumerate(node.value):
            sub = (*path, i)
            marks.values[sub] = _mark(marks.file, item.start_mark)
            items.append(_build(loader, item, sub, marks, seen))
        return items
    # A scalar.
    if node.tag not in _SCALAR_TAGS:
        raise _tag_error(here, path, node.tag)
    if node.tag == _TAG + "bool" and node.value not in _YAML12_BOOLS:
        raise _ProfileError(
            Problem(
                here,
                path,
                f"`{node.value}` is a YAML 1.1 boolean",
                'write true or false (or quote it, e.g. "on", if you meant the word)',
            )
        )
    return loader.construct_object(node)


def _tag_error(here: Mark, path: KeyPath, tag: str) -> _ProfileError:
    shown = tag.replace(_TAG, "!!")
    if shown == "!!timestamp":
        return _ProfileError(Problem(here, path, "a date is not a valid value here", "quote it"))
    return _ProfileError(
        Problem(
            here,
            path,
            f"YAML tag {shown} is not allowed",
            "profiles hold plain strings, numbers, booleans, lists and mappings only",
        )
    )


# -------------------------------------------------------------------------------------------
# The shipped JSON Schema, interpreted (the subset of draft 2020-12 it uses)
# -------------------------------------------------------------------------------------------

# Keywords this interpreter applies, and annotation keywords it may ignore. Anything else in the
# schema makes loading fail, so the schema cannot grow a rule the loader silently skips.
_APPLIED = {
    "type",
    "enum",
    "const",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "properties",
    "additionalProperties",
    "required",
    "items",
    "uniqueItems",
    "maxItems",
    "anyOf",
    "$ref",
}
_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description", "default", "x-hint", "$comment"}

_schema_cache: dict[str, Any] = {}


def load_schema() -> dict[str, Any]:
    """The profile JSON Schema shipped in the package (parsed once, vetted on first use)."""
    if "schema" not in _schema_cache:
        from importlib.resources import files

        text = files("egpu_setup.data").joinpath("profile.schema.json").read_text(encoding="utf-8")
        schema = json.loads(text)
        _vet_schema(schema, "#")
        _schema_cache["schema"] = schema
    return _schema_cache["schema"]


def _vet_schema(node: Any, where: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in _APPLIED and key not in _ANNOTATIONS:
                raise RuntimeError(
                    f"profile.schema.json {where}: keyword {key!r} is not interpreted"
                )
            if key in ("properties", "$defs"):
                for name, sub in value.items():
                    _vet_schema(sub, f"{where}/{key}/{name}")
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                _vet_schema(value, f"{where}/{key}")
            elif key == "anyOf":
                for i, sub in enumerate(value):
                    _vet_schema(sub, f"{where}/anyOf/{i}")


def _resolve_ref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Merge a `$ref` target with its siblings (draft 2020-12 allows both)."""
    while "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise RuntimeError(f"profile.schema.json: unsupported $ref {ref}")
        target = root["$defs"][ref[len("#/$defs/") :]]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
    "object": "a mapping",
    "array": "a list",
}


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _is_type(value: Any, name: str) -> bool:
    kind = _type_of(value)
    if name == "number":
        return kind in ("integer", "number")
    if name == "integer":
        # JSON Schema counts 4.0 as an integer; the loader converts it.
        return kind == "integer" or (
            kind == "number" and math.isfinite(value) and value.is_integer()
        )
    return kind == name


def _shown(value: Any) -> str:
    text = (
        json.dumps(value) if _type_of(value) in ("string", "integer", "number") else _type_of(value)
    )
    return text if len(text) <= 60 else text[:57] + "..."


def validate(
    value: Any,
    schema: dict[str, Any],
    root: dict[str, Any],
    path: KeyPath,
    out: list[tuple[KeyPath, str, str, bool]],
) -> None:
    """Append (path, message, hint, is_key_problem) for every rule `value` breaks."""
    schema = _resolve_ref(schema, root)
    hint = schema.get("x-hint", "see egpu_setup/data/profile.schema.json")
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is_type(value, t) for t in names):
            want = " or ".join(_TYPE_NAMES[t] for t in names)
            out.append((path, f"expected {want}, got {_shown(value)}", hint, False))
            return
    if isinstance(value, float) and not math.isfinite(value):
        out.append((path, f"{value} is not a finite number", hint, False))
        return
    if "const" in schema and value != schema["const"]:
        out.append(
            (path, f"must be {json.dumps(schema['const'])}, got {_shown(value)}", hint, False)
        )
        return
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        choices = ", ".join("null" if e is None else str(e) for e in schema["enum"])
        out.append((path, f"{_shown(value)} is not one of: {choices}", hint, False))
        return
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        out.append((path, f"invalid value {_shown(value)}", hint, False))
        return
    if _type_of(value) in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        xlow, xhigh = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if (
            (low is not None and value < low)
            or (high is not None and value > high)
            or (xlow is not None and value <= xlow)
            or (xhigh is not None and value >= xhigh)
        ):
            out.append((path, f"{_shown(value)} is out of range", hint, False))
            return
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append((path, f"at most {schema['maxItems']} items", hint, False))
        if schema.get("uniqueItems"):
            for i, item in enumerate(value):
                if any(_same(item, earlier) for earlier in value[:i]):
                    out.append(
                        (
                            (*path, i),
                            f"{_shown(item)} is listed twice",
                            "list each value once",
                            False,
                        )
                    )
        if "items" in schema:
            for i, item in enumerate(value):
                validate(item, schema["items"], root, (*path, i), out)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, sub in value.items():
            if key in props:
                validate(sub, props[key], root, (*path, key), out)
            elif extra is False:
                out.append(((*path, key), "unknown key", _did_you_mean(key, props), True))
            elif isinstance(extra, dict):
                validate(sub, extra, root, (*path, key), out)
        for key in schema.get("required", ()):
            if key not in value:
                out.append(
                    (path, f"missing required key `{format_path((*path, key))}`", hint, False)
                )
    if "anyOf" in schema:
        branches = []
        for sub in schema["anyOf"]:
            found: list[tuple[KeyPath, str, str, bool]] = []
            validate(value, sub, root, path, found)
            if not found:
                branches = []
                break
            branches.append(found)
        if branches:
            # Report the last branch (the fullest form); its hint names the alternatives.
            out.extend((p, m, schema.get("x-hint", h), k) for p, m, h, k in branches[-1])


def _same(a: Any, b: Any) -> bool:
    # JSON Schema equality: true is not 1, 4.0 equals 4.
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _did_you_mean(key: str, allowed: Mapping[str, Any]) -> str:
    names = list(allowed)
    lowered = {n.lower(): n for n in names}
    match = lowered.get(key.lower().replace("-", "_"))
    if match is None:
        close = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
        match = lowered[close[0]] if close else None
    if match is not None:
        return f"did you mean `{match}`? (allowed here: {', '.join(names)})"
    return f"allowed here: {', '.join(names)}"


def _problems(data: Any, marks: _Marks) -> list[Problem]:
    """Schema problems of one document, in file order."""
    schema = load_schema()
    raw: list[tuple[KeyPath, str, str, bool]] = []
    validate(data, schema, schema, (), raw)
    found = [
        Problem(marks.key(p) if is_key else marks.value(p), p, msg, hint)
        for p, msg, hint, is_key in raw
    ]
    return sorted(found, key=lambda pr: (pr.mark.line, pr.mark.column))


def _defaults(schema: dict[str, Any], root: dict[str, Any]) -> Any:
    """The default document a schema describes (every property with a `default`)."""
    schema = _resolve_ref(schema, root)
    if "properties" in schema:
        out = {}
        for key, sub in schema["properties"].items():
            value = _defaults(sub, root)
            if value is not _NO_DEFAULT:
                out[key] = value
        return out
    return schema.get("default", _NO_DEFAULT)


_NO_DEFAULT = object()

# -------------------------------------------------------------------------------------------
# Finding profiles
# -------------------------------------------------------------------------------------------


def _user_dir() -> Path:
    """The invoking user's profile directory; under sudo the user who ran sudo, not root."""
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user and sudo_user != "root" and hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd

        try:
            # sudo's env_reset drops XDG_CONFIG_HOME (hotplug-security.md §5.2): use the default.
            return Path(pwd.getpwnam(sudo_user).pw_dir) / ".config" / "egpu-setup" / "profiles"
        except KeyError:
            pass
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "egpu-setup" / "profiles"


# The top-level profiles/ folder ships in the wheel under this package name (pyproject.toml,
# package-dir), apart from the loader package egpu_setup.profile.
SHIPPED_PACKAGE = "egpu_setup.profile_files"


def _package_dir() -> Path:
    from importlib.util import find_spec

    try:
        spec = find_spec(SHIPPED_PACKAGE)
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    # A source checkout that was not (re)installed since the package mapping was added.
    checkout = Path(__file__).resolve().parents[2] / "profiles"
    if (checkout / "__init__.py").is_file():
        return checkout
    raise UsageError(
        f"the shipped profiles ({SHIPPED_PACKAGE}) are missing from this installation",
        "reinstall egpu-setup",
    )


def search_dirs() -> list[tuple[str, Path]]:
    """(origin, directory) in lookup order; a later directory overrides an earlier one.

    EGPU_SETUP_PROFILE_PATH (os.pathsep-separated) replaces the system and user directories."""
    dirs = [("package", _package_dir())]
    env = os.environ.get(ENV_PATH)
    if env is not None:
        dirs += [("custom", Path(p)) for p in env.split(os.pathsep) if p]
    else:
        dirs += [("system", SYSTEM_DIR), ("user", _user_dir())]
    return dirs


@dataclass(frozen=True)
class ProfileEntry:
    """A profile file found by name in the search path."""

    name: str
    path: Path
    origin: str
    shadows: tuple[str, ...] = ()  # files of the same name it overrides


def available() -> dict[str, ProfileEntry]:
    """Every profile name in the search path, mapped to the file that wins."""
    found: dict[str, ProfileEntry] = {}
    for origin, directory in search_dirs():
        try:
            files = sorted(directory.glob("*.yaml"))
        except OSError:
            continue
        for path in files:
            name = path.stem
            if not _NAME_RE.match(name) or not path.is_file():
                continue
            before = found.get(name)
            shadows = (*before.shadows, str(before.path)) if before else ()
            found[name] = ProfileEntry(name, path, origin, shadows)
    return found


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.endswith((".yaml", ".yml")) or text.startswith(".")


def locate(name_or_path: str) -> tuple[Path, str]:
    """The file a profile argument means, and its origin; UsageError when there is none."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise UsageError(
                f"profile file not found: {name_or_path}",
                "check the path, or pass a profile name (see `egpu-setup profiles list`)",
            )
        return path, "file"
    entries = available()
    entry = entries.get(name_or_path)
    if entry is None:
        close = difflib.get_close_matches(name_or_path.lower(), list(entries), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see `egpu-setup profiles list`"
        raise UsageError(f"unknown profile {name_or_path!r}", hint)
    return entry.path, entry.origin


# -------------------------------------------------------------------------------------------
# Loading
# -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Doc:
    data: dict[str, Any]
    marks: _Marks
    path: Path


def _read_doc(path: Path, origin: str) -> _Doc:
    file = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"cannot read profile {file}: {exc.strerror or exc}",
            "check the path and its permissions",
        ) from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise UsageError(
            f"{file}: profile is larger than {MAX_PROFILE_BYTES // 1024} KiB",
            "a profile is a short YAML file",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UsageError(
            f"{file}:{line}:{column}: not UTF-8 text", "save the profile as UTF-8"
        ) from None
    text = text.removeprefix("\ufeff")
    try:
        data, marks = parse_yaml(text, file)
    except _ProfileError as exc:
        raise exc.problem.error() from None
    if data is None:
        raise UsageError(
            f"{file}: the profile is empty", "start from `egpu-setup profiles show generic-nvidia`"
        )
    if not isinstance(data, dict):
        raise Problem(
            marks.value(()),
            (),
            f"expected a mapping of keys, got {_type_of(data)}",
            "a profile starts with `name: ...`",
        ).error()
    problems = _problems(data, marks)
    if problems:
        raise problems[0].error(len(problems) - 1)
    if origin in ("package", "system", "user", "custom") and data["name"] != path.stem:
        raise Problem(
            marks.value(("name",)),
            ("name",),
            f"{data['name']!r} differs from the file name {path.name!r}",
            f"profiles are found by file name: rename the file to {data['name']}.yaml or set "
            f"name: {path.stem}",
        ).error()
    return _Doc(data, marks, path)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, everything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _resolve_chain(
    doc: _Doc, stack: tuple[str, ...]
) -> tuple[dict[str, Any], _Marks, tuple[str, ...]]:
    """The document merged over its `extends:` ancestors; marks point into the file that set
    each key."""
    parent_name = doc.data.get("extends")
    if parent_name is None:
        return doc.data, doc.marks, (str(doc.path),)
    here = doc.marks.value(("extends",))
    chain_names = (*stack, doc.data["name"])
    if parent_name in chain_names:
        cycle = " -> ".join((*chain_names, parent_name))
        raise Problem(
            here,
            ("extends",),
            f"extends cycle: {cycle}",
            "one of these profiles must not extend the other",
        ).error()
    if len(chain_names) > _MAX_EXTENDS_DEPTH:
        raise Problem(
            here, ("extends",), "extends chain is too deep", "flatten the profiles"
        ).error()
    entries = available()
    entry = entries.get(parent_name)
    if entry is None:
        close = difflib.get_close_matches(parent_name, list(entries), n=1, cutoff=0.5)
        raise Problem(
            here,
            ("extends",),
            f"unknown profile {parent_name!r}",
            f"did you mean `{close[0]}`?" if close else "see `egpu-setup profiles list`",
        ).error()
    if entry.path.resolve() == doc.path.resolve():
        raise Problem(
            here, ("extends",), "a profile cannot extend itself", "name another profile"
        ).error()
    parent = _read_doc(entry.path, entry.origin)
    base, base_marks, chain = _resolve_chain(parent, chain_names)
    own = {k: v for k, v in doc.data.items() if k != "extends"}
    merged = _merge(base, own)
    marks = _Marks(doc.marks.file)
    for attr in ("keys", "values"):
        combined = dict(getattr(base_marks, attr))
        combined.update(getattr(doc.marks, attr))
        setattr(marks, attr, combined)
    merged["extends"] = parent_name
    return merged, marks, (*chain, str(doc.path))


# Architectures whose GPUs the open kernel modules cannot drive (matrix-facts.md §3: "open ...
# only for Turing and newer"; Maxwell/Pascal/Volta need the proprietary flavour).
_PRE_TURING = {"Maxwell", "Pascal", "Volta"}


def _cross_checks(data: dict[str, Any], marks: _Marks) -> None:
    driver = data.get("driver", {})
    low, pref, high = (
        driver.get("min_branch"),
        driver.get("preferred_branch"),
        driver.get("max_branch"),
    )
    pairs = [("preferred_branch", low, pref), ("max_branch", low, high), ("max_branch", pref, high)]
    for key, a, b in pairs:
        if a is not None and b is not None and a > b:
            raise Problem(
                marks.value(("driver", key)),
                ("driver", key),
                f"{b} is below {a}",
                "driver branches must satisfy min_branch <= preferred_branch <= max_branch",
            ).error()
    arch = data.get("gpu", {}).get("architecture")
    if driver.get("flavour") == "open" and arch in _PRE_TURING:
        raise Problem(
            marks.value(("driver", "flavour")),
            ("driver", "flavour"),
            f"open kernel modules do not support {arch} GPUs",
            "use flavour: proprietary (NVIDIA: open modules need Turing or newer)",
        ).error()


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (search path) or by path, fully resolved; UsageError on bad input."""
    path, origin = locate(name_or_path)
    return load_file(path, origin)


def load_file(path: Path, origin: str = "file") -> Profile:
    """A profile from one file (its `extends:` found by name)."""
    doc = _read_doc(path, origin)
    data, marks, chain = _resolve_chain(doc, ())
    _cross_checks(data, marks)
    schema = load_schema()
    full = _merge(_defaults(schema, schema), data)
    return _to_profile(full, str(path), origin, chain)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _to_profile(d: dict[str, Any], path: str, origin: str, chain: tuple[str, ...]) -> Profile:
    g, e, p, dr, t, h = (d[k] for k in ("gpu", "expect", "power", "driver", "torch", "hotplug"))
    uid = h["enclosure_unique_id"]
    return Profile(
        name=d["name"],
        description=d["description"],
        path=path,
        gpu=GpuSpec(
            device_ids=tuple(g["device_ids"]),
            name=g["name"],
            architecture=g["architecture"],
            compute_capability=g["compute_capability"],
            memory_gib=_float(g["memory_gib"]),
        ),
        expect=Expectations(
            fp32_tflops=_float(e["fp32_tflops"]),
            fp16_tflops=_float(e["fp16_tflops"]),
            min_link_gen=_int(e["min_link_gen"]),
            min_link_width=_int(e["min_link_width"]),
            h2d_gbps={k: float(v) for k, v in e["h2d_gbps"].items()},
            amp_steps=int(e["amp_steps"]),
            amp_loss_drop=float(e["amp_loss_drop"]),
            max_temp_c=float(e["max_temp_c"]),
            max_power_w=_float(e["max_power_w"]),
        ),
        power=PowerAdvice(psu_watts=_int(p["psu_watts"]), note=p["note"]),
        driver=DriverConstraints(
            min_branch=_int(dr["min_branch"]),
            preferred_branch=_int(dr["preferred_branch"]),
            max_branch=_int(dr["max_branch"]),
            flavour=dr["flavour"],
        ),
        torch=TorchConstraints(spec=t["spec"], cuda=t["cuda"], extras=tuple(t["extras"])),
        mode=d["mode"],
        hotplug=HotplugOptions(
            thunderbolt_policy=h["thunderbolt_policy"],
            runtime_pm_off=bool(h["runtime_pm_off"]),
            persistenced=bool(h["persistenced"]),
            enclosure_unique_id=uid.lower() if uid else None,
            accept_no_iommu=bool(h["accept_no_iommu"]),
            connection=h["connection"],
        ),
        extends=d.get("extends"),
        origin=origin,
        chain=chain,
    )


def iter_profiles() -> Iterator[tuple[ProfileEntry, Profile | UsageError]]:
    """Every profile in the search path, loaded, or the error that stopped it."""
    for _, entry in sorted(available().items()):
        try:
            yield entry, load_file(entry.path, entry.origin)
        except UsageError as exc:
            yield entry, exc


def profile_for_device(device_id: str | None) -> Profile | None:
    """The first valid profile (by name) listing this PCI device id, ignoring generic ones."""
    if not device_id:
        return None
    for _, loaded in iter_profiles():
        if isinstance(loaded, Profile) and loaded.gpu.device_ids and loaded.gpu.matches(device_id):
            return loaded
    return None
