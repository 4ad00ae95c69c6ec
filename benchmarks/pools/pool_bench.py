"""Many models in one pool process under a memory budget (issue 39, figure "pool: Zipf mix,
P50/P99 per model class, cold starts, bytes read, memory, per configuration").

N models (half ResNet-50, half BERT-base, each with its own random weights, so each its own
layer file and pages) on one ``python -m packrat.serve.pool`` process whose weight budget
holds about a quarter of them. One open-loop trace (Poisson arrivals, a Zipf(s) choice of
model over a fixed random order) is replayed against each configuration, interleaved over
``--rounds`` (A B C D A B C D ...), each on a fresh pool process started cold:

    load+lru       load-then-run, whole-model LRU (what ModelMesh does)
    demand+lru     each layer read when the forward pass reaches it, whole-model LRU
    prefetch+lru   layer-ordered prefetch one layer ahead, whole-model LRU
    prefetch+lcache  layer-ordered prefetch, LCache prefixes (plan.lcache)

Reads go through the pool's rate-limited path (``--read-mbps``, a network volume). Reported
per configuration: P50/P99 per model class, failed requests, cold starts per minute, bytes
read, peak weights resident (mincore) and peak process RSS; raw results in ``--out``.

    flock /tmp/packrat-bench.lock python benchmarks/pools/pool_bench.py \
        --out benchmarks/results/pools/pool_bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from packrat.serve.codec import example_body
from packrat.serve.torchserve.process import free_ports

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How do many models share one pool under a memory budget?"'
    " (#how-do-many-models-share-one-pool-under-a-memory-budget)"
)

CONFIGS = {
    "load+lru": ("load", "lru"),
    "demand+lru": ("demand", "lru"),
    "prefetch+lru": ("prefetch", "lru"),
    "prefetch+lcache": ("prefetch", "lcache"),
}
SPECS = ("resnet50", "bert-base")
FILE_BYTES = {"resnet50": 102_506_496, "bert-base": 437_948_416}  # the layer files' data


def _trace(n: int, rate: float, seconds: float, s: float, seed: int) -> list[tuple[float, int]]:
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)  # popularity rank -> model, so both classes are hot and cold
    weights = [1.0 / (k + 1) ** s for k in range(n)]
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append((t, order[rng.choices(range(n), weights)[0]]))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _start(config: dict[str, Any], work: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    path = work / f"pool-{name}.json"
    path.write_text(json.dumps(config))
    port = free_ports(1)[0]
    log = (work / f"pool-{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "packrat.serve.pool", str(path), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900  # the first start writes every layer file
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the pool exited: {(work / f'pool-{name}.log').read_text()}")
        try:
            _get(f"{url}/v2/health/ready")
            return proc, url
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the pool did not start")


async def _replay(
    url: str, trace: list[tuple[float, int]], names: list[str]
) -> list[dict[str, Any]]:
    bodies = {spec: example_body(spec) for spec in SPECS}
    results: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(at: float, k: int, start: float) -> None:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            spec = SPECS[k % 2]
            t0 = time.monotonic()
            try:
                async with session.post(f"{url}/predictions/{names[k]}", data=bodies[spec]) as r:
                    await r.read()
                    status = r.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            results.append(
                {
                    "t": at,
                    "model": names[k],
                    "spec": spec,
                    "status": status,
                    "latency_s": time.monotonic() - t0,
                }
            )

        start = time.monotonic()
        await asyncio.gather(*(one(at, k, start) for at, k in trace))
    return results


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _summary(
    results: list[dict[str, Any]], status: dict[str, Any], seconds: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"failed": sum(r["status"] != 200 for r in results)}
    for spec in SPECS:
        lat = [r["latency_s"] for r in results if r["spec"] == spec and r["status"] == 200]
        out[spec] = {"n": len(lat), "p50_s": _pct(lat, 0.5), "p99_s": _pct(lat, 0.99)}
    models = status["models"].values()
    out["cold_starts_per_min"] = sum(m["cold_starts"] for m in models) / (seconds / 60)
    out["read_bytes"] = sum(m["read_bytes"] for m in models)
    builds = sorted(m["build_s"] for m in models)
    out["model_build_ms_median"] = 1000 * builds[len(builds) // 2]
    out["peak_resident_bytes"] = status["peak_resident_bytes"]
    out["peak_rss_bytes"] = status["peak_rss_bytes"]
    out["budget_bytes"] = status["budget_bytes"]
    out["read_rate_bps"] = status["read_rate_bps"]
    out["disk_read_bps"] = status["disk_read_bps"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--models", type=int, default=24)
    parser.add_argument("--rate", type=float, default=1.0, help="requests/s, all models")
    parser.add_argument("--seconds", type=float, default=60.0, help="per configuration run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--read-mbps", type=float, default=400.0)
    parser.add_argument("--budget-fraction", type=float, default=0.25)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/packrat-pools-bench/pool"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    names = [f"{SPECS[k % 2].replace('-', '')}-{k:02d}" for k in range(args.models)]
    models = [{"name": n, "spec": SPECS[k % 2], "seed": 1000 + k} for k, n in enumerate(names)]
    total = sum(FILE_BYTES[SPECS[k % 2]] for k in range(args.models))
    base = {
        "directory": str(args.work / "files"),
        "budget_bytes": int(args.budget_fraction * total),
        "read_rate_bps": args.read_mbps * 1e6,
        "models": models,
    }
    trace = _trace(args.models, args.rate, args.seconds, args.zipf, seed=7)
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for name in args.configs:
            mode, policy = CONFIGS[name]
            proc, url = _start({**base, "mode": mode, "policy": policy}, args.work, name)
            try:
                load = os.getloadavg()
                results = asyncio.run(_replay(url, trace, names))
                status = _get(f"{url}/pool/status")
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            summary = _summary(results, status, args.seconds)
            runs.append(
                {
                    "round": rnd,
                    "config": name,
                    "load_avg": load,
                    "summary": summary,
                    "requests": results,
                }
            )
            r, b = summary["resnet50"], summary["bert-base"]
            print(
                f"round {rnd} {name:16s} resnet50 p50 {r['p50_s']:.2f} p99 {r['p99_s']:.2f} | "
                f"bert p50 {b['p50_s']:.2f} p99 {b['p99_s']:.2f} | failed {summary['failed']} "
                f"cold/min {summary['cold_starts_per_min']:.1f} read "
                f"{summary['read_bytes'] / 1e9:.1f} GB peak resident "
                f"{summary['peak_resident_bytes'] / 1e9:.2f}/{summary['budget_bytes'] / 1e9:.2f} GB"
                f" rss {summary['peak_rss_bytes'] / 1e9:.2f} GB load {load[0]:.1f}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "args": vars(args) | {"work": str(args.work), "out": str(args.out)},
                "trace_len": len(trace),
                "runs": runs,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
