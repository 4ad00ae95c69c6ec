"""Token ids outside the model's vocabulary are the request's own 400 before the model runs.

An integer input declared with ``high`` (BERT's and GPT-2's token ids: ``[0, high)``; a model
file's ``--inputs``) must hold ids in range: before, an id of -1, 30522 or 2**62 reached the
embedding, whose IndexError was a 500 in the pool and, in a serving pod, failed the whole
batch, which the handler then ran again one request at a time. A non-integer (1.5) for an
integer input was truncated to 1; now it is refused."""

from __future__ import annotations

import json

import pytest
import torch

from packrat.runtime import zoo
from packrat.serve import codec
from packrat.serve.codec import CodecError, decode_sample

BERT = zoo.input_spec("bert-base")  # int64 [128], high 30522
IDS = [{"name": "ids", "dtype": "int64", "shape": [4], "high": 10}]


def _raw(values: list[int]) -> bytes:
    return torch.tensor(values, dtype=torch.int64).numpy().tobytes()


@pytest.mark.parametrize("bad", [-1, 10, 30522, 2**62, -(2**63)])
def test_ids_out_of_range_are_refused_as_json_and_as_raw_bytes(bad: int) -> None:
    for body in (json.dumps([0, 1, bad, 2]).encode(), _raw([0, 1, bad, 2])):
        with pytest.raises(CodecError, match=rf"input 0 has id {bad}: ids are in 0\.\.9"):
            decode_sample(body, IDS)


def test_a_zoo_models_vocabulary_bounds_its_ids() -> None:
    assert BERT[0]["high"] == 30522
    body = json.dumps([30521] * 127 + [30522]).encode()
    with pytest.raises(CodecError, match="30522"):
        decode_sample(body, BERT)
    (ok,) = decode_sample(json.dumps([30521] * 128).encode(), BERT)
    assert ok.dtype == torch.int64 and int(ok.max()) == 30521
    assert decode_sample(codec.example_body("bert-base"), BERT)[0].shape == (128,)


def test_a_non_integer_for_an_integer_input_is_refused_not_truncated() -> None:
    with pytest.raises(CodecError, match="non-integers"):
        decode_sample(b"[0, 1.5, 2, 3]", IDS)
    (whole,) = decode_sample(b"[0, 1.0, 2, 3]", IDS)  # integral floats are the integers
    assert whole.tolist() == [0, 1, 2, 3]


def test_inputs_without_a_bound_are_unchanged() -> None:
    free = [{"dtype": "int64", "shape": [2]}, {"dtype": "float32", "shape": [2]}]
    ids, x = decode_sample(json.dumps([[-5, 10**9], [-1.5, 2.0]]).encode(), free)
    assert ids.tolist() == [-5, 10**9] and x.tolist() == [-1.5, 2.0]
