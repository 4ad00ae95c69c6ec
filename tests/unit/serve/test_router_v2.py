"""A pipeline's router takes the Open Inference Protocol's infer as it takes ``/predictions``
(issue 37, one data plane): each sample of a v2 request is one query through the DAG and one
arrival in the pipeline's ingress; the last stage's rows come back stacked. Real router, real
stage Services (aiohttp apps): stage ``a`` answers the sum of its raw floats as a JSON row,
stage ``b`` doubles the JSON it is given; a negative first value is ``a``'s 400."""

from __future__ import annotations

import asyncio
import json
from array import array
from typing import Any

import aiohttp
from aiohttp import web

from packrat.plan.pipeline.simulate import Edge
from packrat.serve.router import Router, RouterConfig


async def stage_a(request: web.Request) -> web.Response:
    values = array("f", await request.read()).tolist()
    if values and values[0] < 0:
        return web.json_response({"code": 400, "message": "negative"}, status=400)
    return web.json_response([sum(values)])


async def stage_b(request: web.Request) -> web.Response:
    row = json.loads(await request.read())
    return web.json_response([2 * v for v in row])


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def test_a_v2_request_runs_each_sample_through_the_pipeline() -> None:
    async def go() -> None:
        stages = web.Application()
        stages.router.add_post("/predictions/a", stage_a)
        stages.router.add_post("/predictions/b", stage_b)
        backend, surl = await serve(stages)
        urls = {"a": f"{surl}/predictions/a", "b": f"{surl}/predictions/b"}
        router = Router(RouterConfig("p", urls, [Edge("a", "b")]))
        front, url = await serve(router.app())
        rows = [[float(i + j) for j in range(4)] for i in range(3)]
        doc: dict[str, Any] = {
            "id": "q",
            "inputs": [{"name": "input__0", "datatype": "FP32", "shape": [3, 4], "data": rows}],
        }
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{url}/v2/models/p/infer", json=doc) as r:
                    assert r.status == 200
                    answer = await r.json()
                    assert r.headers["X-Packrat-Path"] == "a,b"
                (out,) = answer["outputs"]
                assert out["shape"] == [3, 1] and answer["id"] == "q"
                assert out["data"] == [2 * sum(row) for row in rows]
                assert router.arrivals.total == 3  # three samples, three queries
                rows[1][0] = -1.0
                async with s.post(f"{url}/v2/models/p/infer", json=doc) as r:
                    assert r.status == 400 and "stage a" in (await r.json())["error"]
                async with s.post(f"{url}/v2/models/p/infer", data=b"{") as r:
                    assert r.status == 400 and "error" in await r.json()
                async with s.post(f"{url}/v2/models/other/infer", json=doc) as r:
                    assert r.status == 404
            assert router.budget.used == 0
        finally:
            await front.cleanup()
            await backend.cleanup()

    asyncio.run(asyncio.wait_for(go(), 60))
