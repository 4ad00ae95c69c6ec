"""What the dispatcher costs: added latency in front of TorchServe, and its max rate on one core.

1. Latency: one ``packrat serve`` pod with the tiny model (one 1-thread instance, batch 1).
   Requests go one at a time (closed loop, concurrency 1, then 8), alternately in blocks
   through the dispatcher and straight to the same TorchServe (its loopback inference port,
   from ``/status``), so both see the same machine noise. Reports mean/p50/p99 of each and
   the difference.
2. Max rate: a dispatcher process pinned to one core in front of a stub backend that answers
   at once (pinned to another core), driven by a closed-loop client (also on the other core)
   with many concurrent requests. The same client against the stub alone gives the harness's
   own ceiling: if the two are close, the dispatcher rate is a lower bound.

Usage: ``.venv/bin/python benchmarks/serving/dispatcher_overhead.py [--requests 2000]
[--seconds 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from packrat.bench.loadgen import percentile
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.codec import example_body
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.pod.server import wait_ready
from packrat.serve.torchserve.process import allocate_ports, free_ports

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What does the serving path cost per request?"'
    " (#what-does-the-serving-path-cost-per-request)"
)

PLAN = {
    "cpus": 1,
    "batch": 1,
    "instances": [{"threads": 1, "batch": 1, "count": 1}],
    "expected_latency_ms": 1.0,
}


def stats(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "mean_ms": statistics.fmean(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
    }


async def closed_loop(
    session: aiohttp.ClientSession, url: str, body: bytes, *, count: int, concurrency: int
) -> list[float]:
    latencies: list[float] = []
    remaining = {"n": count}

    async def worker() -> None:
        while remaining["n"] > 0:
            remaining["n"] -= 1
            start = time.perf_counter()
            async with session.post(
                url, data=body, headers={"Content-Type": "application/octet-stream"}
            ) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status}")
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def latency_part(requests: int, cpus: list[int]) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="packrat-dispatcher-bench-"))
    (tmp / "plan.json").write_text(json.dumps(PLAN))
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    ts_ports = allocate_ports()  # a free block: TorchServe's inference port is its first
    cmd = [
        sys.executable, "-m", "packrat", "serve", "--model", "tiny", "--plan",
        str(tmp / "plan.json"), "--host", "127.0.0.1", "--port", str(port),
        "--max-batch-delay-ms", "1", "--cpus", str(cpus[0]), "--workdir", str(tmp / "work"),
        "--torchserve-port-base", str(ts_ports.inference),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not await wait_ready(url, timeout_s=120):
            raise RuntimeError("packrat serve did not become ready")
        async with aiohttp.ClientSession() as session:
            # /status no longer names internal addresses; the port block was chosen here.
            direct = f"http://127.0.0.1:{ts_ports.inference}/predictions/tiny_i0"
            via = f"{url}/predictions/tiny"
            body = example_body("tiny")
            out: dict[str, object] = {}
            for concurrency in (1, 8):
                got: dict[str, list[float]] = {"dispatcher": [], "direct": []}
                await closed_loop(session, via, body, count=50, concurrency=concurrency)
                await closed_loop(session, direct, body, count=50, concurrency=concurrency)
                block = 100
                for _ in range(max(1, requests // (2 * block))):
                    got["dispatcher"] += await closed_loop(
                        session, via, body, count=block, concurrency=concurrency
                    )
                    got["direct"] += await closed_loop(
                        session, direct, body, count=block, concurrency=concurrency
                    )
                d, t = stats(got["dispatcher"]), stats(got["direct"])
                out[f"concurrency_{concurrency}"] = {
                    "dispatcher": d,
                    "direct": t,
                    "added_p50_ms": d["p50_ms"] - t["p50_ms"],
                    "added_mean_ms": d["mean_ms"] - t["mean_ms"],
                    "added_p99_ms": d["p99_ms"] - t["p99_ms"],
                }
            return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


# -- max rate on one core ----------------------------------------------------------------------
def _stub(port: int, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})

    async def predict(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"[0.0]", content_type="application/json")

    app = web.Application()
    app.router.add_post("/predictions/{name}", predict)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _dispatcher(port: int, backend: int, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})

    async def main() -> None:
        inst = InstanceSpec(index=0, name="stub_i0", threads=1, batch=512, cpus=(cpu,))
        d = Dispatcher(model="stub", instances=[inst], backend_url=f"http://127.0.0.1:{backend}")
        d.set_up(0, True)
        runner = d.runner()
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


async def hammer(url: str, *, seconds: float, concurrency: int) -> float:
    done = {"n": 0}
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                async with session.post(url, data=b"x") as r:
                    await r.read()
                    if r.status == 200:
                        done["n"] += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done["n"] / (time.perf_counter() - start)


def rate_part(seconds: float, cpus: list[int]) -> dict[str, object]:
    dispatcher_cpu, other_cpu = cpus[0], cpus[-1]
    stub_port, disp_port = free_ports(2)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_stub, args=(stub_port, other_cpu), daemon=True),
        ctx.Process(target=_dispatcher, args=(disp_port, stub_port, dispatcher_cpu), daemon=True),
    ]
    for p in procs:
        p.start()
    os.sched_setaffinity(0, {other_cpu})
    try:
        time.sleep(3)
        out: dict[str, object] = {
            "dispatcher_cpu": dispatcher_cpu,
            "client_and_stub_cpu": other_cpu,
        }
        for concurrency in (16, 64):
            via = asyncio.run(
                hammer(f"http://127.0.0.1:{disp_port}/predictions/stub", seconds=seconds,
                       concurrency=concurrency)
            )  # fmt: skip
            direct = asyncio.run(
                hammer(f"http://127.0.0.1:{stub_port}/predictions/stub_i0", seconds=seconds,
                       concurrency=concurrency)
            )  # fmt: skip
            out[f"concurrency_{concurrency}"] = {
                "dispatcher_req_per_s": via,
                "stub_alone_req_per_s": direct,
            }
        return out
    finally:
        os.sched_setaffinity(0, set(cpus))
        for p in procs:
            p.terminate()
            p.join(5)


def main() -> int:
    parser = argparse.ArgumentParser(
        epilog=FIGURE, description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--requests", type=int, default=2000, help="per path and concurrency")
    parser.add_argument("--seconds", type=float, default=5.0, help="per max-rate measurement")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    cpus = allowed_cpus()
    latency = asyncio.run(latency_part(args.requests, cpus))
    rate = rate_part(args.seconds, cpus)
    result = {"cpus": cpus, "latency": latency, "max_rate": rate}
    print("dispatcher overhead (tiny model, 1 instance x 1 thread, batch 1)")
    for key, row in latency.items():
        assert isinstance(row, dict)
        d, t = row["dispatcher"], row["direct"]
        print(
            f"  {key}: via dispatcher mean {d['mean_ms']:.2f} p50 {d['p50_ms']:.2f} "
            f"p99 {d['p99_ms']:.2f} ms | direct to TorchServe mean {t['mean_ms']:.2f} "
            f"p50 {t['p50_ms']:.2f} p99 {t['p99_ms']:.2f} ms | added p50 "
            f"{row['added_p50_ms']:.2f} ms, mean {row['added_mean_ms']:.2f} ms "
            f"(n={d['n']} each, interleaved blocks of 100)"
        )
    print(f"max rate, dispatcher pinned to cpu {rate['dispatcher_cpu']} (stub backend + client "
          f"on cpu {rate['client_and_stub_cpu']}):")  # fmt: skip
    for key, row in rate.items():
        if isinstance(row, dict):
            print(
                f"  {key}: {row['dispatcher_req_per_s']:.0f} req/s through the dispatcher; "
                f"the same client against the stub alone: {row['stub_alone_req_per_s']:.0f} req/s"
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
