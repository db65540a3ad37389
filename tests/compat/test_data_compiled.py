"""The shipped data's compiled form (egpu_setup/data/compiled/*.json) says what its YAML says.

The YAML is the source people edit; the program reads the JSON (fast to parse on every start).
These fail as soon as one is edited without `python scripts/compile_data.py`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from conftest import REPO
from egpu_setup.compat import shipped as data
from egpu_setup.errors import MatrixError

DATA = REPO / "egpu_setup" / "data"
YAMLS = sorted(p.name for p in DATA.glob("*.yaml"))


def _compiler() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compile_data", REPO / "scripts/compile_data.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_yaml_file_is_a_known_source_with_a_compiled_form() -> None:
    assert list(data.SOURCES) == YAMLS
    compiled = sorted(p.stem for p in (DATA / "compiled").glob("*.json"))
    assert compiled == [Path(n).stem for n in YAMLS]


@pytest.mark.parametrize("name", YAMLS)
def test_the_compiled_file_is_current(name: str) -> None:
    committed = Path(data.compiled_path(name)).read_text(encoding="utf-8")
    assert committed == _compiler().compile_one(DATA / name), (
        f"egpu_setup/data/compiled/{Path(name).stem}.json is stale: "
        "run python scripts/compile_data.py"
    )


@pytest.mark.parametrize("name", YAMLS)
def test_the_loader_returns_what_the_yaml_says(name: str) -> None:
    assert data.load(name) == yaml.safe_load((DATA / name).read_text(encoding="utf-8"))


def test_a_value_json_would_change_is_refused_at_compile_time(tmp_path: Path) -> None:
    compiler = _compiler()
    for text, why in (
        ("released: 2025-01-29\n", "does not survive JSON"),  # a date
        ("cuda: 12.10\n", "does not survive JSON"),  # a float: would read back as 12.1
        ("570: x\n", "is not a string"),  # an integer key
    ):
        source = tmp_path / "bad.yaml"
        source.write_text(text)
        with pytest.raises(ValueError, match=why):
            compiler.compile_one(source)


def test_a_missing_or_damaged_compiled_file_is_a_matrix_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(data, "COMPILED_DIR", str(tmp_path))
    data.load.cache_clear()
    try:
        with pytest.raises(MatrixError, match="cannot be read") as missing:
            data.load("cuda.yaml")
        assert "compile_data.py" in (missing.value.hint or "")
        (tmp_path / "cuda.json").write_text('{"data": ')
        with pytest.raises(MatrixError, match="cannot be read"):
            data.load("cuda.yaml")
        (tmp_path / "cuda.json").write_text(json.dumps({"data": ["not", "a", "mapping"]}))
        with pytest.raises(MatrixError, match="expected a mapping"):
            data.load("cuda.yaml")
        with pytest.raises(ValueError, match="not a shipped data file"):
            data.load("../profile.schema.json")
    finally:
        data.load.cache_clear()
