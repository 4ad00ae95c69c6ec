"""What request logging and the canary split cost the dispatcher (issue 28).

One process, one event loop: a stub backend that answers at once, the dispatcher in front of
it, and a closed-loop client (concurrency 8, tiny bodies), so only the dispatcher's own work
differs between configurations:

- ``off``: no request log, no canary (the default);
- ``jsonl``: every prediction logged as a JSON line to a file (sample rate 1);
- ``ce``: every prediction sent as two CloudEvents (binary mode) to a local sink that answers
  202 at once;
- ``ce-hung``: the same to a sink that never answers: the queue (1000) fills and the rest is
  dropped and counted; serving must not slow down;
- ``canary30``: 30% of the predictions forwarded to a second dispatcher (the canary) in front
  of its own stub.

Configurations alternate within each round (off, jsonl, ce, ce-hung, canary30, off, ...) because
these machines are shared and noisy; each reports the median over rounds of throughput and of
p50/p99 latency, with the range. Usage::

    .venv/bin/python benchmarks/serving/payload_log_canary.py [--rounds 5] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from packrat.bench.loadgen import percentile
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.metrics import ServeMetrics
from packrat.serve.dispatcher.payload_log import PayloadLogConfig, PayloadLogger

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What do request logging and the canary split cost?"'
    " (#what-do-request-logging-and-the-canary-split-cost)"
)

CONFIGS = ("off", "jsonl", "ce", "ce-hung", "canary30")
TOKEN = "b" * 32


async def _site(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def _stub() -> tuple[web.AppRunner, str]:
    async def predict(request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/predictions/{name}", predict)
    return await _site(app)


async def _sinks() -> tuple[list[web.AppRunner], str, str]:
    hold = asyncio.Event()

    async def quick(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=202)

    async def hung(request: web.Request) -> web.Response:
        await hold.wait()
        return web.Response(status=202)

    quick_app, hung_app = web.Application(), web.Application()
    quick_app.router.add_post("/", quick)
    hung_app.router.add_post("/", hung)
    a, quick_url = await _site(quick_app)
    b, hung_url = await _site(hung_app)
    return [a, b], quick_url + "/", hung_url + "/"


async def _dispatcher(
    backend: str, logger: Callable[[ServeMetrics], PayloadLogger | None]
) -> tuple[Dispatcher, web.AppRunner, str]:
    instances = [InstanceSpec(index=0, name="m_i0", threads=1, batch=8, cpus=(0,))]
    metrics = ServeMetrics()
    d = Dispatcher(
        model="m",
        instances=instances,
        backend_url=backend,
        metrics=metrics,
        payload_log=logger(metrics),
        admin_token=TOKEN,
    )
    runner = d.runner()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    d.set_up(0, True)
    return d, runner, f"http://{host}:{port}"


async def _drive(url: str, requests: int, concurrency: int = 8) -> dict[str, float]:
    latencies: list[float] = []
    left = requests
    body = json.dumps([0.1] * 16).encode()
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                start = time.perf_counter()
                async with session.post(f"{url}/predictions/m", data=body) as r:
                    await r.read()
                    assert r.status == 200, r.status
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - start
    ms = [v * 1000 for v in latencies]
    return {"rps": len(ms) / seconds, "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}


async def _one(config: str, requests: int, workdir: Path) -> dict[str, Any]:
    cleanup: list[Callable[[], Awaitable[None]]] = []
    stub, backend = await _stub()
    cleanup.append(stub.cleanup)
    sinks, quick, hung = await _sinks()
    cleanup += [s.cleanup for s in sinks]

    def logger(metrics: ServeMetrics) -> PayloadLogger | None:
        sink = {"jsonl": f"jsonl:{workdir}/log-{time.monotonic_ns()}.jsonl", "ce": quick}
        sink["ce-hung"] = hung
        if config not in sink:
            return None
        return PayloadLogger(
            PayloadLogConfig(sink=sink[config]), model="m", registry=metrics.registry
        )

    d, runner, url = await _dispatcher(backend, logger)
    cleanup.insert(0, runner.cleanup)
    if config == "canary30":
        stub2, backend2 = await _stub()
        _, runner2, canary_url = await _dispatcher(backend2, lambda _m: None)
        cleanup += [runner2.cleanup, stub2.cleanup]
        d.canary.configure(f"{canary_url}/predictions/m", 30, "bench")
    result = await _drive(url, requests)
    if d.payload_log is not None:
        reg = d.metrics.registry
        result["dropped"] = reg.get_sample_value(
            "packrat_payload_log_records_total", {"model": "m", "outcome": "dropped"}
        )
    if config == "canary30":
        result["canary_share"] = d.canary.counts["served"] / requests
    for step in cleanup:
        await step()
    return result


def offer_cost(calls: int = 20000) -> dict[str, float]:
    """Microseconds of one ``offer`` (the dispatcher's whole part of logging): not sampled,
    queued, and dropped on a full queue."""
    from multidict import CIMultiDict

    headers = CIMultiDict({"Content-Type": "application/json"})
    body = json.dumps([0.1] * 16).encode()
    out: dict[str, float] = {}

    async def run(name: str, config: PayloadLogConfig, prefill: bool) -> None:
        logger = PayloadLogger(config, model="m", registry=ServeMetrics().registry)
        kwargs: dict[str, Any] = {"headers": headers, "request_body": body, "status": 200}
        kwargs |= {"response_headers": headers, "response_body": body, "latency_s": 0.001}
        if prefill:
            while not logger.queue.full():
                logger.offer(**kwargs)
        start = time.perf_counter()
        for _ in range(calls):  # queued: the queue holds all of them, nothing dropped
            logger.offer(**kwargs)
        out[name] = (time.perf_counter() - start) / calls * 1e6

    sink = "http://127.0.0.1:9/"
    asyncio.run(run("not_sampled_us", PayloadLogConfig(sink=sink, sample_rate=1e-9), False))
    asyncio.run(run("queued_us", PayloadLogConfig(sink=sink, queue_size=1_000_000), False))
    asyncio.run(run("dropped_us", PayloadLogConfig(sink=sink, queue_size=10), True))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for config in CONFIGS:  # interleaved: every round sees the same noise
                runs[config].append(asyncio.run(_one(config, args.requests, Path(tmp))))
    summary: dict[str, Any] = {"load_average": os.getloadavg(), "rounds": args.rounds}
    base = statistics.median(r["rps"] for r in runs["off"])
    for config, results in runs.items():
        rps = [r["rps"] for r in results]
        p50 = [r["p50_ms"] for r in results]
        p99 = [r["p99_ms"] for r in results]
        summary[config] = {
            "rps_median": statistics.median(rps),
            "rps_range": [min(rps), max(rps)],
            "rps_vs_off": statistics.median(rps) / base,
            "p50_ms_median": statistics.median(p50),
            "p99_ms_median": statistics.median(p99),
            **{k: results[-1][k] for k in ("dropped", "canary_share") if k in results[-1]},
        }
        print(
            f"{config:9s} {statistics.median(rps):8.0f} req/s ({min(rps):.0f}-{max(rps):.0f}) "
            f"x{statistics.median(rps) / base:.2f}  p50 {statistics.median(p50):6.2f} ms  "
            f"p99 {statistics.median(p99):6.2f} ms"
        )
    summary["offer"] = offer_cost()
    print("offer() cost:", {k: round(v, 2) for k, v in summary["offer"].items()})
    print(f"load average {summary['load_average']}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
