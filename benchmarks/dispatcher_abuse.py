"""The dispatcher under unfriendly clients, and what its limits cost (issue 10).

Everything runs against a stub backend that answers at once, so only the dispatcher is
measured. The dispatcher runs in its own process (its RSS is read from /proc), from this
tree or, with ``--old-tree DIR``, from another source tree (e.g. ``git archive`` of the
commit before the limits) for a before/after comparison; the trees alternate (old, new,
old, new, ...) because these machines are shared and noisy.

1. ``rss``: peak RSS of the dispatcher while 16 clients upload 60 MB each, concurrently
   (target: under 150 MB).
2. ``abuse``: good requests (closed loop, concurrency 4, 1 KB bodies) alone and while 100
   slow-header connections (one byte a second, reconnecting when closed) and 20 oversized
   uploads (60 MB, in a loop) run; blocks alternate alone/abused; medians and errors.
3. ``overhead``: throughput and p50 of good requests (concurrency 16) through the dispatcher,
   old tree vs new tree, interleaved.

Usage::

    git archive c93121c operator | tar -x -C /tmp/packrat-old
    .venv/bin/python benchmarks/dispatcher_abuse.py --old-tree /tmp/packrat-old/operator
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from packrat.serve.loadgen import percentile
from packrat.serve.torchserve import free_ports

HERE = Path(__file__).resolve().parents[1] / "operator"
BIG = 60 * 1000 * 1000

DISPATCHER = """
import asyncio, sys
from aiohttp import web
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher import Dispatcher

async def main(port, backend):
    inst = InstanceSpec(index=0, name="stub_i0", threads=1, batch=64, cpus=(0,))
    d = Dispatcher(model="stub", instances=[inst], backend_url=f"http://127.0.0.1:{backend}")
    d.set_up(0, True)
    runner = d.runner() if hasattr(d, "runner") else web.AppRunner(d.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def stub(port: int) -> web.AppRunner:
    async def predict(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"[0.0]", content_type="application/json")

    app = web.Application(client_max_size=128 * 1024 * 1024)
    app.router.add_post("/predictions/{name}", predict)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


class DispatcherProcess:
    def __init__(self, tree: Path, backend: int) -> None:
        self.port = free_ports(1)[0]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DISPATCHER, str(self.port), str(backend)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"dispatcher from {tree} did not start")
        self.url = f"http://127.0.0.1:{self.port}/predictions/stub"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def upload(session: aiohttp.ClientSession, url: str, body: bytes) -> int:
    try:
        async with session.post(url, data=body) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, ConnectionError):
        return 0  # the dispatcher closed the connection after its 413


async def rss_part(tree: Path, backend: int) -> dict[str, float]:
    d = DispatcherProcess(tree, backend)
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(20):
                await upload(s, d.url, b"x" * 1000)
        before = rss_mb(d.proc.pid)
        peak = before
        big = b"\0" * BIG
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
            tasks = [asyncio.create_task(upload(s, d.url, big)) for _ in range(16)]
            while not all(t.done() for t in tasks):
                peak = max(peak, rss_mb(d.proc.pid))
                await asyncio.sleep(0.02)
            statuses = [t.result() for t in tasks]
        return {
            "rss_before_mb": before,
            "rss_peak_mb": peak,
            "answered_413": statuses.count(413),
            "answered_200": statuses.count(200),
        }
    finally:
        d.stop()


async def good_loop(url: str, seconds: float, concurrency: int) -> tuple[list[float], int, int]:
    lat: list[float] = []
    errors = {"n": 0}
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def worker() -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                status = await upload(s, url, b"g" * 1024)
                if status == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors["n"] += 1

        t_start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t_start
    return lat, errors["n"], int(len(lat) / elapsed)


