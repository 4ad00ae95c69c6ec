"""The native runtime against TorchServe, side by side (issue 25).

Three measurements, each interleaving the two runtimes (A B A B ..., the order alternating
per repetition) because these machines are shared and noisy:

- ``cpu``: the serving path's CPU per request. One pod per runtime (the ``tiny`` model, plan
  ``2x1t/b8`` on the same two cores), both running; closed-loop load at concurrency 16 goes
  to one pod at a time in blocks, and each block reads the CPU time of every process of
  that pod (dispatcher, zygote, workers, TorchServe's JVM and launchers: ``/proc/<pid>/stat``)
  before and after. A first block per pod warms it (and the JIT) and is discarded. The load
  generator's own CPU is not counted.
- ``start``: a ResNet-50 pod with two 1-thread instances (``2x1t/b2``) started from nothing
  (fresh work directory: the weight file is written too), timed from the spawn to its first
  ``/ping`` 200; then its PSS (``/proc/<pid>/smaps_rollup`` of every process, by kind, as
  ``benchmarks/cold_start/cold_start.py`` reads it), and the pod's own start-up timeline (its
  log line).
  ``--before DIR`` adds native pods from another checkout's package, in the same rotation.
- ``latency``: ResNet-50 through ``packrat serve`` at B = 4, 8, 16, 32 on both runtimes,
  the plan ``2x1t/b(B/2)`` (what the optimizer picks on this machine's profile) and fat
  ``1x2t/bB``: per B the four pods run side by side (idle but for the one measured), and
  each round sends one burst of B requests to each, in a rotated order; batch latency until
  the last answer. Ratios are paired by round (the same minute's background load).

    python benchmarks/serving/native_runtime.py cpu --blocks 6 --seconds 8 \
        --out benchmarks/results/native-cpu-tiny
    python benchmarks/serving/native_runtime.py start --repeats 4 \
        --out benchmarks/results/native-start-resnet50 [--before OTHER_CHECKOUT/operator]
    python benchmarks/serving/native_runtime.py latency --min-bursts 8 --requests 64 \
        --out benchmarks/results/native-latency-resnet50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cold_start"))
from cold_start import _children, pod_memory
from packrat.bench.loadgen import Target, percentile, run_bursts
from packrat.bench.servers import Launch, PackratServe
from packrat.plan.optimizer import Plan
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.codec import example_body
from packrat.serve.torchserve.process import free_ports

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Native runtime or TorchServe?"'
    " (#native-runtime-or-torchserve)"
)

RUNTIMES = ("native", "torchserve")
TICK = os.sysconf("SC_CLK_TCK")


def plan(count: int, threads: int, batch: int) -> Plan:
    return Plan.from_dict(
        {
            "cpus": count * threads,
            "batch": count * batch,
            "instances": [{"threads": threads, "batch": batch, "count": count}],
            "expected_latency_ms": 1.0,
        }
    )


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of every live process of the tree under ``root``."""
    total = 0.0
    for pid in _children(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def pod(model: str, p: Plan, runtime: str, workdir: Path, cpus: list[int]) -> PackratServe:
    launch = Launch(
        model=model, cpus=cpus, workdir=workdir, max_batch_delay_ms=5, startup_timeout_s=600
    )
    return PackratServe(launch, plan=p, runtime=runtime)


# -- cpu ------------------------------------------------------------------------------------------
async def block(url: str, body: bytes, *, concurrency: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    end = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def client() -> None:
            while time.monotonic() < end:
                start = time.perf_counter()
                async with s.post(
                    f"{url}/predictions/tiny", data=body,
                    headers={"Content-Type": "application/octet-stream"},
                ) as r:  # fmt: skip
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: {r.status}")
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


async def cpu(args: argparse.Namespace) -> dict[str, Any]:
    cpus = allowed_cpus()[:2]
    body = example_body("tiny")
    work = Path(tempfile.mkdtemp(prefix="packrat-native-cpu-"))
    pods = {r: pod("tiny", plan(2, 1, 8), r, work / r, cpus) for r in RUNTIMES}
    out: dict[str, Any] = {"blocks": [], "loadavg_before": loadavg()}
    try:
        for p in pods.values():
            await p.start()
        for i in range(args.blocks + 1):
            for runtime in RUNTIMES if i % 2 == 0 else RUNTIMES[::-1]:
                p = pods[runtime]
                assert p.proc is not None
                before = tree_cpu_s(p.proc.pid)
                lat = await block(p.url, body, concurrency=args.concurrency, seconds=args.seconds)
                used = tree_cpu_s(p.proc.pid) - before
                row = {
                    "block": i, "runtime": runtime, "requests": len(lat),
                    "rate": len(lat) / args.seconds, "cpu_us_per_request": 1e6 * used / len(lat),
                    "p50_ms": 1000 * statistics.median(lat),
                    "p99_ms": 1000 * percentile(lat, 99), "warmup": i == 0,
                }  # fmt: skip
                out["blocks"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        for p in pods.values():
            await p.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["loadavg_after"] = loadavg()
    for runtime in RUNTIMES:
        rows = [b for b in out["blocks"] if b["runtime"] == runtime and not b["warmup"]]
        out[runtime] = {
            k: summary([b[k] for b in rows]) for k in ("cpu_us_per_request", "rate", "p50_ms")
        }
    ratios = [
        n["cpu_us_per_request"] / t["cpu_us_per_request"]
        for n, t in zip(
            [b for b in out["blocks"] if b["runtime"] == "native" and not b["warmup"]],
            [b for b in out["blocks"] if b["runtime"] == "torchserve" and not b["warmup"]],
            strict=True,
        )
    ]
    out["native_over_torchserve_cpu"] = summary(ratios)
    return out


# -- start ----------------------------------------------------------------------------------------
async def _ping(s: aiohttp.ClientSession, url: str) -> int:
    try:
        async with s.get(f"{url}/ping", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


def start_timeline(log: str) -> dict[str, float]:
    """The pod's start-up timeline line (packrat.serve.pod.timeline), step -> seconds."""
    line = next((x for x in log.splitlines() if "after the process started: " in x), "")
    parts = line.split("after the process started: ", 1)[-1].split(", ") if line else []
    return {step: float(at) for step, _, at in (p.partition(" +") for p in parts) if at}


async def one_start(
    model: str, runtime: str, cpus: list[int], pythonpath: str | None = None
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="packrat-native-start-"))
    (work / "plan.json").write_text(json.dumps(plan(2, 1, 2).to_dict()))
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", model, "--runtime", runtime,
           "--plan", str(work / "plan.json"), "--host", "127.0.0.1", "--port", str(port),
           "--cpus", ",".join(map(str, cpus)), "--workdir", str(work / "w")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    t0 = time.monotonic()
    with (work / "serve.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        async with aiohttp.ClientSession() as s:
            while await _ping(s, url) != 200:
                if proc.poll() is not None:
                    raise RuntimeError((work / "serve.log").read_text()[-3000:])
                await asyncio.sleep(0.05)
        ready = time.monotonic() - t0
        await asyncio.sleep(1.0)  # the last warm-up's buffers settle
        memory = pod_memory(proc.pid)
        cpu_s = tree_cpu_s(proc.pid)
        return {
            "runtime": runtime, "ready_s": ready, "pss_mb": memory["pss_mb"],
            "rss_mb": memory["rss_mb"], "kinds": memory["kinds"], "cpu_s_at_ready": cpu_s,
            "timeline": start_timeline((work / "serve.log").read_text(errors="replace")),
            "zygote_log": (work / "w" / "zygote" / "zygote.log").read_text(errors="replace"),
        }  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


async def start(args: argparse.Namespace) -> dict[str, Any]:
    """Each repetition starts one pod per configuration, in an order rotated per repetition:
    native and TorchServe from this tree, and with ``--before DIR`` native from the package
    in DIR (another checkout's ``operator``: the before of a before/after)."""
    cpus = allowed_cpus()[:2]
    configs: list[tuple[str, str, str | None]] = [(r, r, None) for r in RUNTIMES]
    if args.before:
        configs.insert(1, ("native-before", "native", args.before))
    out: dict[str, Any] = {"starts": [], "loadavg_before": loadavg(), "before": args.before}
    for rep in range(args.repeats):
        shift = rep % len(configs)
        for label, runtime, path in configs[shift:] + configs[:shift]:
            row = {"repeat": rep, "config": label, "loadavg": loadavg()[0]}
            row.update(await one_start(args.model, runtime, cpus, path))
            out["starts"].append(row)
            brief = {k: v for k, v in row.items() if k not in ("kinds", "zygote_log")}
            print(json.dumps(brief), flush=True)
    out["loadavg_after"] = loadavg()
    for label, _, _ in configs:
        rows = [r for r in out["starts"] if r["config"] == label]
        out[label] = {k: summary([r[k] for r in rows]) for k in ("ready_s", "pss_mb", "rss_mb")}
        steps = {step for r in rows for step in r["timeline"]}
        out[label]["timeline"] = {
            step: summary([r["timeline"][step] for r in rows if step in r["timeline"]])
            for step in sorted(steps, key=lambda s: statistics.median(
                r["timeline"][s] for r in rows if s in r["timeline"]))
        }  # fmt: skip
    for a, b in [("native", "torchserve"), ("native", "native-before")]:
        by_rep = {r["repeat"]: r for r in out["starts"] if r["config"] == b}
        pairs = [(r, by_rep[r["repeat"]]) for r in out["starts"]
                 if r["config"] == a and r["repeat"] in by_rep]  # fmt: skip
        if pairs:
            out[f"{a}_over_{b}".replace("-", "_")] = {
                k: summary([x[k] / y[k] for x, y in pairs]) for k in ("ready_s", "pss_mb")
            }
    return out


# -- latency --------------------------------------------------------------------------------------
async def one_burst(url: str, model: str, body: bytes, batch: int) -> float:
    result = await run_bursts(Target(url, model, body), burst=batch, bursts=1)
    if result.errors:
        raise RuntimeError(f"{url}: {result.errors} failed requests")
    return 1000 * result.batch_latencies_s[0]


async def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Per B, the four pods (each runtime's plan and fat) run at once, idle but for the
    burst being measured: rounds of one burst each, in a rotated order, so that every
    comparison is paired in time under the same background load."""
    cpus = allowed_cpus()[:2]
    body = example_body(args.model)
    batches = [int(b) for b in args.batch.split(",")]
    configs = args.configs.split(",")
    combos = [(r, c) for r in RUNTIMES for c in configs]
    out: dict[str, Any] = {"bursts": [], "loadavg_before": loadavg()}
    for b in batches:
        work = Path(tempfile.mkdtemp(prefix="packrat-native-lat-"))
        servers = {
            (r, c): pod(args.model, plan(2, 1, b // 2) if c == "plan" else plan(1, 2, b), r,
                        work / f"{r}-{c}", cpus)
            for r, c in combos
        }  # fmt: skip
        try:
            for server in servers.values():
                await server.start()
            for server in servers.values():  # one warm-up burst each
                await one_burst(server.url, server.model, body, b)
            rounds = max(args.min_bursts, args.requests // b)
            for i in range(rounds):
                shift = i % len(combos)
                for r, c in combos[shift:] + combos[:shift]:
                    server = servers[(r, c)]
                    ms = await one_burst(server.url, server.model, body, b)
                    row = {
                        "batch": b, "round": i, "runtime": r, "config": c,
                        "plan": server.plan.label, "ms": ms, "loadavg": loadavg()[0],
                    }  # fmt: skip
                    out["bursts"].append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for server in servers.values():
                await server.stop()
            shutil.rmtree(work, ignore_errors=True)
    out["loadavg_after"] = loadavg()
    out["table"] = {str(b): latency_cell(out["bursts"], b, combos) for b in batches}
    return out


def latency_cell(
    bursts: list[dict[str, Any]], b: int, combos: list[tuple[str, str]]
) -> dict[str, Any]:
    """Medians [min, max] per (runtime, config) at B = ``b``, and the paired ratios (same
    round): native over TorchServe on the plan, fat over plan per runtime."""
    ms = {
        (r, c): {x["round"]: x["ms"] for x in bursts
                 if (x["batch"], x["runtime"], x["config"]) == (b, r, c)}
        for r, c in combos
    }  # fmt: skip
    cell: dict[str, Any] = {f"{r}/{c}": summary(list(ms[(r, c)].values())) for r, c in combos}
    rounds = sorted(set.intersection(*(set(v) for v in ms.values())))

    def ratio(a: tuple[str, str], z: tuple[str, str]) -> dict[str, float]:
        return summary([ms[a][i] / ms[z][i] for i in rounds])

    configs = sorted({c for _, c in combos})
    for c in configs:
        cell[f"{c}: native/torchserve"] = ratio(("native", c), ("torchserve", c))
    if "fat" in configs and "plan" in configs:
        for r in RUNTIMES:
            cell[f"{r}: fat/plan"] = ratio((r, "fat"), (r, "plan"))
    return cell


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("cpu", "start", "latency"))
    parser.add_argument("--out", required=True, help="JSON results to PATH.json")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", default="4,8,16,32")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-bursts", type=int, default=8)
    parser.add_argument("--configs", default="plan,fat", help="latency: plan, fat or both")
    parser.add_argument(
        "--before", help="start: also native from this package directory (before/after)"
    )
    args = parser.parse_args()
    run = {"cpu": cpu, "start": start, "latency": latency}[args.what]
    result = asyncio.run(run(args))
    result["command"] = " ".join(["python", *sys.argv])
    Path(args.out + ".json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("blocks", "starts", "bursts")},
                     indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
