"""Helpers for the dispatcher tests: an in-process fake TorchServe and a running stack."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.connections import ConnectionLimits


class FakeTorchServe:
    """Answers POST /predictions/{name}; holds answers while ``gate`` is clear."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.calls: Counter[str] = Counter()
        self.arrived = 0

    async def predict(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls[name] += 1
        self.arrived += 1
        body = await request.read()
        await self.gate.wait()
        status = int(request.headers.get("X-Status", "200"))
        return web.Response(
            status=status,
            body=body[::-1],
            content_type=request.headers.get("Content-Type", "application/octet-stream"),
        )


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    return await _serve_runner(web.AppRunner(app, access_log=None))


async def _serve_runner(runner: web.AppRunner) -> tuple[web.AppRunner, str]:
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@asynccontextmanager
async def stack(
    batches: list[int], *, limits: ConnectionLimits | None = None, **kwargs: Any
) -> AsyncIterator[tuple[Dispatcher, FakeTorchServe, str, aiohttp.ClientSession]]:
    fake = FakeTorchServe()
    backend_app = web.Application()
    backend_app.router.add_post("/predictions/{name}", fake.predict)
    backend, backend_url = await _serve(backend_app)
    instances = [
        InstanceSpec(index=i, name=f"m_i{i}", threads=1, batch=b, cpus=(i,))
        for i, b in enumerate(batches)
    ]
    # fresh /metrics on every read, so that tests read the counts they just caused (a pod's
    # /metrics is a snapshot: tests/unit/serve/test_metrics_do_not_reveal_arrivals.py)
    kwargs.setdefault("metrics_interval_s", 0.0)
    dispatcher = Dispatcher(model="m", instances=instances, backend_url=backend_url, **kwargs)
    front, url = await _serve_runner(dispatcher.runner(limits))
    try:
        async with aiohttp.ClientSession() as session:
            yield dispatcher, fake, url, session
    finally:
        fake.gate.set()
        await front.cleanup()
        await backend.cleanup()


def run(coro: Callable[[], Awaitable[None]], timeout_s: float = 120) -> None:
    asyncio.run(asyncio.wait_for(coro(), timeout_s))


def all_up(d: Dispatcher) -> None:
    for i in range(len(d.instances)):
        d.set_up(i, True)


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes = b"abc", **headers: str
) -> tuple[int, bytes, str, dict[str, str]]:
    async with session.post(f"{url}/predictions/m", data=body, headers=headers) as r:
        return r.status, await r.read(), r.content_type, dict(r.headers)
