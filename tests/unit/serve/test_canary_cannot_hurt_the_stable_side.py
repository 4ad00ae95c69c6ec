"""Issue 38: a bad canary cannot hurt the stable pods or their clients. The stable pod reads the
canary's answer under a byte cap charged to its buffer budget (a huge answer is the canary's
failure, served here), never passes a canary's redirect on, never sends its clients'
Authorization or Cookie to the canary's URL, and reports 4xx and 503 answers as failures the
operator's rollback counts (tests/unit/controller/switch/test_canary_rollback_counts.py).
Real dispatcher, real canary server on loopback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from dispatcher_support import run, serve_post, stack

from packrat.serve.dispatcher.canary import HEADER

TOKEN = "t" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Hostile:
    """The canary's Service, answering what the test sets; records the headers it got."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.headers: list[dict[str, str]] = []

    async def predict(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        await request.read()
        if self.mode == "redirect":
            raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")
        if self.mode == "huge":  # 64 MiB, streamed without a length
            resp = web.StreamResponse()
            await resp.prepare(request)
            chunk = b"x" * (1 << 20)
            for _ in range(64):
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        if self.mode == "400":
            return web.json_response({"code": 400}, status=400)
        return web.Response(body=b"from-canary")


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(30):
        while not predicate():
            await asyncio.sleep(0.01)


async def _with_canary(hostile: Hostile, check: Any, **kwargs: Any) -> None:
    runner, canary_url = await serve_post("/predictions/{name}", hostile.predict)
    try:
        async with stack([2], admin_token=TOKEN, **kwargs) as (d, _, front, session):
            d.set_up(0, True)
            body = {"url": f"{canary_url}/predictions/m2", "percent": 100, "id": "v2"}
            async with session.post(
                f"{front}/admin/canary", data=json.dumps(body), headers=AUTH
            ) as r:
                assert r.status == 200
            await check(d, front, session)
    finally:
        await runner.cleanup()


async def _canary_stats(session: Any, front: str) -> dict[str, Any]:
    """The canary's counts in the pod's /status."""
    async with session.get(f"{front}/status", headers=AUTH) as r:
        stats: dict[str, Any] = (await r.json())["canary"]
    return stats


def test_a_huge_canary_answer_is_capped_and_served_here() -> None:
    hostile = Hostile(mode="huge")

    async def check(d: Any, front: str, session: Any) -> None:
        for _ in range(3):
            async with session.post(f"{front}/predictions/m", data=b"x") as r:
                assert r.status == 200 and HEADER not in r.headers
                assert len(await r.read()) < 1024  # the local answer, not the canary's
        stats = await _canary_stats(session, front)
        assert stats["errors"] == 3 and stats["served"] == 0
        await _until(lambda: d.budget.used == 0)  # every reservation given back

    run(lambda: _with_canary(hostile, check))


def test_a_canary_answer_is_charged_to_the_buffer_budget() -> None:
    hostile = Hostile()

    async def check(d: Any, front: str, session: Any) -> None:
        # the budget holds the 1-byte request body but not the 11-byte answer beside it
        d.budget.used = d.budget.limit - 5
        async with session.post(f"{front}/predictions/m", data=b"x") as r:
            assert r.status == 200 and HEADER not in r.headers  # not read: served here
        d.budget.used = 0
        with_room = d.canary.counts.copy()
        async with session.post(f"{front}/predictions/m", data=b"x") as r:
            assert r.headers.get(HEADER) == "true" and await r.read() == b"from-canary"
        await _until(lambda: d.budget.used == 0)  # released once the answer is gone
        assert with_room["errors"] == 0  # a full budget is not the canary's failure

    run(lambda: _with_canary(hostile, check))


def test_a_canary_redirect_never_reaches_a_client() -> None:
    hostile = Hostile(mode="redirect")

    async def check(d: Any, front: str, session: Any) -> None:
        async with session.post(f"{front}/predictions/m", data=b"x", allow_redirects=False) as r:
            assert r.status == 200 and "Location" not in r.headers and HEADER not in r.headers
        assert (await _canary_stats(session, front))["errors"] == 1

    run(lambda: _with_canary(hostile, check))


def test_client_credentials_stay_with_the_stable_pod() -> None:
    hostile = Hostile()

    async def check(d: Any, front: str, session: Any) -> None:
        secret = {"Authorization": "Bearer client-secret", "Cookie": "session=abc"}
        async with session.post(f"{front}/predictions/m", data=b"x", headers=secret) as r:
            assert r.headers.get(HEADER) == "true"
        sent = {k.lower() for k in hostile.headers[-1]}
        assert "authorization" not in sent and "cookie" not in sent

    run(lambda: _with_canary(hostile, check))


def test_4xx_answers_are_reported_as_failures() -> None:
    hostile = Hostile(mode="400")

    async def check(d: Any, front: str, session: Any) -> None:
        for _ in range(5):
            async with session.post(f"{front}/predictions/m", data=b"x") as r:
                assert r.status == 400 and r.headers.get(HEADER) == "true"
        stats = await _canary_stats(session, front)
        assert stats["client_errors"] == 5 and stats["requests"] == 5

    run(lambda: _with_canary(hostile, check))


def test_the_answer_stays_charged_while_it_lives() -> None:
    from prometheus_client import CollectorRegistry

    from packrat.serve.dispatcher.canary import CanarySplit
    from packrat.serve.dispatcher.connections import BufferBudget

    async def main() -> None:
        hostile = Hostile()
        runner, canary_url = await serve_post("/predictions/{name}", hostile.predict)
        budget = BufferBudget(1024)
        split = CanarySplit(model="m", registry=CollectorRegistry(), budget=budget)
        try:
            split.configure(f"{canary_url}/predictions/m2", 100, "v2")
            answer = await split.forward({}, {}, b"x")
            assert answer is not None and answer.body == b"from-canary"
            assert budget.used == len(b"from-canary")  # held by the answer
            del answer
            assert budget.used == 0  # freed with it
        finally:
            await split.close()
            await runner.cleanup()

    run(main)
