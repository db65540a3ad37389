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
    assert strict_yaml._safe_loader() is yaml.CSafeLoader


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
    assert (c[1].mark, c[1].path) == (python[1].mark, python[1].path)
    if name not in ("syntax", "bad-indent", "control-char"):
        assert c == python
    else:
        # libyaml words three errors its own way ("did not find expected ',' or ']'" for
        # "expected ',' or ']', but got ':'", "in this context" for "here", "control" for
        # "special" characters): the same place, a YAML error all the same
        assert c[1].message.startswith("YAML")
