"""The native handler's wire format: JSON or raw bytes in, JSON out, errors per request."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.serve.codec import CodecError, decode_sample, encode_output, encode_sample

ONE = [{"shape": [2, 3], "dtype": "float32"}]
TWO = [{"shape": [4], "dtype": "int64"}, {"shape": [4], "dtype": "int64"}]


def test_raw_bytes_roundtrip() -> None:
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    (y,) = decode_sample(encode_sample([x]), ONE)
    assert torch.equal(x, y)


def test_raw_bytes_with_two_inputs() -> None:
    a, b = torch.arange(4), torch.arange(4, 8)
    ya, yb = decode_sample(bytearray(encode_sample([a, b])), TWO)
    assert torch.equal(a, ya) and torch.equal(b, yb)


def test_json_bytes_and_parsed_json() -> None:
    sample = [[0, 1, 2], [3, 4, 5]]
    for body in (json.dumps(sample).encode(), sample, {"inputs": sample}, json.dumps(sample)):
        (y,) = decode_sample(body, ONE)
        assert y.dtype == torch.float32 and y.shape == (2, 3)
    a, b = decode_sample([[1, 2, 3, 4], [5, 6, 7, 8]], TWO)
    assert a.dtype == torch.int64 and b.tolist() == [5, 6, 7, 8]


def test_unknown_inputs_accept_json_only() -> None:
    (y,) = decode_sample([1.0, 2.0], None)
    assert y.tolist() == [1.0, 2.0]
    with pytest.raises(CodecError):
        decode_sample(b"\x00\x01", None)


@pytest.mark.parametrize(
    "body",
    [
        b"garbage",
        b"\xff\xfe",
        b'{"x": 1}',
        b"[[1, 2], [3, 4]]",
        b'[["a", "b", "c"], [1, 2, 3]]',
        42,
    ],
)
def test_malformed_bodies_raise_codec_errors(body: object) -> None:
    with pytest.raises(CodecError):
        decode_sample(body, ONE)


def test_wrong_number_of_inputs() -> None:
    with pytest.raises(CodecError, match="expected 2 inputs"):
        decode_sample([[1, 2, 3, 4]], TWO)


def test_encode_output_picks_the_row_and_first_output() -> None:
    out = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert json.loads(encode_output(out, 1)) == [3.0, 4.0]
    assert json.loads(encode_output((out, out * 0), 0)) == [1.0, 2.0]
    assert json.loads(encode_output({"logits": out}, 0)) == [1.0, 2.0]


HOSTILE = [
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError inside json
    ("[" + "1" * 5000 + "]").encode(),  # ValueError: integer string too long
    b"[1e999, 2]",  # inf: a float, then a wrong shape
    b'{"inputs": {"a": 1}}',
    b'{"inputs": [[1, 2, 3], [4, 5, 6]], "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "[" * 5000 + "]" * 5000,  # a str body (TorchServe decoded text)
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],  # deep, numeric
    [10**5000],  # an int too large for any tensor dtype
    [[1, 2, 3], [4, 5, float("nan")]][:1],
    {"inputs": None},
]


@pytest.mark.parametrize("body", HOSTILE)
def test_hostile_bodies_raise_only_codec_errors(body: object) -> None:
    with pytest.raises(CodecError):
        decode_sample(body, ONE)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["inputs", "x"]), children, max_size=2)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=200) | json_values)
def test_fuzz_decode_never_raises_anything_but_codec_error(body: object) -> None:
    for inputs in (ONE, TWO, None):
        try:
            tensors = decode_sample(body, inputs)
        except CodecError:
            continue
        assert all(isinstance(t, torch.Tensor) for t in tensors)


@settings(max_examples=100, deadline=None)
@given(body=json_values)
def test_fuzz_json_text_of_any_value(body: object) -> None:
    text = json.dumps(body).encode()
    with contextlib.suppress(CodecError):
        decode_sample(text, ONE)
