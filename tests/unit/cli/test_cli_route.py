"""``packrat route``: a real router process in front of real HTTP stages, and one-line errors
for bad configs."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from dispatcher_support import _serve, run

from packrat.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def stage(request: web.Request) -> web.Response:
    doc = await request.json()
    return web.json_response([*doc, request.match_info["name"]])


def test_a_router_process_serves_the_dag(tmp_path: Path) -> None:
    async def body() -> None:
        app = web.Application()
        app.router.add_post("/predictions/{name}", stage)
        backend, base = await _serve(app)
        port = free_port()
        config = tmp_path / "router.yaml"
        config.write_text(
            "pipeline: two\n"
            f"stages:\n  a: {base}/predictions/a\n  b: {base}/predictions/b\n"
            "edges:\n  - {from: a, to: b}\n"
            "deadlineMs: 30000\n"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "packrat", "route", "--config", str(config),
            "--host", "127.0.0.1", "--port", str(port),
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                deadline = time.monotonic() + 120
                while True:  # the process imports aiohttp and binds: wait until it answers
                    assert proc.returncode is None, "the router exited"
                    try:
                        async with s.get(f"{url}/ping") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    assert time.monotonic() < deadline, "the router never answered /ping"
                    await asyncio.sleep(0.2)
                async with s.post(f"{url}/predictions/two", json=["x"]) as r:
                    assert r.status == 200 and await r.json() == ["x", "a", "b"]
                    assert r.headers["X-Packrat-Path"] == "a,b"
                async with s.get(f"{url}/metrics") as r:
                    assert 'packrat_pipeline_requests_total{code="200",pipeline="two"} 1.0' in (
                        await r.text()
                    )
        finally:
            proc.terminate()
            await proc.wait()
            await backend.cleanup()

    run(body, timeout_s=240)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stages: {a: http://x/p}\n", "pipeline: expected a non-empty name"),
        ("pipeline: p\nstages: {}\n", "stages: expected a mapping"),
        ("pipeline: p\nstages: {a: ftp://x}\n", "stages.a: expected an http(s) URL"),
        ("pipeline: p\nstages: {a: http://x}\nport: 1\n", "unknown field(s) port"),
        (
            "pipeline: p\nstages: {a: http://x, b: http://y}\n"
            "edges: [{from: a, to: b}, {from: b, to: a}]\n",
            "cycle",
        ),
        ("pipeline: p\nstages: {a: http://x}\nedges: [{from: a, to: c}]\n", "unknown stage 'c'"),
        ("pipeline: p\nstages: {a: http://x}\ndeadlineMs: -1\n", "deadlineMs: expected"),
        ("pipeline: [\n", "not valid YAML"),
    ],
)
def test_bad_configs_fail_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(text)
    assert main(["route", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
