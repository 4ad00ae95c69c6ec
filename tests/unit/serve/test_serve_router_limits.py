"""Issue 26, item 3: the pipeline router under hostile clients and hostile stages (huge and
dripping bodies, slowloris heads, connection floods, endless or redirected stage answers,
deep JSON in a join). Each attack used to take the router past its memory limit, hold its
connections, or leak an internal answer; each is now refused for that query alone."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from dispatcher_support import (
    _serve,
    _serve_runner,
    all_up,
    closed,
    raw,
    run,
    stack,
    status_of,
    until,
)
from hostile_support import Listener, answer, endless

from packrat.plan.pipeline.simulate import Edge
from packrat.serve.dispatcher.connections import ConnectionLimits
from packrat.serve.router import Router, RouterConfig


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


class Echo:
    """A well-behaved stage: echoes its input; holds answers while ``gate`` is clear."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.arrived = 0
        self.app = web.Application(client_max_size=64 << 20)
        self.app.router.add_post("/{name}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        self.arrived += 1
        body = await request.read()
        await self.gate.wait()
        return web.Response(body=body, content_type=request.content_type)


SERVERS: dict[str, web.AppRunner] = {}


@asynccontextmanager
async def router(
    stages: dict[str, str], edges: list[Edge] | None = None, **config: object
) -> AsyncIterator[tuple[Router, str, aiohttp.ClientSession]]:
    conf = RouterConfig("p", stages, edges or [], **config)  # type: ignore[arg-type]
    r = Router(conf, rng=random.Random(1))
    front, url = await _serve_runner(r.runner())
    SERVERS[url] = front
    try:
        async with aiohttp.ClientSession() as session:
            yield r, url, session
    finally:
        SERVERS.pop(url, None)
        await front.cleanup()


async def ask(
    session: aiohttp.ClientSession, url: str, body: bytes = b"[]", ctype: str = "application/json"
) -> tuple[int, bytes]:
    async with session.post(
        f"{url}/predictions/p", data=body, headers={"Content-Type": ctype}
    ) as r:
        return r.status, await r.read()


def test_a_body_over_the_cap_is_413_unread_and_bodies_share_one_budget() -> None:
    async def body() -> None:
        echo = Echo()
        backend, base = await _serve(echo.app)
        try:
            config = {"max_body_bytes": 1000, "max_answer_bytes": 1000, "max_buffered_bytes": 4000}
            limits = ConnectionLimits(refused_hold_s=0.5)
            async with router({"a": f"{base}/a"}, limits=limits, **config) as (r, url, s):
                reader, writer = await raw(url)
                writer.write(
                    b"POST /predictions/p HTTP/1.1\r\nHost: x\r\nContent-Length: 7000000\r\n\r\n"
                )
                assert await status_of(reader) == 413
                assert await closed(reader)  # the 7 MB are never read
                writer.close()
                # 24 concurrent queries: what fits the budget runs, the rest is shed (503)
                echo.gate.clear()
                tasks = [
                    asyncio.create_task(ask(s, url, b"[" + b"1," * 400 + b"1]")) for _ in range(24)
                ]
                await until(lambda: echo.arrived >= 1, "a query at the stage")
                await until(lambda: sum(t.done() for t in tasks) >= 20, "the rest shed")
                assert r.budget.used <= r.budget.limit
                echo.gate.set()
                codes = sorted(c for c, _ in await asyncio.gather(*tasks))
                assert 200 in codes and 503 in codes and set(codes) == {200, 503}
                assert r.budget.used == 0
        finally:
            await backend.cleanup()

    run(body)


def test_slow_heads_and_slow_bodies_are_cut() -> None:
    async def body() -> None:
        echo = Echo()
        backend, base = await _serve(echo.app)
        try:
            limits = ConnectionLimits(header_timeout_s=0.5, refused_hold_s=0.5)
            async with router({"a": f"{base}/a"}, limits=limits, body_timeout_s=0.5) as (r, url, s):
                # slowloris: a head that never completes is closed at the deadline
                slow = [await raw(url) for _ in range(5)]
                for _, w in slow:
                    w.write(b"POST /predictions/p HTTP/1.1\r\nHost: x\r\n")
                for reader, w in slow:
                    assert await closed(reader)
                    w.close()
                # a body that stops arriving is answered 408
                reader, writer = await raw(url)
                writer.write(
                    b"POST /predictions/p HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n[1,"
                )
                assert await status_of(reader) == 408
                writer.close()
                assert echo.arrived == 0 and r.budget.used == 0
                assert (await ask(s, url, b"[1]"))[0] == 200  # others are served
        finally:
            await backend.cleanup()

    run(body)


def test_hostile_stage_answers_fail_their_query_only(stop: threading.Event) -> None:
    """A stage answering 1 GiB (declared or endless) or a redirect to an internal address:
    502 for that query, nothing of the internal answer returned, nothing left buffered."""
    internal = Listener(answer("200 OK", {"Content-Length": "15"}, b"internal-secret"))
    redirect = {"Location": f"{internal.url}/x", "Content-Length": "0"}
    hostile = [
        Listener(endless({}, stop)),
        Listener(endless({"Content-Length": str(1 << 30)}, stop)),
        Listener(answer("307 Temporary Redirect", redirect)),
    ]

    async def body() -> None:
        for listener in hostile:
            async with router({"s": f"{listener.url}/s"}, max_answer_bytes=1 << 20) as (r, url, s):
                code, text = await ask(s, url)
                assert code == 502, (code, text)
                assert b"internal-secret" not in text
                assert r.budget.used == 0
        assert internal.connections == 0

    try:
        run(body)
    finally:
        for listener in [internal, *hostile]:
            listener.close()


def test_deep_json_in_a_join_is_not_a_500() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000

    async def body() -> None:
        echo = Echo()
        backend, base = await _serve(echo.app)
        try:
            stages = {n: f"{base}/{n}" for n in ("a", "b", "c")}
            edges = [Edge("a", "c"), Edge("b", "c")]
            async with router(stages, edges) as (_r, url, s):
                code, text = await ask(s, url, deep)
                assert code == 200
                assert json.loads(text)["a"].startswith("[[[")  # embedded as text
        finally:
            await backend.cleanup()

    run(body)


@pytest.mark.parametrize("server", ["dispatcher", "router"])
def test_a_flood_of_idle_connections_does_not_starve_probes(server: str) -> None:
    """Issue 26, item 6: one client holds 1,100 idle connections (the dispatcher's cap is
    1,024); /ping from another address (the kubelet's) answers every time, and the flooding
    client holds no more than its share. Before: 17 of 19 probes failed."""

    limits = ConnectionLimits()
    share = limits.max_per_client + limits.probe_reserve_per_client

    async def flood_then_probe(url: str, s: aiohttp.ClientSession) -> int:
        """Flood, probe; returns how many of the flood's connections the server closed."""
        port = int(url.rsplit(":", 1)[1])
        flood = [
            await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            for _ in range(1100)
        ]
        pings = []
        for _ in range(19):
            async with s.get(f"{url}/ping") as resp:
                pings.append(resp.status)
        assert pings == [200] * 19
        # a refused connection was closed at once (EOF); the held ones read nothing
        await until(lambda: sum(r.at_eof() for r, _ in flood) >= 1100 - share, "refusals")
        refused = sum(r.at_eof() for r, _ in flood)
        for _reader, writer in flood:
            writer.close()
        return refused

    async def body() -> None:
        if server == "router":
            echo = Echo()
            backend, base = await _serve(echo.app)
            try:
                async with router({"a": f"{base}/a"}) as (_r, url, s):
                    assert await flood_then_probe(url, s) >= 1100 - share
            finally:
                await backend.cleanup()
            return
        async with stack([1]) as (d, _fake, url, s):
            all_up(d)
            assert await flood_then_probe(url, s) >= 1100 - share

    run(body)
