"""A real TorchServe whose ports were taken between choosing and binding them.

The block was free when chosen; by the time TorchServe binds it, another process (here: a
stand-in for another TorchServe on the same host, as during ``packrat bench --serving``
beside other servers) holds the inference port and answers on the management port. The
start must not take that stranger's answer for its own server: it waits for its own
TorchServe to say it started, sees it fail, and retries on the next block.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aiohttp import web

from packrat.serve.config import LOOPBACK
from packrat.serve.torchserve.process import TorchServe

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_stranger_on_our_ports_is_not_taken_for_our_torchserve(tmp_path: Path) -> None:
    async def body() -> None:
        ts = TorchServe(workdir=tmp_path / "ts", port_base=24000)
        chosen = ts.ports
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.bind((LOOPBACK, chosen.inference))
        holder.listen()

        async def models(_request: web.Request) -> web.Response:
            return web.json_response({"models": []})

        stranger = web.Application()
        stranger.router.add_get("/models", models)
        runner = web.AppRunner(stranger, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, LOOPBACK, chosen.management).start()
        try:
            await ts.start(timeout_s=300)
            assert ts.ports.inference != chosen.inference, "took the stranger for ours"
            assert ts.running
            assert await ts.ping(timeout_s=30)
        finally:
            await ts.stop()
            await runner.cleanup()
            holder.close()

    asyncio.run(body())
