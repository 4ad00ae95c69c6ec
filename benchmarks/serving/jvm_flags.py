"""TorchServe's JVM with the client compiler only (the pod's flags) against the JVM's defaults
(issue 14): the start, and what the frontend costs per request once warm.

Two TorchServes run side by side, one per flag set, each with the same model registered
(one worker, batch 1). First, repeated starts, interleaved: time until the management API
answers and the JVM's CPU seconds by then. Then serving: closed-loop load straight to
TorchServe's inference port, in blocks that alternate between the two (a first block each
to warm the JIT is discarded); per block the request rate, p50 and p99, and the JVM's CPU
microseconds per request (its /proc counters). A small model (``tiny``) makes the frontend's
share of a request largest; medians and spread across blocks.

    python benchmarks/serving/jvm_flags.py --model tiny --starts 5 --blocks 6 --seconds 10 \\
        --out benchmarks/results/jvm-flags-tiny
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from packrat.bench.loadgen import percentile
from packrat.serve.codec import example_body
from packrat.serve.config import JVM_ARGS, registration_query
from packrat.serve.torchserve.archive import build_archive
from packrat.serve.torchserve.jvm import java_pids
from packrat.serve.torchserve.process import TorchServe

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a serving pod take to start, and how much memory does it hold?"'
    " (#how-long-does-a-serving-pod-take-to-start-and-how-much-memory-does-it-hold)"
)

# Both without TorchServe's class-data-sharing archive (packrat.serve.torchserve.jvm;
# "-Xshare:auto" is
# the JVM's default and keeps the archive off): it is made for JVM_ARGS and the JVM would
# ignore it for the defaults, which would measure the archive, not the flags.
FLAGS = {
    "defaults": ("-XX:+UseContainerSupport", "-XX:-UsePerfData", "-Xshare:auto"),
    "client-compiler": (*JVM_ARGS, "-Xshare:auto"),
}
TICK = os.sysconf("SC_CLK_TCK")


def jvm_cpu_s(ts: TorchServe) -> float:
    """CPU seconds of the java process in this TorchServe's process group."""
    assert ts.proc is not None
    total = 0.0
    for pid in java_pids(ts.proc.pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


async def one_start(label: str, base: int) -> dict[str, float]:
    ts = TorchServe(
        workdir=Path(tempfile.mkdtemp(prefix="jvm-")), port_base=base, jvm_args=FLAGS[label]
    )
    t0 = time.monotonic()
    await ts.start()
    up = time.monotonic() - t0
    cpu = jvm_cpu_s(ts)
    await ts.stop()
    return {"up_s": up, "jvm_cpu_s": cpu}


async def block(
    ts: TorchServe, name: str, body: bytes, *, clients: int, seconds: float
) -> dict[str, float]:
    url = f"{ts.inference_url}/predictions/{name}"
    latencies: list[float] = []
    errors = 0
    cpu0 = jvm_cpu_s(ts)
    end = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < end:
            start = time.perf_counter()
            async with session.post(
                url, data=body, headers={"Content-Type": "application/octet-stream"}
            ) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    continue
            latencies.append((time.perf_counter() - start) * 1000)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    cpu = jvm_cpu_s(ts) - cpu0
    return {
        "req_per_s": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "jvm_cpu_us_per_req": cpu / max(1, len(latencies)) * 1e6,
        "errors": errors,
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    labels = list(FLAGS)
    starts: dict[str, list[dict[str, float]]] = {k: [] for k in labels}
    for i in range(args.starts):
        for label in labels if i % 2 == 0 else labels[::-1]:
            starts[label].append(await one_start(label, args.port_base))
    work = Path(tempfile.mkdtemp(prefix="jvm-serve-"))
    archive = build_archive(args.model, workdir=work / "archive")
    body = example_body(args.model)
    servers: dict[str, TorchServe] = {}
    blocks: dict[str, list[dict[str, float]]] = {k: [] for k in labels}
    try:
        for k, label in enumerate(labels):
            ts = TorchServe(
                workdir=work / label, port_base=args.port_base + 20 * (k + 1), jvm_args=FLAGS[label]
            )
            await ts.start()
            servers[label] = ts
            mar = ts.add_archive(archive.path)
            await ts.register(
                registration_query(None, mar=mar, name=archive.name, max_batch_delay_ms=1)
            )
        for label in labels:  # warm the JIT; discarded
            await block(
                servers[label], archive.name, body, clients=args.clients, seconds=args.seconds
            )
        for i in range(args.blocks):
            for label in labels if i % 2 == 0 else labels[::-1]:
                r = await block(
                    servers[label], archive.name, body, clients=args.clients, seconds=args.seconds
                )
                blocks[label].append(r)
                print(
                    f"block {i} {label:16} {r['req_per_s']:7.1f} req/s p50 {r['p50_ms']:.2f} ms"
                    f" p99 {r['p99_ms']:.2f} ms jvm {r['jvm_cpu_us_per_req']:.0f} us/req",
                    flush=True,
                )
    finally:
        for ts in servers.values():
            await ts.stop()
    out: dict[str, Any] = {"model": args.model, "clients": args.clients, "seconds": args.seconds}
    for label in labels:
        out[label] = {
            "flags": list(FLAGS[label]),
            "up_s": summary([s["up_s"] for s in starts[label]]),
            "jvm_cpu_at_up_s": summary([s["jvm_cpu_s"] for s in starts[label]]),
            **{
                key: summary([b[key] for b in blocks[label]])
                for key in ("req_per_s", "p50_ms", "p99_ms", "jvm_cpu_us_per_req")
            },
            "errors": sum(int(b["errors"]) for b in blocks[label]),
            "starts": starts[label],
            "blocks": blocks[label],
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--port-base", type=int, default=27700)
    parser.add_argument("--out", default="benchmarks/results/jvm-flags-tiny")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    Path(args.out + ".json").write_text(json.dumps(out, indent=1))
    for label in FLAGS:
        o = {k: v["median"] for k, v in out[label].items() if isinstance(v, dict)}
        print(
            f"{label:16} up {o['up_s']:.2f} s, JVM CPU at up {o['jvm_cpu_at_up_s']:.2f} s;"
            f" {o['req_per_s']:.1f} req/s, p50 {o['p50_ms']:.2f} ms,"
            f" p99 {o['p99_ms']:.2f} ms, {o['jvm_cpu_us_per_req']:.0f} us JVM/req"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
