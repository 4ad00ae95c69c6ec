"""A new worker is warmed with a batch of one request before its instance is marked up (a
forked worker then runs full batches at steady speed), and a warm-up that fails says so."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from packrat.serve.config import InstanceSpec
from packrat.serve.pod.health import WARMUP_REQUESTS, warm


class CountingRuntime:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.calls: list[tuple[str, bytes]] = []

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        self.calls.append((name, body))
        return web.Response(status=self.status)


def _pod(runtime: CountingRuntime, body: bytes | None = b"x") -> Any:
    return SimpleNamespace(runtime=runtime, warmup=body)


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_a_worker_is_warmed_with_one_request_whatever_its_batch(batch: int) -> None:
    runtime = CountingRuntime()
    inst = InstanceSpec(index=0, name="m_i0", threads=1, batch=batch, cpus=(0,))
    asyncio.run(warm(_pod(runtime), inst))
    assert WARMUP_REQUESTS == 1
    assert runtime.calls == [("m_i0", b"x")]


def test_a_failed_warm_up_raises_and_no_body_means_no_warm_up() -> None:
    inst = InstanceSpec(index=0, name="m_i0", threads=1, batch=4, cpus=(0,))
    with pytest.raises(RuntimeError, match="warm-up of m_i0 failed"):
        asyncio.run(warm(_pod(CountingRuntime(status=503)), inst))
    quiet = CountingRuntime()
    asyncio.run(warm(_pod(quiet, body=None), inst))
    assert quiet.calls == []
