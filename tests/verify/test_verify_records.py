"""The verify child's records read as untrusted input, and no test variable in shipped code."""

from __future__ import annotations

import json
import re

from conftest import REPO
from egpu_setup.verify.records import MAX_TEXT, Malformed, read_record
from egpu_setup.verify.runner import child_env


def test_a_clean_check_keeps_its_fields_and_drops_unknown_ones() -> None:
    line = json.dumps({"kind": "check", "id": "matmul-fp32", "status": "pass", "detail": "ok",
                       "value": 1.5, "seconds": 0.2, "evil": "x"})  # fmt: skip
    rec = read_record(line)
    assert isinstance(rec, dict) and "evil" not in rec and rec["value"] == 1.5


def test_nan_and_infinity_become_none_and_text_is_capped() -> None:
    line = ('{"kind": "check", "id": "x", "status": "warn", "detail": "' + "d" * 9000
            + '", "value": NaN, "expected": [Infinity, 1], "seconds": -Infinity}')  # fmt: skip
    rec = read_record(line)
    assert isinstance(rec, dict)
    assert rec["value"] is None and rec["expected"] == [None, 1] and rec["seconds"] is None
    assert len(rec["detail"]) == MAX_TEXT


def test_malformed_records_are_named_and_plain_lines_ignored() -> None:
    for line in ('{"kind": "check", "id": "' + "a" * 65 + '", "status": "pass"}',
                 '{"kind": "check", "id": "Bad Id", "status": "pass"}',
                 '{"kind": "check", "id": "x", "status": "great"}',
                 '{"kind": "check", "id": "x", "status": "pass", "detail": 3}',
                 '{"kind": "what"}', "{not json", "[1]"[:0] + "{" + "[" * 100000):  # fmt: skip
        assert isinstance(read_record(line), Malformed), line
    assert read_record("a banner from a sitecustomize") is None


def test_the_child_environment_is_minimal() -> None:
    env = child_env({"PATH": "/home/u/bin:.", "EGPU_SETUP_STATE_DIR": "/x", "PYTHONPATH": "/p",
                     "CUDA_VISIBLE_DEVICES": "1", "LD_PRELOAD": "/e.so",
                     "HSA_OVERRIDE_GFX_VERSION": "10.3.0", "HIP_VISIBLE_DEVICES": "0"},
                    REPO)  # fmt: skip
    assert env == {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": str(REPO),
                   "CUDA_VISIBLE_DEVICES": "1", "HSA_OVERRIDE_GFX_VERSION": "10.3.0",
                   "HIP_VISIBLE_DEVICES": "0"}  # fmt: skip


def test_shipped_verify_code_reads_no_test_variable() -> None:
    names = re.compile(r"EGPU_SETUP_(?:VERIFY_)?TEST_\w+")
    hits = [f"{p}: {m.group(0)}" for p in (REPO / "egpu_setup" / "verify").rglob("*.py")
            for m in names.finditer(p.read_text())]  # fmt: skip
    assert hits == []
