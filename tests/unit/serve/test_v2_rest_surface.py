"""Every v2 REST path a client may call, on a real dispatcher and port (issue 37): errors in
the protocol's JSON shape for unknown paths and wrong methods, the model list and repository
index, the model's configuration and statistics, ``ready`` with its ``name``, metadata that
says what infer returns, gzip/deflate bodies within the byte cap, and the classification
extension refused clearly. The backend is in-process; it answers each sample with the index of
its largest value (an argmax model: INT64)."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from dispatcher_support import _serve_runner

from packrat.runtime import modelid
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher

TINY = modelid.zoo_input_spec("tiny")


class Argmax:
    kind = "fake"

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        values = array("f", body).tolist()
        return web.json_response(max(range(len(values)), key=values.__getitem__))


@asynccontextmanager
async def pod() -> AsyncIterator[tuple[Dispatcher, str, aiohttp.ClientSession]]:
    instances = [InstanceSpec(index=0, name="tiny_i0", threads=1, batch=4, cpus=(0,))]
    d = Dispatcher(model="tiny", instances=instances, backend=Argmax())
    d.inputs = TINY
    d.set_up(0, True)
    warm = await Argmax().forward("tiny_i0", {}, {}, array("f", [0.0] * 16).tobytes())
    assert isinstance(warm.body, bytes)
    d.learn_output(warm.body)  # what the pod does with its warm-up answer
    runner, url = await _serve_runner(d.runner())
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            yield d, url, session
    finally:
        await runner.cleanup()


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def request(n: int, **extra: Any) -> dict[str, Any]:
    data = [[float((i * 7 + j * 3) % 16) for j in range(16)] for i in range(n)]
    tensor = {"name": "input__0", "datatype": "FP32", "shape": [n, 16], "data": data}
    return {"inputs": [tensor], **extra}


async def answer(r: aiohttp.ClientResponse) -> tuple[int, str, Any]:
    return r.status, r.headers.get("Content-Type", ""), json.loads(await r.read())


def test_unknown_paths_and_wrong_methods_answer_the_protocols_json_error() -> None:
    async def go() -> None:
        async with pod() as (_, url, s):
            for method, path, status in (
                ("GET", "/v2/nothing/here", 404),
                ("GET", "/v2/models/tiny/infer", 405),
                ("DELETE", "/v2/models/tiny", 405),
                ("PUT", "/v2/health/ready", 405),
                ("POST", "/v2/models/tiny/versions/1/ready", 405),
            ):
                async with s.request(method, url + path) as r:
                    got, ctype, doc = await answer(r)
                assert (got, ctype) == (status, "application/json"), (method, path)
                assert set(doc) == {"error"} and path in doc["error"]
            async with s.get(url + "/predictions/nothing/at/all") as r:  # not v2: unchanged
                assert r.status == 404

    run(go())


def test_the_model_list_index_config_stats_and_ready_name() -> None:
    async def go() -> None:
        async with pod() as (d, url, s):
            async with s.get(url + "/v2/models") as r:
                assert (await answer(r))[2] == {"models": ["tiny"]}
            async with s.post(url + "/v2/repository/index") as r:
                assert (await answer(r))[2] == [{"name": "tiny", "version": "1", "state": "READY"}]
            async with s.get(url + "/v2/models/tiny/ready") as r:
                assert (await answer(r))[2] == {"name": "tiny", "ready": True}
            async with s.get(url + "/v2/models/tiny/config") as r:
                config = (await answer(r))[2]
            assert config["max_batch_size"] == d.max_samples == 4
            assert config["input"] == [{"name": "input__0", "data_type": "TYPE_FP32", "dims": [16]}]
            assert config["output"][0]["data_type"] == "TYPE_INT64"
            async with s.get(url + "/v2/models/other/config") as r:
                assert r.status == 404 and "error" in (await answer(r))[2]
            for _ in range(2):
                async with s.post(url + "/v2/models/tiny/infer", json=request(2)) as r:
                    assert r.status == 200
            async with s.post(url + "/v2/models/tiny/infer", json={"inputs": 1}) as r:
                assert r.status == 400
            async with s.get(url + "/v2/models/tiny/versions/1/stats") as r:
                (stats,) = (await answer(r))[2]["model_stats"]
            assert stats["name"] == "tiny" and stats["inference_count"] == 2
            assert stats["inference_stats"]["success"]["count"] == 2
            assert stats["inference_stats"]["fail"]["count"] == 1
            assert stats["inference_stats"]["success"]["ns"] > 0 and stats["last_inference"] > 0

    run(go())


def test_metadata_says_what_infer_returns() -> None:
    """An argmax model answers INT64 of shape [N]: the metadata says so (not FP32 [-1, -1])."""

    async def go() -> None:
        async with pod() as (_, url, s):
            async with s.get(url + "/v2/models/tiny") as r:
                (out,) = (await answer(r))[2]["outputs"]
            async with s.post(url + "/v2/models/tiny/infer", json=request(3)) as r:
                (got,) = (await answer(r))[2]["outputs"]
            assert out == {"name": "output__0", "datatype": "INT64", "shape": [-1]}
            assert got["datatype"] == out["datatype"]
            assert len(got["shape"]) == len(out["shape"]) and got["shape"][1:] == out["shape"][1:]
            assert got["shape"] == [3] and all(isinstance(v, int) for v in got["data"])

    run(go())


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bodies_infer_and_a_zip_bomb_is_413(encoding: str) -> None:
    def pack(raw: bytes) -> bytes:
        return gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)

    async def go() -> None:
        async with pod() as (d, url, s):
            plain = json.dumps(request(3)).encode()
            async with s.post(url + "/v2/models/tiny/infer", json=request(3)) as r:
                want = (await answer(r))[2]
            headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
            async with s.post(
                url + "/v2/models/tiny/infer", data=pack(plain), headers=headers
            ) as r:
                status, _, doc = await answer(r)
            assert status == 200 and doc == want
            cap = d.max_samples * d.max_body_bytes
            bomb = pack(b'{"inputs": [' + b" " * (cap + 1024) + b"]}")
            assert len(bomb) < cap // 100
            async with s.post(url + "/v2/models/tiny/infer", data=bomb, headers=headers) as r:
                status, _, doc = await answer(r)
            assert status == 413 and "too large" in doc["error"]
            assert d.budget.used == 0

    run(go())


def test_the_classification_extension_is_a_clear_400() -> None:
    async def go() -> None:
        async with pod() as (_, url, s):
            for params in ({"classification": 2}, {"class_count": 2}):
                doc = request(1, outputs=[{"name": "output__0", "parameters": params}])
                async with s.post(url + "/v2/models/tiny/infer", json=doc) as r:
                    status, _, body = await answer(r)
                assert status == 400 and "classification extension" in body["error"]

    run(go())
