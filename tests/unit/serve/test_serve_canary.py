"""The canary split at the dispatcher: exactly the requested share of predictions goes to the
canary's server (and says so), a canary that fails, sheds or is gone never fails a prediction
(served here, counted), its 4xx go back as they are, and ``POST /admin/canary`` sets it only
with the token and valid input."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from dispatcher_support import _serve, run, stack

from packrat.serve.dispatcher.canary import HEADER, parse_canary

TOKEN = "t" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class CanaryServer:
    """Stands in for the canary's Service: answers 200 with a marker, or ``status``."""

    def __init__(self) -> None:
        self.status = 200
        self.calls = 0

    async def predict(self, request: web.Request) -> web.Response:
        self.calls += 1
        await request.read()
        if self.status != 200:
            return web.json_response({"code": self.status}, status=self.status)
        return web.Response(body=b"from-canary", content_type="application/octet-stream")


async def _configure(session: object, front: str, body: dict[str, object]) -> tuple[int, dict]:
    async with session.post(  # type: ignore[attr-defined]
        f"{front}/admin/canary", data=json.dumps(body), headers=AUTH
    ) as r:
        return r.status, await r.json()


def test_split_is_exact_and_failures_fall_back() -> None:
    async def main() -> None:
        canary = CanaryServer()
        app = web.Application()
        app.router.add_post("/predictions/{name}", canary.predict)
        runner, canary_url = await _serve(app)
        try:
            async with stack([2], admin_token=TOKEN) as (d, _, front, session):
                d.set_up(0, True)
                canary_at = {"url": f"{canary_url}/predictions/m2", "percent": 30, "id": "v2"}
                status, stats = await _configure(session, front, canary_at)
                assert status == 200 and stats["percent"] == 30
                marked = 0
                for _ in range(200):
                    async with session.post(f"{front}/predictions/m", data=b"x") as r:
                        assert r.status == 200
                        body = await r.read()
                        if r.headers.get(HEADER) == "true":
                            marked += 1
                            assert body == b"from-canary"
                assert marked == 60 == canary.calls  # 30% of 200, exactly
                # a failing canary (5xx), a shedding one (503), a gone one: served here
                for code in (500, 503):
                    canary.status = code
                    for _ in range(10):
                        async with session.post(f"{front}/predictions/m", data=b"x") as r:
                            assert r.status == 200 and HEADER not in r.headers
                canary.status = 400  # bad input: the canary's answer goes back
                answers = []
                for _ in range(10):
                    async with session.post(f"{front}/predictions/m", data=b"x") as r:
                        answers.append((r.status, r.headers.get(HEADER)))
                assert answers.count((400, "true")) == 3
                async with session.get(f"{front}/status", headers=AUTH) as r:
                    stats = (await r.json())["canary"]
                assert stats["served"] == 60 and stats["errors"] == 3 and stats["shed"] == 3
                assert stats["client_errors"] == 3 and stats["p99Ms"] is not None
                await runner.cleanup()  # the canary is gone
                for _ in range(10):
                    async with session.post(f"{front}/predictions/m", data=b"x") as r:
                        assert r.status == 200
                # a new canary at the same Service (another id) starts with fresh counts
                status, stats = await _configure(session, front, {**canary_at, "id": "v3"})
                assert stats["id"] == "v3" and stats["requests"] == 0
                # percent 0 stops it
                status, stats = await _configure(session, front, {"url": None, "percent": 0})
                assert stats["percent"] == 0 and stats["requests"] == 0
                metrics = d.metrics.registry.get_sample_value(
                    "packrat_canary_requests_total", {"model": "m", "outcome": "error"}
                )
                assert metrics == 6  # 3 answered 500, 3 unreachable
        finally:
            await runner.cleanup()

    run(main)


def test_admin_canary_needs_the_token_and_valid_input() -> None:
    async def main() -> None:
        async with stack([1], admin_token=TOKEN) as (_, _, front, session):
            body = json.dumps({"url": "http://c/predictions/m", "percent": 10})
            async with session.post(f"{front}/admin/canary", data=body) as r:
                assert r.status == 401
            for bad in ({"percent": 10}, {"url": "ftp://x", "percent": 1}, {"percent": 101}):
                status, answer = await _configure(session, front, bad)
                assert status == 400, (bad, answer)
        async with (
            stack([1]) as (_, _, front, session),  # no token: no route
            session.post(f"{front}/admin/canary", data=b"{}") as r,
        ):
            assert r.status in (404, 405)

    run(main)


@pytest.mark.parametrize(
    "raw",
    [b"[]", b"{", b'{"url": "http://x", "percent": true}', b'{"percent": 5, "x": 1}'],
)
def test_parse_canary_refuses_junk(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_canary(raw)
