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
   uploads (60 MB streamed, in a loop) run, from their own process (:class:`Attackers`);
   blocks alternate alone/abused; medians, errors, the dispatcher's CPU share in each kind
   of block and what the attackers managed (connections, bytes sent, 413s received).
3. ``overhead``: throughput and p50 of good requests (concurrency 16) through the dispatcher,
   old tree vs new tree, interleaved.

Usage::

    git archive c93121c operator | tar -x -C /tmp/packrat-old
    .venv/bin/python benchmarks/boundaries/dispatcher_abuse.py --old-tree /tmp/packrat-old/operator
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from packrat.bench.loadgen import percentile
from packrat.serve.torchserve.process import free_ports

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Is every boundary bounded?"'
    " (#is-every-boundary-bounded)"
)

HERE = Path(__file__).resolve().parents[2] / "operator"
BIG = 60 * 1000 * 1000

DISPATCHER = """
import asyncio, sys
from aiohttp import web
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher

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


ATTACKERS = """
import asyncio, json, sys

BIG = int(sys.argv[3])
HEAD = b"POST /predictions/stub HTTP/1.1\\r\\nHost: x\\r\\n"
stats = {"slow_connects": 0, "upload_connects": 0, "upload_bytes": 0, "answers_413": 0}

async def slow_header(port):
    while True:
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            stats["slow_connects"] += 1
            w.write(HEAD)
            while True:
                w.write(b"X")
                await w.drain()
                await asyncio.sleep(1.0)
        except (ConnectionError, OSError):
            await asyncio.sleep(0.1)

async def oversized(port):
    chunk = memoryview(bytes(64 * 1024))
    while True:
        answer = None
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            stats["upload_connects"] += 1
            w.write(HEAD + b"Content-Length: %d\\r\\n\\r\\n" % BIG)
            answer = asyncio.ensure_future(r.readline())
            sent = 0
            while sent < BIG and not answer.done():
                w.write(chunk)
                await w.drain()
                sent += len(chunk)
                stats["upload_bytes"] += len(chunk)
            await answer
            w.close()
        except (ConnectionError, OSError):
            await asyncio.sleep(0.01)
        if answer is not None and answer.done() and not answer.exception():
            stats["answers_413"] += answer.result().startswith(b"HTTP/1.1 413")

async def main(port, slow, uploads):
    tasks = [asyncio.create_task(slow_header(port)) for _ in range(slow)]
    tasks += [asyncio.create_task(oversized(port)) for _ in range(uploads)]
    print("attacking", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(json.dumps(stats), flush=True)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[4]), int(sys.argv[2])))
"""


class Attackers:
    """``slow`` slow-header connections (a byte a second, reconnecting when closed) and
    ``uploads`` clients streaming 60 MB bodies in 64 KiB writes (reconnecting when closed),
    in their own process: in the measuring process their writes would stall the event loop
    that times the good requests (aiohttp copies a 60 MB ``bytes`` body three times per
    attempt; the loop stalled 24-32 s at a time on this machine), measuring the client."""

    def __init__(self, port: int, uploads: int = 20, slow: int = 100) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ATTACKERS, str(port), str(uploads), str(BIG), str(slow)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"attacking":
            raise RuntimeError("attackers did not start")
        self.cpu0 = cpu_seconds(self.proc.pid)

    def stop(self) -> dict[str, float]:
        cpu = cpu_seconds(self.proc.pid) - self.cpu0
        out, _ = self.proc.communicate(b"", timeout=30)
        stats: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
        stats["cpu_s"] = round(cpu, 2)
        return stats


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def abuse_part(tree: Path, backend: int, *, blocks: int, seconds: float) -> dict[str, object]:
    d = DispatcherProcess(tree, backend)
    try:
        alone: list[float] = []
        abused: list[float] = []
        errors = {"alone": 0, "abused": 0}
        cpu = {"alone": 0.0, "abused": 0.0}
        attack: dict[str, float] = {}
        await good_loop(d.url, 1.0, 4)  # warm
        for _ in range(blocks):
            c0 = cpu_seconds(d.proc.pid)
            lat, err, _ = await good_loop(d.url, seconds, 4)
            cpu["alone"] += cpu_seconds(d.proc.pid) - c0
            alone += lat
            errors["alone"] += err
            attackers = Attackers(d.port)
            try:
                await asyncio.sleep(1.0)
                c0 = cpu_seconds(d.proc.pid)
                lat, err, _ = await good_loop(d.url, seconds, 4)
                cpu["abused"] += cpu_seconds(d.proc.pid) - c0
                abused += lat
                errors["abused"] += err
            finally:
                for k, v in attackers.stop().items():
                    attack[k] = attack.get(k, 0) + v
        p50_alone = percentile([v * 1000 for v in alone], 50)
        p50_abused = percentile([v * 1000 for v in abused], 50)
        busy = {k: round(100 * v / (blocks * seconds), 1) for k, v in cpu.items()}
        return {
            "good_alone": {"n": len(alone), "p50_ms": p50_alone, "errors": errors["alone"]},
            "good_abused": {"n": len(abused), "p50_ms": p50_abused, "errors": errors["abused"]},
            "added_p50_pct": 100 * (p50_abused / p50_alone - 1),
            "dispatcher_cpu_pct": busy,
            "attackers": attack,
            "rss_after_mb": rss_mb(d.proc.pid),
        }
    finally:
        d.stop()


async def overhead_part(
    trees: dict[str, Path], backend: int, *, rounds: int, seconds: float
) -> dict[str, object]:
    out: dict[str, dict[str, list[float]]] = {
        k: {"req_per_s": [], "p50_ms": [], "cpu_us": []} for k in trees
    }
    procs = {k: DispatcherProcess(t, backend) for k, t in trees.items()}
    try:
        for p in procs.values():
            await good_loop(p.url, 1.0, 16)
        for _ in range(rounds):
            for k, p in procs.items():
                cpu = cpu_seconds(p.proc.pid)
                lat, _errors, rate = await good_loop(p.url, seconds, 16)
                # the dispatcher's own CPU time per answered request: what a busy machine
                # changes least (throughput and latency move with the other processes)
                used = cpu_seconds(p.proc.pid) - cpu
                out[k]["req_per_s"].append(rate)
                out[k]["p50_ms"].append(percentile([v * 1000 for v in lat], 50))
                out[k]["cpu_us"].append(round(1e6 * used / max(len(lat), 1), 1))
    finally:
        for p in procs.values():
            p.stop()
    return {
        k: {
            "req_per_s_median": statistics.median(v["req_per_s"]),
            "req_per_s_runs": v["req_per_s"],
            "p50_ms_median": statistics.median(v["p50_ms"]),
            "p50_ms_runs": [round(x, 3) for x in v["p50_ms"]],
            "cpu_us_per_request_median": statistics.median(v["cpu_us"]),
            "cpu_us_per_request_runs": v["cpu_us"],
        }
        for k, v in out.items()
    }


async def amain(args: argparse.Namespace) -> dict[str, object]:
    backend = free_ports(1)[0]
    runner = await stub(backend)
    trees: dict[str, Path] = {"old": args.old_tree} if args.old_tree else {}
    for named in args.tree:
        label, _, path = named.partition("=")
        trees[label] = Path(path)
    trees["new"] = HERE
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
    parser = argparse.ArgumentParser(
        epilog=FIGURE, description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--old-tree", type=Path, help="another source tree's operator/ dir")
    parser.add_argument(
        "--tree", action="append", default=[], metavar="LABEL=DIR",
        help="one more source tree to compare (repeatable), e.g. head=/tmp/head/operator",
    )  # fmt: skip
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
