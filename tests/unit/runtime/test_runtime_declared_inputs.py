"""A model file's declared inputs (packrat.runtime.inputs): the KServe/OIP, Triton and
sample-request forms, each bad declaration one line, bounds, and the round trip through
the environment every started process reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packrat.runtime import inputs as decl

OIP = [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 8]}]
WANT = [{"name": "x", "shape": [3, 8], "dtype": "float32", "high": 0}]


@pytest.mark.parametrize(
    "given",
    [
        OIP,
        {"inputs": OIP},
        {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 8]}]},  # Triton
        [{"name": "x", "dtype": "float32", "dims": [3, 8]}],
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3, 8], "data": [0] * 48}]},
    ],
)
def test_every_form_gives_the_same_inputs(given: object) -> None:
    assert decl.parse_inputs(given) == WANT


def test_integer_inputs_keep_their_bound() -> None:
    got = decl.parse_inputs(
        [{"name": "ids", "datatype": "INT64", "shape": [-1, 128], "high": 30522}]
    )
    assert got == [{"name": "ids", "shape": [128], "dtype": "int64", "high": 30522}]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([], "non-empty list"),
        ({"outputs": []}, "'inputs' or 'input'"),
        ([{"name": "x", "datatype": "FP32", "shape": [3, 8]}], "must start with -1"),
        ([{"name": "x", "datatype": "FP32", "shape": [-1, -1]}], "only the batch may vary"),
        ([{"name": "x", "datatype": "FP32", "shape": [-1, 0]}], "each >= 1"),
        ([{"name": "x", "datatype": "FP16", "shape": [-1, 2]}], "not one of"),
        ([{"name": "x", "datatype": "BYTES", "shape": [-1]}], "not one of"),
        ([{"name": "x", "datatype": "FP32", "dims": [2], "shape": [-1, 2]}], "give shape"),
        ([{"name": "x", "datatype": "FP32", "dtype": "float32", "dims": [2]}], "give one of"),
        ([{"name": "x", "datatype": "FP32", "dims": [2], "extra": 1}], "unknown field 'extra'"),
        ([{"name": "../x", "datatype": "FP32", "dims": [2]}], "name must match"),
        ([{"name": "x", "datatype": "FP32", "dims": [2], "high": 5}], "integer inputs only"),
        ([{"name": "x", "datatype": "FP32", "dims": [True]}], "array of integers"),
        ([{"name": "x", "datatype": "FP32", "dims": [1 << 14, 1 << 14]}], "elements per sample"),
        ([{"name": "x", "datatype": "FP32", "dims": [1] * 9}], "at most 8 dimensions"),
        ([{"name": "x", "datatype": "FP32", "dims": [2]}] * 2, "distinct"),
        ([{"name": f"x{k}", "datatype": "FP32", "dims": [2]} for k in range(65)], "at most 64"),
        (
            {
                "inputs": [
                    {"name": "a", "datatype": "FP32", "shape": [2, 1], "data": [0, 0]},
                    {"name": "b", "datatype": "FP32", "shape": [3, 1], "data": [0] * 3},
                ]
            },
            "same batch size",
        ),
    ],
)
def test_a_bad_declaration_is_one_line(given: object, says: str) -> None:
    with pytest.raises(decl.InputsError, match=None) as info:
        decl.parse_inputs(given)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_the_option_reads_json_or_a_bounded_file(tmp_path: Path) -> None:
    assert decl.parse_option(json.dumps(OIP)) == WANT
    (tmp_path / "request.json").write_text(
        json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8], "data": []}]})
    )
    assert decl.parse_option(f"@{tmp_path / 'request.json'}") == WANT
    (tmp_path / "big.json").write_bytes(b" " * (decl.MAX_TEXT + 1))
    with pytest.raises(decl.InputsError, match="larger than"):
        decl.parse_option(f"@{tmp_path / 'big.json'}")
    with pytest.raises(decl.InputsError, match="cannot read"):
        decl.parse_option(f"@{tmp_path / 'missing.json'}")
    with pytest.raises(decl.InputsError, match="not JSON"):
        decl.parse_option("[{")


def test_declared_inputs_reach_started_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(decl.ENV, "")  # restored after the test
    assert decl.declared() is None
    decl.declare(WANT)
    assert decl.declared() == WANT
    assert decl.parse_inputs(json.loads(decl.encode(WANT))) == WANT
    monkeypatch.setenv(decl.ENV, '[{"name": "x"}]')
    with pytest.raises(decl.InputsError, match=decl.ENV):
        decl.declared()
