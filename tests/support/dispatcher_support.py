"""Helpers for the dispatcher tests: an in-process fake TorchServe and a running stack."""

from __future__ import annotations

import asyncio
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.connections import ConnectionLimits
from packrat.serve.dispatcher.metrics import ServeMetrics


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


class GatedRows:
    """An in-process backend that answers like the model service: each sample the JSON row
    [sum of its floats], once ``gate`` is open. With ``refuse_negative``, a sample whose first
    float is negative is a 400 (the model's own refusal)."""

    kind = "fake"
    refuse_negative = False

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        await self.gate.wait()
        values = array("f", body).tolist()
        if self.refuse_negative and values and values[0] < 0:
            return web.json_response({"code": 400, "message": "negative"}, status=400)
        return web.json_response([sum(values)])


def payload_log_count(metrics: ServeMetrics, outcome: str) -> float:
    """The request log's records of ``outcome`` (model ``m``) so far."""
    value = metrics.registry.get_sample_value(
        "packrat_payload_log_records_total", {"model": "m", "outcome": outcome}
    )
    return value or 0.0


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    return await _serve_runner(web.AppRunner(app, access_log=None))


async def serve_post(
    path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> tuple[web.AppRunner, str]:
    """A peer (a sink, a canary) that answers POST ``path`` with ``handler``, on loopback."""
    app = web.Application()
    app.router.add_post(path, handler)
    return await _serve(app)


async def _serve_runner(runner: web.AppRunner) -> tuple[web.AppRunner, str]:
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@asynccontextmanager
async def stack(
    batches: list[int],
    *,
    limits: ConnectionLimits | None = None,
    gate_closed: bool = False,
    **kwargs: Any,
) -> AsyncIterator[tuple[Dispatcher, FakeTorchServe, str, aiohttp.ClientSession]]:
    """A dispatcher (instances of ``batches``) in front of a fake TorchServe, both serving on
    loopback, and a client session. With ``gate_closed`` every instance is up and the fake
    holds its answers until the test opens ``fake.gate``."""
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
            if gate_closed:
                all_up(dispatcher)
                fake.gate.clear()
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


async def held(
    d: Dispatcher, session: aiohttp.ClientSession, url: str, count: int
) -> list[asyncio.Future[int]]:
    """Posts ``count`` requests and returns once the dispatcher holds them all (in flight or
    queued; the fake's gate closed keeps them there): their statuses to come."""

    async def status() -> int:
        return (await post(session, url, b"x"))[0]

    futures = [asyncio.ensure_future(status()) for _ in range(count)]
    await until(lambda: d.pending >= count, f"{count} requests held")
    return futures


# -- raw sockets: the clients aiohttp would not be ----------------------------------------------
DEADLINE_S = 60.0


async def until(predicate: object, what: str) -> None:
    """Poll ``predicate()`` until true (generous deadline: the machine is shared)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not predicate():  # type: ignore[operator]
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw TCP connection to ``url``'s host and port (to send what aiohttp would not)."""
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port)


def head(length: int | None = None, path: str = "/predictions/m") -> bytes:
    """A POST's head announcing ``length`` bytes (chunked when None), no body."""
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/octet-stream"]
    lines.append(
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_of(reader: asyncio.StreamReader) -> int:
    """The status code of the response on a raw connection."""
    line = await asyncio.wait_for(reader.readline(), DEADLINE_S)
    return int(line.split()[1])


async def closed(reader: asyncio.StreamReader) -> bool:
    """True once the server closed the connection (EOF or reset)."""
    try:
        while await asyncio.wait_for(reader.read(65536), DEADLINE_S):
            pass
    except ConnectionError:
        pass
    return True
