"""The load generator: statistics, bursts and Poisson arrivals against an in-process server."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from aiohttp import web

from packrat.bench.loadgen import (
    BurstResult,
    RequestRecord,
    Target,
    format_summary,
    percentile,
    run_bursts,
    run_poisson,
)


def test_percentile_interpolates() -> None:
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([5], 99) == 5
    assert percentile([1, 2, 3, 4, 5], 100) == 5
    assert math.isnan(percentile([], 50))


def test_burst_summary() -> None:
    result = BurstResult(burst=2, bursts=2, batch_latencies_s=[0.010, 0.030])
    result.records = [
        RequestRecord(0.0, 0.01, 200),
        RequestRecord(0.0, 0.008, 200),
        RequestRecord(0.02, 0.03, 503),
        RequestRecord(0.02, 0.001, 0, "ClientConnectorError: refused"),
    ]
    s = result.summary()
    assert s["batch_latency"]["mean_ms"] == pytest.approx(20.0)
    assert s["batch_latency"]["p50_ms"] == pytest.approx(20.0)
    assert s["errors"] == 2
    assert s["errors_by_status"] == {"503": 1, "connection": 1}
    assert "batch latency" in format_summary(s)
    assert result.to_dict()["records"][3]["error"].startswith("ClientConnectorError")


async def _server(delay: float, statuses: list[int]) -> tuple[web.AppRunner, str]:
    count = {"n": 0}

    async def predict(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay)
        count["n"] += 1
        return web.Response(status=statuses[count["n"] % len(statuses)], text="ok")

    app = web.Application()
    app.router.add_post("/predictions/{name}", predict)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


T = TypeVar("T")


def _against(delay: float, statuses: list[int], load: Callable[[str], Awaitable[T]]) -> T:
    """Runs ``load`` (given the URL) against a fresh in-process server, stopped afterwards."""

    async def body() -> T:
        runner, url = await _server(delay, statuses)
        try:
            return await load(url)
        finally:
            await runner.cleanup()

    return asyncio.run(body())


def test_bursts_measure_until_the_last_answer() -> None:
    result = _against(
        0.02,
        [200],
        lambda url: run_bursts(Target(url, "m", b"x"), burst=4, bursts=3, warmup_bursts=1),
    )
    assert len(result.batch_latencies_s) == 3
    assert len(result.records) == 12
    assert result.errors == 0
    assert all(b >= 0.02 for b in result.batch_latencies_s)
    for i in range(3):  # the batch latency is at least each of its requests' latency
        burst = result.records[4 * i : 4 * i + 4]
        assert result.batch_latencies_s[i] >= max(r.latency_s for r in burst)


def test_poisson_records_every_request_and_errors() -> None:
    result = _against(
        0.0,
        [200, 500],
        lambda url: run_poisson(Target(url, "m", b"x"), rate=200, duration_s=0.5, seed=1),
    )
    s = result.summary()  # type: ignore[attr-defined]
    assert 40 <= s["requests"] <= 200  # ~100 expected
    assert s["errors"] == s["errors_by_status"].get("500", 0) > 0
    sent = [r.sent_s for r in result.records]  # type: ignore[attr-defined]
    # in send order; no bound on the last send time: a request is sent when the event loop gets
    # to it, which on a loaded machine can be a little after its scheduled arrival (< 0.5 s)
    assert sent == sorted(sent) and sent[0] >= 0


def test_connection_errors_are_records_not_exceptions() -> None:
    result = asyncio.run(
        run_bursts(Target("http://127.0.0.1:9", "m", b"x", timeout_s=2), burst=2, bursts=1)
    )
    assert result.errors == 2
    assert all(r.status == 0 and r.error for r in result.records)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        asyncio.run(run_bursts(Target("http://x", "m", b""), burst=0, bursts=1))
    with pytest.raises(ValueError):
        asyncio.run(run_poisson(Target("http://x", "m", b""), rate=0, duration_s=1))


def test_trace_replay_sends_at_the_trace_times() -> None:
    from packrat.bench.replay import run_trace

    arrivals = [10.0, 10.05, 10.1, 10.3, 10.3]

    result = _against(
        0.0, [200], lambda url: run_trace(Target(url, "m", b"x"), arrivals_s=arrivals)
    )
    s = result.summary()  # type: ignore[attr-defined]
    assert s["mode"] == "trace" and s["requests"] == 5 and s["errors"] == 0
    assert s["rate"] == pytest.approx(4 / 0.3)
    sent = [r.sent_s for r in result.records]  # type: ignore[attr-defined]
    # never early; lateness is the event loop's, bounded loosely on a busy machine
    assert all(s_ >= a - 10.0 - 1e-3 for s_, a in zip(sent, arrivals, strict=True))
    with pytest.raises(ValueError, match="sorted"):
        asyncio.run(run_trace(Target("http://x", "m", b""), arrivals_s=[1.0, 0.0]))
    with pytest.raises(ValueError, match="no arrivals"):
        asyncio.run(run_trace(Target("http://x", "m", b""), arrivals_s=[]))
