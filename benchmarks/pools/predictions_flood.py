"""A good client's latency on one pool model while others post huge bodies to another.

A real pool process (``python -m packrat.serve.pool``, one compute thread, two ``tiny``
models) from two trees, interleaved (A B A B ...): ``--before`` (an older checkout, whose
``POST /predictions/{model}`` read up to ``--max-body``, 16 MiB, and parsed it on the compute
thread) and this one (capped at one sample's size as JSON, 64 KiB for ``tiny``: a 413 unread
beyond). Per run: the good client alone for ``--seconds``, then with ``--attackers`` clients
each posting a 10 MB JSON body to the other model in a loop; the median and p90 of the good
client's requests. Raw results and the summary to ``-o``.

    flock /tmp/packrat-bench.lock python benchmarks/pools/predictions_flood.py \
        --before /tmp/base --rounds 2 -o benchmarks/results/pools/predictions-flood.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from packrat.serve.pod.server import wait_ready

HERE = Path(__file__).resolve().parents[2]
FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What do huge bodies posted to one pool model cost another model\'s clients?"'
    " (#what-do-huge-bodies-posted-to-one-pool-model-cost-another-models-clients)"
)
GOOD = json.dumps([0.25] * 16).encode()
HUGE = json.dumps([[0.123456789] * 16] * 40_000).encode()  # about 10 MB


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(tree: Path, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = folder / "pool.json"
    models = [{"name": "a", "spec": "tiny", "seed": 1}, {"name": "b", "spec": "tiny", "seed": 2}]
    doc = {"directory": str(folder), "budget_bytes": 1 << 24, "threads": 1, "models": models}
    config.write_text(json.dumps(doc))
    port = _port()
    env = {**os.environ, "PYTHONPATH": str(tree / "operator")}
    argv = [sys.executable, "-m", "packrat.serve.pool", str(config), "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


async def _good(session: aiohttp.ClientSession, url: str, seconds: float) -> list[float]:
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        async with session.post(f"{url}/predictions/b", data=GOOD) as r:
            await r.read()
            assert r.status == 200, r.status
        times.append(time.perf_counter() - start)
    return times


async def _attack(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> list[int]:
    statuses = []
    while not stop.is_set():
        try:
            async with session.post(f"{url}/predictions/a", data=HUGE) as r:
                await r.read()
                statuses.append(r.status)
        except aiohttp.ClientError:
            statuses.append(0)  # the server closed a refused upload's connection
    return statuses


async def _measure(url: str, seconds: float, attackers: int) -> dict[str, Any]:
    if not await wait_ready(url, timeout_s=120, path="/v2/health/ready"):
        raise TimeoutError(f"{url} never became ready")
    async with aiohttp.ClientSession() as session:
        alone = await _good(session, url, seconds)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_attack(session, url, stop)) for _ in range(attackers)]
        await asyncio.sleep(0.5)  # the attack under way
        attacked = await _good(session, url, seconds)
        stop.set()
        statuses = [s for t in tasks for s in await t]
    return {"alone": alone, "attacked": attacked, "attack_statuses": sorted(set(statuses))}


def _stats(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": 1e3 * statistics.median(ordered),
        "p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))],
        "requests": len(ordered),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--before", type=Path, required=True, help="a checkout before the fix")
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs of pool processes")
    parser.add_argument("--seconds", type=float, default=8.0, help="per phase")
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", HERE)):
            with tempfile.TemporaryDirectory(prefix="pool-flood-") as tmp:
                proc, url = _start(tree, Path(tmp))
                try:
                    run = asyncio.run(_measure(url, args.seconds, args.attackers))
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
            runs[name].append(run)
            print(name, {k: _stats(run[k]) for k in ("alone", "attacked")}, flush=True)
    summary = {
        name: {
            kind: _stats([t for run in results for t in run[kind]])
            for kind in ("alone", "attacked")
        }
        | {"attack_statuses": sorted({s for run in results for s in run["attack_statuses"]})}
        for name, results in runs.items()
    }
    print(json.dumps(summary, indent=1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        report = {"summary": summary, "runs": runs, "body_bytes": len(HUGE)}
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
