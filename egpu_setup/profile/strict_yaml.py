"""Strict YAML: safe_load semantics, plus positions for every key and value, and refusals.

Composed to nodes first so every key and value keeps its line and column, and so duplicate keys
(which PyYAML silently lets the last one win), YAML 1.1 booleans (`yes`, `on`, `off`...), tags,
anchors and merge keys can be refused where they are written.

Parsed by libyaml (PyYAML's CSafeLoader, https://pyyaml.org/wiki/PyYAMLDocumentation): the
15 shipped profiles take 6 ms instead of 112 ms with the pure-Python parser, with the same values,
the same marks and the same messages. A PyYAML built without libyaml falls back to SafeLoader.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

from egpu_setup.profile.problems import KeyPath, Mark, Marks, Problem, ProblemError

if TYPE_CHECKING:  # yaml is imported when a profile is read, never at startup
    import yaml

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null")}
# YAML 1.2 keeps only these spellings; PyYAML (YAML 1.1) also turns yes/no/on/off into booleans,
# which silently flips `connection: no`-style typos.
_YAML12_BOOLS = {"true", "false", "True", "False", "TRUE", "FALSE"}


class _Position(Protocol):
    """A YAML mark, of the Python parser or of libyaml's."""

    line: int
    column: int


def _mark(file: str, m: _Position | None) -> Mark:
    """A YAML position (0-based) as the 1-based one an editor shows; 1:1 when yaml has none."""
    return Mark(file, m.line + 1, m.column + 1) if m is not None else Mark(file, 1, 1)


def parse_yaml(text: str, file: str) -> tuple[Any, Marks]:
    """Parse one profile document; raise ProblemError with a position on anything we refuse."""
    import yaml

    tab = text.find("\t")
    if tab >= 0:
        line = text.count("\n", 0, tab) + 1
        column = tab - (text.rfind("\n", 0, tab) + 1) + 1
        raise ProblemError(
            Problem(
                Mark(file, line, column),
                (),
                "tab character",
                "YAML indentation must be spaces; replace the tab with spaces",
            )
        )

    _refuse_controls(text, file)
    loader = None
    try:
        _refuse_anchors(text, file)
        loader = _safe_loader()(text)  # the pure-Python reader checks characters here
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        m = exc.problem_mark or exc.context_mark
        where = _mark(file, m) if m is not None else Mark(file, 1, 1)
        what = " ".join(p for p in (exc.context, exc.problem) if p) or "malformed YAML"
        raise ProblemError(
            Problem(where, (), f"YAML syntax: {what}", "check the indentation and quoting here")
        ) from None
    except yaml.YAMLError as exc:  # reader errors: control characters and the like
        raise ProblemError(
            Problem(Mark(file, 1, 1), (), f"YAML: {exc}", "save the profile as plain UTF-8 text")
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    marks = Marks(file)
    if node is None:
        return None, marks
    marks.values[()] = _mark(file, node.start_mark)
    seen: set[int] = set()
    return _build(loader, node, (), marks, seen), marks


def _safe_loader() -> type[yaml.SafeLoader]:
    """libyaml's safe loader when PyYAML was built with it; only plain data can be built, and
    we compose and construct ourselves."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# Control characters YAML does not allow (https://yaml.org/spec/1.2.2/#51-character-set: C0 but for
# TAB, LF and CR; DEL; C1 but for NEL), and NEL too: profile values reach udev rules and shell
# helpers, where a line break of any kind is a new line. Checked here with the exact place, the
# same for libyaml and the Python reader (whose own messages name only an offset).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_NAMES = {"\x0b": "vertical tab", "\x0c": "form feed", "\x00": "NUL", "\x1b": "escape"}
# A profile is a few levels deep (expect.h2d_gbps.tb3); refused well before either parser's own
# limits (libyaml stops at 1000 levels; the Python parser takes minutes on 120 KB of `- - - -`).
MAX_DEPTH = 16


def _refuse_controls(text: str, file: str) -> None:
    m = _CONTROL.search(text)
    if m is None:
        return
    ch = m.group(0)
    line = text.count("\n", 0, m.start()) + 1
    column = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    what = _NAMES.get(ch, "control character")
    raise ProblemError(
        Problem(
            Mark(file, line, column),
            (),
            f"{what} U+{ord(ch):04X}: control characters are not allowed",
            "save the profile as plain UTF-8 text: one value per line, no control characters",
        )
    )


def _refuse_anchors(text: str, file: str) -> None:
    """Anchors and aliases are refused where they are written (a composed node forgets that),
    and so is nesting deeper than MAX_DEPTH, before the document is composed (events come one
    at a time: the parser stops there)."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=_safe_loader()):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ProblemError(
                    Problem(
                        _mark(file, event.start_mark),
                        (),
                        f"nested deeper than {MAX_DEPTH} levels",
                        "a profile is a few levels of keys: see `egpu-setup profiles show "
                        "generic-nvidia`",
                    )
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        name = getattr(event, "anchor", None)
        if name is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise ProblemError(
                Problem(
                    _mark(file, event.start_mark),
                    (),
                    f"{sign}{name}: anchors and aliases are not supported",
                    "repeat the value, or use `extends:` to share settings between profiles",
                )
            )


def _build(
    loader: yaml.SafeLoader, node: yaml.Node, path: KeyPath, marks: Marks, seen: set[int]
) -> Any:
    import yaml

    here = _mark(marks.file, node.start_mark)
    if id(node) in seen:
        raise ProblemError(
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
                raise ProblemError(
                    Problem(
                        key_here,
                        path,
                        "merge keys (<<) are not supported",
                        "use `extends:` instead",
                    )
                )
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _TAG + "str":
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "a collection"
                raise ProblemError(
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
                raise ProblemError(
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
        raise ProblemError(
            Problem(
                here,
                path,
                f"`{node.value}` is a YAML 1.1 boolean",
                'write true or false (or quote it, e.g. "on", if you meant the word)',
            )
        )
    return loader.construct_object(node)


def _tag_error(here: Mark, path: KeyPath, tag: str) -> ProblemError:
    shown = tag.replace(_TAG, "!!")
    if shown == "!!timestamp":
        return ProblemError(Problem(here, path, "a date is not a valid value here", "quote it"))
    return ProblemError(
        Problem(
            here,
            path,
            f"YAML tag {shown} is not allowed",
            "profiles hold plain strings, numbers, booleans, lists and mappings only",
        )
    )
