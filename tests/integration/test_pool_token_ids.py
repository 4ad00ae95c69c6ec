"""A pool hosting BERT-base beside another model: token ids outside BERT's vocabulary (-1,
30522, 2**62), sent as JSON, raw bytes or v2, are a 400 for that request alone; BERT answers
the next good request and the other model never stops answering. Before, the embedding's
IndexError was a 500 with a traceback in the pod's log. Real pool, real BERT-base layer file
(440 MB, written once for the module), real HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from packrat.serve import codec
from packrat.serve.pool.app import build_app
from packrat.serve.pool.host import Pool, load_config


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Pool:
    directory = tmp_path_factory.mktemp("pool")
    models = [{"name": "bert", "spec": "bert-base"}, {"name": "small", "spec": "tiny"}]
    return Pool(load_config({"directory": str(directory), "budget_bytes": 1 << 30,
                             "models": models}))  # fmt: skip


def _v2(ids: list[int]) -> bytes:
    tensor = {"name": "input__0", "datatype": "INT64", "shape": [1, 128], "data": ids}
    return json.dumps({"inputs": [tensor]}).encode()


async def _exchange(pool: Pool, requests: list[tuple[str, bytes]]) -> list[tuple[int, Any]]:
    out = []
    async with TestClient(TestServer(build_app(pool))) as client:
        for path, body in requests:
            async with client.post(path, data=body) as r:
                out.append((r.status, await r.json()))
    return out


def test_ids_outside_the_vocabulary_fail_alone(pool: Pool) -> None:
    good = codec.example_body("bert-base")
    small = codec.example_body("tiny")
    requests = [("/predictions/bert", good)]
    for bad in (-1, 30522, 2**62):
        requests += [
            ("/predictions/bert", json.dumps([bad] + [0] * 127).encode()),
            ("/predictions/bert", codec.encode_sample([torch.tensor([bad] * 128)])),
            ("/v2/models/bert/infer", _v2([0] * 127 + [bad])),
            ("/predictions/small", small),
        ]
    requests.append(("/predictions/bert", good))
    got = _run(pool, requests)
    assert got[0][0] == 200 and got[-1] == got[0]
    for (path, _), (status, answer) in zip(requests[1:-1], got[1:-1], strict=True):
        if path.endswith("small"):
            assert status == 200, answer
        else:
            assert status == 400 and "ids are in 0..30521" in answer["error"], answer


def _run(pool: Pool, requests: list[tuple[str, bytes]]) -> list[tuple[int, Any]]:
    return asyncio.run(_exchange(pool, requests))
