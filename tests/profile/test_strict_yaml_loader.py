"""Profiles are parsed by libyaml (PyYAML's CSafeLoader): the same values, marks and messages as
the pure-Python SafeLoader, for the shipped profiles and for documents it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO
from egpu_setup.profile import strict_yaml
from egpu_setup.profile.problems import ProblemError

SHIPPED = sorted((REPO / "profiles").glob("*.yaml"))
REFUSED = {
    "syntax": "name: a\ngpu: [1, 2\nx: 1\n",
    "bad-indent": "name: a\n  gpu: 1\n x: 2\n",
    "duplicate": "name: a\ngpu:\n  vendor: 1\nname: b\n",
    "yaml11-bool": "name: a\nflag: yes\n",
    "anchor": "name: &n a\nother: *n\n",
    "merge": "base: {a: 1}\nx:\n  <<: {a: 1}\n",
    "tag": "name: !!python/object:os.system a\n",
    "timestamp": "name: a\nwhen: 2024-01-01\n",
    "non-string-key": "1: a\n",
    "control-char": "name: a\x07b\n",
    "tab": "name: a\n\tgpu: 1\n",
    "two-documents": "name: a\n---\nname: b\n",
    "vertical-tab": "name: a\ndescription: one\x0btwo\n",
    "form-feed": "name: a\n\x0cgpu: 1\n",
    "escape": "name: a\x1b[2J\n",
    "c1-control": "name: a\x9b2J\n",
    "deep-block": "name: a\ngpu:\n  " + "- " * 60000 + "x\n",  # 120 KB
    "deep-flow": "name: a\ngpu: " + "[" * 900 + "]" * 900 + "\n",
    # libyaml's scanner looks ahead in flow context and stops at its own 1000 levels first
    "deeper-flow": "name: a\ngpu: " + "[" * 60000 + "]" * 60000 + "\n",
    "deep-keys": "name: a\n" + "".join(" " * i + "k:\n" for i in range(40)) + " " * 40 + "x\n",
}


def _parse(text: str, loader: type | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    if loader is not None:
        monkeypatch.setattr(strict_yaml, "_safe_loader", lambda: loader)
    try:
        data, marks = strict_yaml.parse_yaml(text, "p.yaml")
    except ProblemError as exc:
        return ("refused", exc.problem)
    return (data, sorted(marks.keys.items(), key=repr), sorted(marks.values.items(), key=repr))


def test_libyaml_is_the_parser() -> None:
    assert yaml.__with_libyaml__, "PyYAML was built without libyaml"
    loader: object = strict_yaml._safe_loader()  # CSafeLoader is no SafeLoader to the stubs
    assert loader is yaml.CSafeLoader


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_profile_reads_the_same_with_either_parser(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = path.read_text(encoding="utf-8")
    c = _parse(text, None, monkeypatch)
    assert c[0] != "refused"
    assert c == _parse(text, yaml.SafeLoader, monkeypatch)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refusal_has_the_same_mark_and_message_with_either_parser(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = _parse(REFUSED[name], None, monkeypatch)
    python = _parse(REFUSED[name], yaml.SafeLoader, monkeypatch)
    assert c[0] == "refused", c
    if name != "deeper-flow":
        assert (c[1].mark, c[1].path) == (python[1].mark, python[1].path)
    if name not in ("syntax", "bad-indent", "deeper-flow"):
        assert c == python
    else:
        # libyaml words two errors its own way ("did not find expected ',' or ']'" for
        # "expected ',' or ']', but got ':'", "in this context" for "here"): the same place, a
        # YAML error all the same; 60000 `[` it refuses at its own limit, 1000 levels in
        assert c[1].message.startswith("YAML")


@pytest.mark.parametrize(
    ("name", "message", "line", "column"),
    [
        ("vertical-tab", "vertical tab U+000B: control characters are not allowed", 2, 17),
        ("form-feed", "form feed U+000C: control characters are not allowed", 2, 1),
        ("control-char", "control character U+0007: control characters are not allowed", 1, 8),
        ("deep-block", f"nested deeper than {strict_yaml.MAX_DEPTH} levels", 3, 33),
        ("deep-flow", f"nested deeper than {strict_yaml.MAX_DEPTH} levels", 2, 21),
    ],
)
def test_control_characters_and_deep_nesting_are_named_where_they_are(
    name: str, message: str, line: int, column: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for loader in (None, yaml.SafeLoader):
        refused = _parse(REFUSED[name], loader, monkeypatch)
        assert refused[0] == "refused"
        assert refused[1].message == message
        assert (refused[1].mark.line, refused[1].mark.column) == (line, column)
