"""One data plane (issue 37): a v2 request, over REST or gRPC, meets the canary split and the
request log as a ``/predictions`` request does (shedding and the tuner's arrivals by samples:
test_v2_hostile_bodies.py and test_oip_grpc_dispatcher.py). A real dispatcher on real ports,
a real canary Service (an aiohttp app answering ``/predictions/{model}``), a real JSON-lines
request log; the stable instances answer [sum], the canary [-1.0]."""

from __future__ import annotations

import asyncio
import base64
import json
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from packrat.runtime import modelid
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.metrics import ServeMetrics
from packrat.serve.dispatcher.oip.grpc_server import GrpcFront
from packrat.serve.dispatcher.oip.messages import SERVICE, message
from packrat.serve.dispatcher.payload_log import PayloadLogConfig, PayloadLogger

TINY = modelid.zoo_input_spec("tiny")
ROWS = [[float(i + j) for j in range(16)] for i in range(3)]


class Sums:
    kind = "fake"

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        return web.json_response([sum(array("f", body).tolist())])


@asynccontextmanager
async def plane(
    log: Path | None = None,
) -> AsyncIterator[tuple[Dispatcher, str, str, list[int], str]]:
    canary_hits: list[int] = []

    async def canary(request: web.Request) -> web.Response:
        canary_hits.append(len(await request.read()))
        return web.json_response([-1.0])

    canary_app = web.Application()
    canary_app.router.add_post("/predictions/{model}", canary)
    canary_runner = web.AppRunner(canary_app)
    await canary_runner.setup()
    await web.TCPSite(canary_runner, "127.0.0.1", 0).start()
    host, port = canary_runner.addresses[0][:2]
    canary_url = f"http://{host}:{port}/predictions/tiny"
    metrics = ServeMetrics()
    payload_log = None
    if log is not None:
        config = PayloadLogConfig(sink=f"jsonl:{log}")
        payload_log = PayloadLogger(config, model="tiny", registry=metrics.registry)
    instances = [InstanceSpec(index=0, name="tiny_i0", threads=1, batch=4, cpus=(0,))]
    d = Dispatcher(
        model="tiny", instances=instances, backend=Sums(), metrics=metrics, payload_log=payload_log
    )
    d.inputs = TINY
    d.set_up(0, True)
    runner = d.runner()
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    front = GrpcFront(d)
    grpc_port = await front.start("127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        yield d, f"http://{host}:{port}", f"127.0.0.1:{grpc_port}", canary_hits, canary_url
    finally:
        await front.stop(None)
        await runner.cleanup()
        await canary_runner.cleanup()


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


async def rest_infer(url: str) -> tuple[list[float], str | None]:
    doc = {"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [3, 16], "data": ROWS}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v2/models/tiny/infer", json=doc, headers={"X-Request-Id": "rest-1"}) as r,
    ):
        assert r.status == 200
        return (await r.json())["outputs"][0]["data"], r.headers.get("X-Packrat-Canary")


async def grpc_infer(target: str) -> tuple[list[float], str | None]:
    req = message("ModelInferRequest")(model_name="tiny")
    t = req.inputs.add(name="input__0", datatype="FP32", shape=[3, 16])
    t.contents.fp32_contents.extend([v for row in ROWS for v in row])
    async with grpc.aio.insecure_channel(target) as channel:
        rpc = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=message("ModelInferResponse").FromString,
        )
        call = rpc(req, timeout=10, metadata=(("x-request-id", "grpc-1"),))
        answer = await call
        trailing = dict(await call.trailing_metadata() or ())
    values = array("f", answer.raw_output_contents[0]).tolist()
    return values, trailing.get("x-packrat-canary")


INFER = {"rest": lambda url, _t: rest_infer(url), "grpc": lambda _u, target: grpc_infer(target)}


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_the_canary_split_takes_v2_samples_as_it_takes_predictions(protocol: str) -> None:
    async def go() -> None:
        async with plane() as (d, url, target, hits, canary_url):
            d.canary.configure(canary_url, 100)
            values, marked = await INFER[protocol](url, target)
            assert values == [-1.0] * 3 and marked == "true"  # 3 of 3 samples: the canary's
            assert len(hits) == 3 and hits[0] == 64  # each a raw /predictions body
            assert d.canary.counts["served"] == 3
            d.canary.configure(None, 0)
            values, marked = await INFER[protocol](url, target)
            assert values == [sum(row) for row in ROWS] and marked is None
            assert len(hits) == 3

    run(go())


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_the_request_log_records_v2_requests(protocol: str, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"

    async def go() -> None:
        async with plane(log) as (_, url, target, _hits, _canary):
            for _ in range(2):
                await INFER[protocol](url, target)

    run(go())
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2 and {r["status"] for r in records} == {200}
    first = records[0]
    assert first["id"] == f"{protocol}-1"
    if protocol == "rest":
        assert json.loads(first["request"]["body"])["inputs"][0]["shape"] == [3, 16]
        assert json.loads(first["response"]["body"])["outputs"][0]["shape"] == [3, 1]
    else:
        raw = base64.b64decode(first["request"]["bodyBase64"])
        parsed = message("ModelInferRequest").FromString(raw)
        assert list(parsed.inputs[0].shape) == [3, 16]
        answer = message("ModelInferResponse").FromString(
            base64.b64decode(first["response"]["bodyBase64"])
        )
        assert list(answer.outputs[0].shape) == [3, 1]
