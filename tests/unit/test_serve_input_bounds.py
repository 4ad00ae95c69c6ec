"""Issue 26, LOW items at the serving pod: NaN and 1e999 inputs answer a clear 400 (the model
would answer them back, and bare NaN is not JSON), a body far larger than one sample is
refused before a worker parses it (a per-model cap), and requests the pod refuses or sheds
are not arrivals for the tuner (a flood must not buy its sender replicas)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from dispatcher_support import all_up, post, run, stack

from packrat.serve.codec import (
    MIN_BODY_CAP,
    CodecError,
    decode_sample,
    encode_output,
    input_body_cap,
)

TINY = [{"dtype": "float32", "shape": [4]}]


@pytest.mark.parametrize(
    "body",
    [
        b"[1.0, NaN, 2.0, 3.0]",
        b"[1.0, Infinity, 2.0, 3.0]",
        b"[1.0, -Infinity, 2.0, 3.0]",
        b"[1e999, 0.0, 0.0, 0.0]",
        "[1.0, 1e999, 2.0, 3.0]",
        torch.tensor([1.0, math.nan, 2.0, 3.0]).numpy().tobytes(),  # raw bytes
    ],
)
def test_non_finite_inputs_are_a_clear_400(body: bytes | str) -> None:
    with pytest.raises(CodecError, match="finite"):
        decode_sample(body, TINY)
    assert len(decode_sample(b"[1, 2, 3, 4]", TINY)[0]) == 4


def test_a_non_finite_output_is_json_null() -> None:
    out = torch.tensor([[1.0, math.nan, math.inf], [0.5, 0.25, -math.inf]])
    assert json.loads(encode_output(out, 0)) == [1.0, None, None]
    assert json.loads(encode_output(out, 1)) == [0.5, 0.25, None]


def test_the_body_cap_follows_the_model_input() -> None:
    six_mib = 6 * 1024 * 1024
    assert input_body_cap(TINY, six_mib) == MIN_BODY_CAP
    resnet = [{"dtype": "float32", "shape": [3, 224, 224]}]
    assert input_body_cap(resnet, six_mib) == 8 * 3 * 224 * 224 * 4
    huge = [{"dtype": "float32", "shape": [3, 1024, 1024]}]
    assert input_body_cap(huge, six_mib) == six_mib
    assert input_body_cap([{"dtype": "qint8", "shape": [4]}], six_mib) == six_mib


def test_refused_and_shed_requests_are_not_arrivals() -> None:
    async def body() -> None:
        async with stack([1], max_body_bytes=1000, queue_limit=0) as (d, _fake, url, s):
            all_up(d)
            assert (await post(s, url, b"x" * 2000))[0] == 413
            async with s.post(f"{url}/predictions/other", data=b"x") as r:
                assert r.status == 404
            assert len(d.arrivals) == 0
            assert (await post(s, url))[0] == 200
            assert len(d.arrivals) == 1

    run(body)
