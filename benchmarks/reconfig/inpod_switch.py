"""A plan switch under closed-loop load: in the pod, against starting a new pod (issue 14).

One ``packrat serve`` pod serves ResNet-50 with the thin plan; ``--clients`` closed-loop
clients keep sending single requests. Every ``--settle`` seconds the plan flips between the
thin and the fat plan of the same cores, ``--switches`` times, in one of two ways:

- ``inpod``: ``POST /admin/plan`` to the running pod (new instances beside the old ones in
  the same TorchServe, warmed, dispatcher swapped, old ones drained and unregistered);
- ``pod``: what the active-passive Deployment switch does on one node: a second pod is
  started with the new plan beside the serving one (the passive slot), the clients move to
  it once it is ready (the Service's selector), and the old pod is stopped after a drain.

Per switch: seconds from the plan change to the new plan serving, failed requests, and the
p50/p99 latency of requests sent during the switch against those sent between switches.
Modes alternate (inpod, pod, pod, inpod, ...) when both are asked for.

    python benchmarks/reconfig/inpod_switch.py --model resnet50 --modes inpod,pod --switches 4 \
        --out benchmarks/results/inpod-switch-resnet50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from packrat.runtime.cpus import allowed_cpus
from packrat.serve.codec import example_body
from packrat.serve.torchserve.process import free_ports

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a plan switch take?"'
    " (#how-long-does-a-plan-switch-take)"
)

TOKEN = "bench-" + os.urandom(12).hex()


def _plan(count: int, threads: int, batch: int) -> dict[str, Any]:
    return {
        "cpus": 2,
        "batch": count * batch,
        "instances": [{"threads": threads, "batch": batch, "count": count}],
        "expected_latency_ms": 1.0,
        "fat_latency_ms": 1.0,
    }


PLANS = [_plan(2, 1, 1), _plan(1, 2, 2)]  # thin 2x1t/b1 and fat 1x2t/b2, both on 2 cpus


@dataclass
class Pod:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_pod(model: str, plan: dict[str, Any], work: Path, cpus: list[int]) -> Pod:
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan))
    port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", model, "--plan"]
    cmd += [str(work / "plan.json"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workdir", str(work / "w"), "--cpus", ",".join(map(str, cpus))]
    cmd += ["--admin-token-env", "PACKRAT_BENCH_TOKEN", "--drain-seconds", "30"]
    env = {**os.environ, "PACKRAT_BENCH_TOKEN": TOKEN}
    log = work / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Pod(f"http://127.0.0.1:{port}", proc, log)


async def wait_ready(s: aiohttp.ClientSession, pod: Pod, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pod.proc.poll() is not None:
            raise RuntimeError(pod.log.read_text(errors="replace")[-3000:])
        try:
            async with s.get(f"{pod.url}/ping", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("pod not ready in time")


def stop_pod(pod: Pod) -> None:
    if pod.proc.poll() is None:
        pod.proc.send_signal(signal.SIGTERM)
        try:
            pod.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pod.proc.kill()
            pod.proc.wait()


@dataclass
class Load:
    """Closed-loop clients; ``target`` is where they send (moved atomically)."""

    target: str
    model: str
    body: bytes
    records: list[tuple[float, float, int]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, s: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                async with s.post(
                    f"{self.target}/predictions/{self.model}",
                    data=self.body,
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=aiohttp.ClientTimeout(total=120),
                ) as r:
                    await r.read()
                    status = r.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            self.records.append((start, time.monotonic(), status))


def _stats(records: list[tuple[float, float, int]]) -> dict[str, Any]:
    lat = sorted((e - s) * 1000 for s, e, code in records if code == 200)
    failed = sum(1 for *_, code in records if code != 200)
    if not lat:
        return {"requests": len(records), "failed": failed}
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return {
        "requests": len(records),
        "failed": failed,
        "p50_ms": round(statistics.median(lat), 1),
        "p99_ms": round(p99, 1),
    }


async def run_mode(args: argparse.Namespace, mode: str, root: Path) -> dict[str, Any]:
    cpus = allowed_cpus()[:2]
    body = example_body(args.model)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        pod = start_pod(args.model, PLANS[0], root / "p0", cpus)
        pods = [pod]
        try:
            await wait_ready(s, pod)
            load = Load(pod.url, args.model.replace("-", "_"), body)
            from packrat.serve.torchserve.archive import default_model_name

            load.model = default_model_name(args.model)
            clients = [asyncio.ensure_future(load.client(s)) for _ in range(args.clients)]
            switches = []
            await asyncio.sleep(args.settle)
            for k in range(args.switches):
                plan = PLANS[(k + 1) % 2]
                t0 = time.monotonic()
                if mode == "inpod":
                    async with s.post(
                        f"{pod.url}/admin/plan",
                        data=json.dumps(plan).encode(),
                        headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=aiohttp.ClientTimeout(total=600),
                    ) as r:
                        answer = json.loads(await r.text())
                        if r.status != 200:
                            raise RuntimeError(f"switch refused: {r.status} {answer}")
                    t1 = time.monotonic()
                else:
                    new = start_pod(args.model, plan, root / f"p{k + 1}", cpus)
                    pods.append(new)
                    await wait_ready(s, new)
                    load.target = new.url  # the Service's selector moves
                    t1 = time.monotonic()
                    old, pod = pod, new
                    await asyncio.to_thread(stop_pod, old)  # drains what it still has
                    answer = {}
                t_end = time.monotonic()
                switches.append(
                    {
                        "plan": plan["instances"],
                        "t0": t0,
                        "t1": t1,
                        "t_end": t_end,
                        "switch_s": round(t1 - t0, 3),
                        "answer": answer,
                    }
                )
                print(f"{mode} switch {k}: {t1 - t0:.2f} s", flush=True)
                await asyncio.sleep(args.settle)
            load.stop.set()
            await asyncio.gather(*clients)
        finally:
            for p in pods:
                await asyncio.to_thread(stop_pod, p)
    during = [r for r in load.records if any(w["t0"] <= r[0] <= w["t_end"] for w in switches)]
    steady = [r for r in load.records if r not in during]
    return {
        "mode": mode,
        "switches": [
            {k: v for k, v in w.items() if k not in ("t0", "t1", "t_end")} for w in switches
        ],
        "switch_s_median": statistics.median(w["switch_s"] for w in switches),
        "during": _stats(during),
        "steady": _stats(steady),
        "all": _stats(load.records),
    }


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--modes", default="inpod,pod")
    parser.add_argument("--switches", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds between switches")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/inpod-switch-resnet50")
    args = parser.parse_args()
    modes = args.modes.split(",")
    results = []
    out = Path(args.out + ".json")
    for rep in range(args.repeats):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            with tempfile.TemporaryDirectory(prefix="packrat-switch-") as tmp:
                r = asyncio.run(run_mode(args, mode, Path(tmp)))
            r["repeat"] = rep
            results.append(r)
            print(json.dumps({k: r[k] for k in ("mode", "switch_s_median", "during", "steady")}))
            out.write_text(
                json.dumps(
                    {"model": args.model, "clients": args.clients, "results": results}, indent=1
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
