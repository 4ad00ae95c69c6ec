"""The Open Inference Protocol (v2) at the dispatcher, without processes: the codec against the
protocol's JSON objects (schemas below, written from the protocol's text: "$inference_request",
"$inference_response", "$metadata_model_response", "$metadata_server_response",
"$inference_error_response"), hostile requests, and the routes on a real dispatcher in front
of an in-process backend that answers like the model service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from array import array
from collections.abc import Mapping
from typing import Any

import aiohttp
import jsonschema
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.runtime import modelid
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.v2_codec import (
    InferRequest,
    V2Error,
    build_response,
    model_metadata,
    parse_request,
    split_samples,
)

# -- the protocol's objects as JSON Schema ------------------------------------------------------
_PARAMETERS = {"type": "object"}
_TENSOR_DATA = {"type": "array"}
_METADATA_TENSOR = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "parameters": _PARAMETERS,
    },
}
MODEL_METADATA = {
    "type": "object",
    "required": ["name", "platform", "inputs", "outputs"],
    "properties": {
        "name": {"type": "string"},
        "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"},
        "inputs": {"type": "array", "items": _METADATA_TENSOR},
        "outputs": {"type": "array", "items": _METADATA_TENSOR},
        "parameters": _PARAMETERS,
    },
}
SERVER_METADATA = {
    "type": "object",
    "required": ["name", "version", "extensions"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}},
    },
}
_OUTPUT = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {
            "enum": ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64", "BYTES"]
        },
        "parameters": _PARAMETERS,
        "data": _TENSOR_DATA,
    },
    # "data" is required unless the binary tensor extension carries the values
    "anyOf": [
        {"required": ["data"]},
        {
            "required": ["parameters"],
            "properties": {"parameters": {"required": ["binary_data_size"]}},
        },
    ],
}
INFERENCE_RESPONSE = {
    "type": "object",
    "required": ["model_name", "outputs"],
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "outputs": {"type": "array", "items": _OUTPUT},
    },
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
    "additionalProperties": False,
}
TINY = modelid.zoo_input_spec("tiny")
assert TINY is not None


def _request(x: list[list[float]], **extra: Any) -> bytes:
    doc = {"inputs": [{"name": "input__0", "shape": [len(x), 16], "datatype": "FP32", "data": x}]}
    return json.dumps({**doc, **extra}).encode()


def _rows(n: int) -> list[list[float]]:
    return [[float(i * 16 + j) / 7 for j in range(16)] for i in range(n)]


def test_a_json_request_splits_into_the_raw_bodies_of_its_samples() -> None:
    rows = _rows(3)
    samples = split_samples(parse_request(_request(rows, id="a"), None), TINY)
    assert [s for s in samples] == [
        (array("f", row).tobytes(), "application/octet-stream") for row in rows
    ]


def test_a_binary_request_splits_like_its_json_twin() -> None:
    rows = _rows(2)
    raw = array("f", [v for row in rows for v in row]).tobytes()
    head = json.dumps(
        {
            "inputs": [
                {"name": "input__0", "shape": [2, 16], "datatype": "FP32",
                 "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()  # fmt: skip
    binary = split_samples(parse_request(head + raw, len(head)), TINY)
    assert binary == split_samples(parse_request(_request(rows), None), TINY)


@pytest.mark.parametrize(
    ("body", "header", "message"),
    [
        (b"{", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b'{"inputs": []}', None, "non-empty"),
        (b'{"inputs": [{"name": "input__0", "shape": [1, 16], "datatype": "FP32"}]}', None,
         "'data' must be"),
        (_request([[1.0] * 15]), None, "needs 16 values"),
        (_request(_rows(1)), 9999, "not within the body"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP16", "data": [1]}]}', None,
         "not supported"),
        (b'{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}', None,
         "non-negative"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 1e99]}]}',
         None, "integers"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [300]}]}', None,
         "does not fit"),
    ],
)  # fmt: skip
def test_malformed_requests_are_one_clear_v2_error(
    body: bytes, header: int | None, message: str
) -> None:
    with pytest.raises(V2Error, match=message):
        parse_request(body, header)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"inputs": [{"name": "input__0", "shape": [1, 15], "datatype": "FP32",
                      "data": [0.0] * 15}]}, "shape"),
        ({"inputs": [{"name": "input__0", "shape": [1, 16], "datatype": "INT64",
                      "data": [0] * 16}]}, "datatype"),
        ({"inputs": [{"name": "input__0", "shape": [0, 16], "datatype": "FP32", "data": []}]},
         "1..1024 samples"),
    ],
)  # fmt: skip
def test_a_request_the_model_cannot_take_is_a_v2_error(doc: Any, message: str) -> None:
    with pytest.raises(V2Error, match=message):
        split_samples(parse_request(json.dumps(doc).encode(), None), TINY)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.one_of(st.none(), st.integers(-5, 400)))
def test_any_bytes_parse_or_are_a_v2_error(body: bytes, header: int | None) -> None:
    with contextlib.suppress(V2Error):
        split_samples(parse_request(body, header), TINY)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_any_json_document_parses_or_is_a_v2_error(doc: Any) -> None:
    for body in (json.dumps(doc), json.dumps({"inputs": [doc]}), json.dumps({"inputs": doc})):
        with contextlib.suppress(V2Error):
            split_samples(parse_request(body.encode(), None), TINY)


def test_deeply_nested_data_is_refused_not_recursed() -> None:
    data = "[" * 100_000 + "1" + "]" * 100_000
    body = '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ' + data + "}]}"
    with pytest.raises(V2Error):
        parse_request(body.encode(), None)


def test_responses_match_the_protocols_objects_in_json_and_binary() -> None:
    answers = [json.dumps([0.5, -1.0, 2.0, 3.25]).encode() for _ in range(3)]
    req = parse_request(_request(_rows(3), id="q"), None)
    body, head = build_response("tiny", req, answers, raw_bytes=False)
    assert head is None
    doc = json.loads(body)
    jsonschema.validate(doc, INFERENCE_RESPONSE)
    assert doc["id"] == "q" and doc["outputs"][0]["shape"] == [3, 4]
    assert doc["outputs"][0]["data"][:4] == [0.5, -1.0, 2.0, 3.25]
    binary_req = InferRequest(id=None, inputs=req.inputs, binary={"output__0": True})
    body, head = build_response("tiny", binary_req, answers, raw_bytes=False)
    assert head is not None
    doc = json.loads(body[:head])
    jsonschema.validate(doc, INFERENCE_RESPONSE)
    assert array("f", body[head:]).tolist() == [0.5, -1.0, 2.0, 3.25] * 3
    with pytest.raises(V2Error, match="unknown output"):
        build_response("tiny", InferRequest(None, req.inputs, {"nope": False}), answers,
                       raw_bytes=False)  # fmt: skip


def test_a_mar_takes_and_answers_bytes() -> None:
    items = [b"hello", b"\x00\x01"]
    payload = b"".join(struct.pack("<I", len(i)) + i for i in items)
    head = json.dumps(
        {"inputs": [{"name": "input__0", "shape": [2], "datatype": "BYTES",
                     "parameters": {"binary_data_size": len(payload)}}]}
    ).encode()  # fmt: skip
    req = parse_request(head + payload, len(head))
    assert [b for b, _ in split_samples(req, None)] == items
    body, header = build_response("user", req, [b'{"n": 1}', b"ok"], raw_bytes=True)
    assert header is None
    doc = json.loads(body)
    jsonschema.validate(doc, INFERENCE_RESPONSE)
    assert doc["outputs"][0] == {"name": "output__0", "datatype": "BYTES", "shape": [2],
                                 "data": ['{"n": 1}', "ok"]}  # fmt: skip


def test_model_metadata_matches_the_protocols_object() -> None:
    for inputs in (TINY, modelid.zoo_input_spec("bert-base"), None):
        jsonschema.validate(model_metadata("m", inputs), MODEL_METADATA)
    assert model_metadata("tiny", TINY)["inputs"] == [
        {"name": "input__0", "datatype": "FP32", "shape": [-1, 16]}
    ]


# -- the routes on a real dispatcher ----------------------------------------------------------
class RowBackend:
    """Answers each sample like the model service: the JSON row [sum of its floats]; a
    sample whose first float is negative is a 400 of its own."""

    kind = "fake"

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        values = array("f", body).tolist()
        if values and values[0] < 0:
            doc = {"code": 400, "type": "BadRequest", "message": "negative"}
            return web.json_response(doc, status=400)
        return web.Response(
            body=json.dumps([sum(values)]).encode(), content_type="application/json"
        )


async def _stack() -> tuple[Dispatcher, web.AppRunner, str]:
    instances = [InstanceSpec(index=i, name=f"tiny_i{i}", threads=1, batch=2, cpus=(i,))
                 for i in range(2)]  # fmt: skip
    d = Dispatcher(model="tiny", instances=instances, backend=RowBackend())
    d.inputs = TINY
    runner = d.runner()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return d, runner, f"http://{host}:{port}"


def test_the_routes_answer_health_metadata_and_inference() -> None:
    async def go() -> None:
        d, runner, url = await _stack()
        try:
            async with aiohttp.ClientSession() as s:

                async def get(path: str) -> tuple[int, Any]:
                    async with s.get(url + path) as r:
                        return r.status, await r.json()

                assert (await get("/v2/health/live"))[0] == 200
                assert await get("/v2/health/ready") == (400, {"ready": False})
                assert (await get("/v2/models/tiny/ready"))[0] == 400
                for i in range(2):
                    d.set_up(i, True)
                assert await get("/v2/health/ready") == (200, {"ready": True})
                assert (await get("/v2/models/tiny/versions/1/ready"))[0] == 200
                status, doc = await get("/v2/models/other")
                assert status == 404
                jsonschema.validate(doc, ERROR)
                jsonschema.validate((await get("/v2"))[1], SERVER_METADATA)
                jsonschema.validate((await get("/v2/models/tiny"))[1], MODEL_METADATA)

                async def infer(body: bytes) -> tuple[int, Any]:
                    async with s.post(url + "/v2/models/tiny/infer", data=body) as r:
                        return r.status, await r.json()

                rows = _rows(5)
                status, doc = await infer(_request(rows))
                assert status == 200
                jsonschema.validate(doc, INFERENCE_RESPONSE)
                assert doc["outputs"][0]["shape"] == [5, 1]
                expected = [sum(array("f", row).tolist()) for row in rows]
                assert doc["outputs"][0]["data"] == pytest.approx(expected)
                status, doc = await infer(b'{"inputs": 1}')
                assert status == 400
                jsonschema.validate(doc, ERROR)
                for header in ("x", "9" * 5000, "-1"):  # the binary extension's header
                    async with s.post(
                        url + "/v2/models/tiny/infer",
                        data=_request(rows),
                        headers={"Inference-Header-Content-Length": header},
                    ) as r:
                        assert r.status == 400, header
                        jsonschema.validate(await r.json(), ERROR)
                status, doc = await infer(_request([[-1.0] * 16, [1.0] * 16]))
                assert (status, doc) == (400, {"error": "negative"})
                assert d.buffered_bytes == 0 and d.pending == 0
            metrics = d.metrics.requests
            assert metrics.labels("tiny", "200")._value.get() == 1
            assert metrics.labels("tiny", "400")._value.get() == 5
        finally:
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_v2_batch_may_exceed_the_one_sample_body_cap() -> None:
    """The pod lowers ``max_body_bytes`` to one sample's worth for ``/predictions``; a v2
    request carries a batch, so it is held to the pod's own ceiling instead."""

    async def go() -> None:
        d, runner, url = await _stack()
        try:
            for i in range(2):
                d.set_up(i, True)
            body = _request(_rows(64))
            d.max_body_bytes = len(body) // 4  # what the pod sets for one sample
            async with aiohttp.ClientSession() as s:
                async with s.post(url + "/v2/models/tiny/infer", data=body) as r:
                    assert r.status == 200
                    assert (await r.json())["outputs"][0]["shape"] == [64, 1]
                async with s.post(url + "/predictions/tiny", data=body) as r:
                    assert r.status == 413
        finally:
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(go(), 30))
