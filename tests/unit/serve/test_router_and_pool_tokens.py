"""Issue 38: the pipeline router's ``/arrivals`` and the pool process's ``/pool/status`` were
public; they now answer only a request bearing the owner's admin token, as a serving pod's
``/arrivals`` does (401 otherwise, the current or the previous token of the mounted files
accepted), and their public ``/metrics`` is a snapshot at most 2 s old, as a pod's (polled
between requests, it cannot time them). A router started without a token has no
``/arrivals`` (as a pod without one); a pool without one keeps ``/pool/status`` public (as a
pod's ``/status`` without one). Real router, real pool (tiny PyTorch models), real HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from dispatcher_support import _serve, serve_post

from packrat.serve.auth import PREVIOUS_FILE, TokenFile
from packrat.serve.pool.app import build_app
from packrat.serve.pool.host import Pool, load_config
from packrat.serve.router import Router, RouterConfig

TOKEN = "current-token-0123456789"
OLD = "previous-token-0123456789"


def token_files(tmp: Path) -> TokenFile:
    """The owner's Secret as the kubelet mounts it, just after a rotation."""
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / PREVIOUS_FILE).write_text(OLD)
    return TokenFile(tmp / "token")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


REFUSED = [{}, bearer("wrong-token-0123456789"), {"Authorization": TOKEN}, bearer(TOKEN + "x")]


async def _stage(request: web.Request) -> web.Response:
    return web.json_response(await request.json())


async def router_statuses(token: TokenFile | None) -> tuple[list[int], list[int], bytes, bytes]:
    stage, base = await serve_post("/s", _stage)
    router = Router(RouterConfig("p", {"a": f"{base}/s"}), admin_token=token)
    front, url = await _serve(router.app())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/metrics") as r:
                before = await r.read()
            async with s.post(f"{url}/predictions/p", json=[1]) as r:
                assert r.status == 200
            async with s.get(f"{url}/metrics") as r:
                after = await r.read()
            refused = []
            for headers in REFUSED:
                async with s.get(f"{url}/arrivals?after=0", headers=headers) as r:
                    refused.append(r.status)
            answered = []
            for good in (TOKEN, OLD):
                async with s.get(f"{url}/arrivals?after=0", headers=bearer(good)) as r:
                    answered.append(r.status)
                    if r.status == 200:
                        assert (await r.json())["total"] == 1
    finally:
        await front.cleanup()
        await stage.cleanup()
    return refused, answered, before, after


def test_the_routers_arrivals_need_its_token(tmp_path: Path) -> None:
    refused, answered, before, after = asyncio.run(router_statuses(token_files(tmp_path)))
    assert refused == [401] * len(REFUSED)
    assert answered == [200, 200]  # the current token, and the previous one
    assert before == after  # /metrics: a snapshot, one query's time is not on it


def test_a_router_without_a_token_has_no_arrivals() -> None:
    refused, answered, _, _ = asyncio.run(router_statuses(None))
    assert refused == [404] * len(REFUSED) and answered == [404, 404]


async def pool_statuses(tmp: Path, token: TokenFile | None) -> tuple[list[int], list[int], bool]:
    config = load_config(
        {"directory": str(tmp / "layers"), "budget_bytes": 1 << 24,
         "models": [{"name": "a", "spec": "tiny", "seed": 1}]}
    )  # fmt: skip
    app = build_app(Pool(config), admin_token=token)
    async with TestClient(TestServer(app)) as client:
        async with client.get("/metrics") as r:
            before = await r.read()
        async with client.post("/predictions/a", data=json.dumps([0.5] * 16)) as r:
            assert r.status == 200, await r.text()
        async with client.get("/metrics") as r:
            unchanged = await r.read() == before
        refused = []
        for headers in REFUSED:
            async with client.get("/pool/status", headers=headers) as r:
                refused.append(r.status)
        answered = []
        for good in (TOKEN, OLD):
            async with client.get("/pool/status", headers=bearer(good)) as r:
                answered.append(r.status)
                if r.status == 200:
                    assert (await r.json())["models"]["a"]["requests"] == 1
    return refused, answered, unchanged


def test_the_pools_status_needs_its_token(tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    token = token_files(tmp_path / "secret")
    refused, answered, unchanged = asyncio.run(pool_statuses(tmp_path, token))
    assert refused == [401] * len(REFUSED)
    assert answered == [200, 200]
    assert unchanged  # /metrics: a snapshot, not each request's count and last use


def test_a_pool_without_a_token_keeps_its_status_public(tmp_path: Path) -> None:
    refused, answered, _ = asyncio.run(pool_statuses(tmp_path, None))
    assert refused == [200] * len(REFUSED) and answered == [200, 200]