async def slow_header(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"POST /predictions/stub HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set():
                w.write(b"X")
                await w.drain()
                await asyncio.sleep(1.0)
        except (ConnectionError, OSError):
            await asyncio.sleep(0.1)


async def oversized(url: str, stop: asyncio.Event, big: bytes) -> None:
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            await upload(s, url, big)


async def abuse_part(tree: Path, backend: int, *, blocks: int, seconds: float) -> dict[str, object]:
    d = DispatcherProcess(tree, backend)
    try:
        alone: list[float] = []
        abused: list[float] = []
        errors = {"alone": 0, "abused": 0}
        big = b"\0" * BIG
        await good_loop(d.url, 1.0, 4)  # warm
        for _ in range(blocks):
            lat, err, _ = await good_loop(d.url, seconds, 4)
            alone += lat
            errors["alone"] += err
            stop = asyncio.Event()
            attackers = [asyncio.create_task(slow_header(d.port, stop)) for _ in range(100)]
            attackers += [asyncio.create_task(oversized(d.url, stop, big)) for _ in range(20)]
            await asyncio.sleep(1.0)
            lat, err, _ = await good_loop(d.url, seconds, 4)
            abused += lat
            errors["abused"] += err
            stop.set()
            for task in attackers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        p50_alone = percentile([v * 1000 for v in alone], 50)
        p50_abused = percentile([v * 1000 for v in abused], 50)
        return {
            "good_alone": {"n": len(alone), "p50_ms": p50_alone, "errors": errors["alone"]},
            "good_abused": {"n": len(abused), "p50_ms": p50_abused, "errors": errors["abused"]},
            "added_p50_pct": 100 * (p50_abused / p50_alone - 1),
            "rss_after_mb": rss_mb(d.proc.pid),
        }
    finally:
        d.stop()


async def overhead_part(
    trees: dict[str, Path], backend: int, *, rounds: int, seconds: float
) -> dict[str, object]:
    out: dict[str, dict[str, list[float]]] = {k: {"req_per_s": [], "p50_ms": []} for k in trees}
    procs = {k: DispatcherProcess(t, backend) for k, t in trees.items()}
    try:
        for p in procs.values():
            await good_loop(p.url, 1.0, 16)
        for _ in range(rounds):
            for k, p in procs.items():
                lat, _errors, rate = await good_loop(p.url, seconds, 16)
                out[k]["req_per_s"].append(rate)
                out[k]["p50_ms"].append(percentile([v * 1000 for v in lat], 50))
    finally:
        for p in procs.values():
            p.stop()
    return {
        k: {
            "req_per_s_median": statistics.median(v["req_per_s"]),
            "req_per_s_runs": v["req_per_s"],
            "p50_ms_median": statistics.median(v["p50_ms"]),
            "p50_ms_runs": [round(x, 3) for x in v["p50_ms"]],
        }
        for k, v in out.items()
    }


async def amain(args: argparse.Namespace) -> dict[str, object]:
    backend = free_ports(1)[0]
    runner = await stub(backend)
    trees = {"new": HERE}
    if args.old_tree:
        trees = {"old": args.old_tree, "new": HERE}
    result: dict[str, object] = {"loadavg_at_start": os.getloadavg()[0]}
    try:
        for name in args.parts.split(","):
            for label, tree in trees.items():
                if name == "rss":
                    result[f"rss_{label}"] = await rss_part(tree, backend)
                elif name == "abuse":
                    result[f"abuse_{label}"] = await abuse_part(
                        tree, backend, blocks=args.blocks, seconds=args.seconds
                    )
            if name == "overhead":
                result["overhead"] = await overhead_part(
                    trees, backend, rounds=args.rounds, seconds=args.seconds
                )
            print(json.dumps({k: v for k, v in result.items()}, indent=1), flush=True)
    finally:
        await runner.cleanup()
    result["loadavg_at_end"] = os.getloadavg()[0]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--old-tree", type=Path, help="another source tree's operator/ dir")
    parser.add_argument("--parts", default="rss,abuse,overhead")
    parser.add_argument("--blocks", type=int, default=4, help="alone/abused block pairs")
    parser.add_argument("--rounds", type=int, default=6, help="old/new overhead rounds")
    parser.add_argument("--seconds", type=float, default=4.0, help="per block or round")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    result = asyncio.run(amain(args))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
