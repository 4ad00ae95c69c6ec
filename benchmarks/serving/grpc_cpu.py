"""The gRPC path's dispatcher CPU per request against REST's (docs/measurements.md, "What does a
request cost the dispatcher over gRPC against REST?").

One dispatcher process (pinned to one core) serves the tiny model's inputs (16 float32) on its
REST port and its gRPC port, in front of an in-process backend that answers each sample at once
with a JSON row, as the model service does: what is measured is the dispatcher's own work per
request (protocol parsing, admission, queue, splitting, stacking, encoding the answer). A
client process on the other core sends, in interleaved blocks (A B C A B C ...), the same
requests of ``--samples`` samples each as

- ``rest-json``: ``POST /v2/models/tiny/infer`` with JSON tensors,
- ``rest-binary``: the same with the binary tensor extension,
- ``grpc``: ``ModelInfer`` with ``raw_input_contents``,
- ``predictions``: ``POST /predictions/tiny`` with the raw body (one sample; the reference),

at ``--concurrency`` requests in flight, and reads the dispatcher's CPU time (every thread's,
from ``/proc/<pid>/task/*/schedstat``, nanoseconds) before and after each block. Reports
microseconds of dispatcher CPU per request and per sample for each, median and range over
the blocks, and gRPC's ratio to each REST form. Raw results: ``--out`` (JSON).

Usage: ``flock /tmp/packrat-bench.lock .venv/bin/python benchmarks/serving/grpc_cpu.py``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import time
from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from packrat.runtime import modelid
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.torchserve.process import free_ports

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What does a request cost the dispatcher over gRPC against REST?"'
    " (#what-does-a-request-cost-the-dispatcher-over-grpc-against-rest)"
)

CONFIGS = ("rest-json", "rest-binary", "grpc", "predictions")


class Rows:
    kind = "bench"

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        return web.Response(body=b"[%.6f]" % sum(array("f", body)), content_type="application/json")


def _serve(http_port: int, grpc_port: int, cpu: int, batch: int) -> None:
    os.sched_setaffinity(0, {cpu})
    from packrat.serve.config import InstanceSpec
    from packrat.serve.dispatcher.app import Dispatcher
    from packrat.serve.dispatcher.oip.grpc_server import GrpcFront

    async def main() -> None:
        inst = InstanceSpec(index=0, name="tiny_i0", threads=1, batch=batch, cpus=(cpu,))
        d = Dispatcher(model="tiny", instances=[inst], backend=Rows())
        d.inputs = modelid.zoo_input_spec("tiny")
        d.set_up(0, True)
        runner = d.runner()
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", http_port).start()
        await GrpcFront(d).start("127.0.0.1", grpc_port)
        await asyncio.Event().wait()

    asyncio.run(main())


def cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        # a thread may end between the listing and the read
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def bodies(samples: int) -> dict[str, Any]:
    from packrat.serve.dispatcher.oip.messages import message

    rows = [[float(i * 16 + j) / 7 for j in range(16)] for i in range(samples)]
    raw = array("f", [v for row in rows for v in row]).tobytes()
    doc = {
        "inputs": [{"name": "input__0", "datatype": "FP32", "shape": [samples, 16], "data": rows}]
    }
    meta = {"name": "input__0", "datatype": "FP32", "shape": [samples, 16]}
    head = json.dumps({"inputs": [{**meta, "parameters": {"binary_data_size": len(raw)}}]}).encode()
    req = message("ModelInferRequest")(model_name="tiny")
    req.inputs.add(name="input__0", datatype="FP32", shape=[samples, 16])
    req.raw_input_contents.append(raw)
    return {
        "rest-json": json.dumps(doc).encode(),
        "rest-binary": (head + raw, len(head)),
        "grpc": req.SerializeToString(),
        "predictions": raw[:64],
    }


async def block(config: str, payload: Any, urls: tuple[str, str], n: int, conc: int) -> None:
    import grpc

    from packrat.serve.dispatcher.oip.messages import SERVICE

    url, target = urls
    left = n

    async def rest_worker(session: aiohttp.ClientSession, path: str, data: bytes,
                          headers: dict[str, str]) -> None:  # fmt: skip
        nonlocal left
        while left > 0:
            left -= 1
            async with session.post(url + path, data=data, headers=headers) as r:
                await r.read()
                assert r.status == 200, (config, r.status)

    if config == "grpc":
        async with grpc.aio.insecure_channel(target) as channel:
            rpc = channel.unary_unary(f"/{SERVICE}/ModelInfer")

            async def grpc_worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await rpc(payload, timeout=30)

            await asyncio.gather(*(grpc_worker() for _ in range(conc)))
        return
    headers = {"Content-Type": "application/json"}
    path, data = "/v2/models/tiny/infer", payload
    if config == "rest-binary":
        data, head = payload
        headers = {"Inference-Header-Content-Length": str(head)}
    elif config == "predictions":
        path, headers = "/predictions/tiny", {"Content-Type": "application/octet-stream"}
    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(rest_worker(session, path, data, headers) for _ in range(conc)))


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=FIGURE)
    parser.add_argument("--samples", type=int, default=1, help="samples per v2/gRPC request")
    parser.add_argument("--requests", type=int, default=2000, help="requests per block")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="raw results (JSON)")
    args = parser.parse_args()
    cpus = allowed_cpus()
    server_cpu, client_cpu = cpus[0], cpus[-1]
    http_port, grpc_port = free_ports(2)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_serve, args=(http_port, grpc_port, server_cpu, 64), daemon=True)
    proc.start()
    os.sched_setaffinity(0, {client_cpu})
    urls = (f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")
    payloads = bodies(args.samples)
    samples = {c: (1 if c == "predictions" else args.samples) for c in CONFIGS}
    per_request: dict[str, list[float]] = {c: [] for c in CONFIGS}
    try:
        deadline = time.monotonic() + 60
        while True:  # the ports are up once a small block goes through
            try:
                for c in CONFIGS:
                    asyncio.run(block(c, payloads[c], urls, 20, 2))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for _ in range(args.rounds):
            for c in CONFIGS:
                before = cpu_ns(proc.pid or 0)
                asyncio.run(block(c, payloads[c], urls, args.requests, args.concurrency))
                per_request[c].append((cpu_ns(proc.pid or 0) - before) / args.requests / 1000)
    finally:
        proc.terminate()
        proc.join(10)
    result: dict[str, Any] = {
        "samples_per_request": args.samples, "requests_per_block": args.requests,
        "rounds": args.rounds, "concurrency": args.concurrency,
        "dispatcher_cpu": server_cpu, "client_cpu": client_cpu,
        "cpu_us_per_request": {c: summary(v) for c, v in per_request.items()},
        "cpu_us_per_sample": {
            c: summary([x / samples[c] for x in v]) for c, v in per_request.items()
        },
        "grpc_over": {
            c: summary([g / r for g, r in zip(per_request["grpc"], per_request[c], strict=True)])
            for c in ("rest-json", "rest-binary", "predictions")
        },
        "raw_us_per_request": per_request,
        "loadavg": os.getloadavg(),
    }  # fmt: skip
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
