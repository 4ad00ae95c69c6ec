"""Issue 38's new surfaces before and after, side by side: a good client under a hostile one.

``grpc``: a hostile client (``[::1]``) opens ``--hostile`` ModelInfer calls on the gRPC port
and never sends their messages; a good client (``127.0.0.1``) then sends 20 one-sample infers
(in-process dispatcher, gated backend): how many succeed and their p50.
``pool``: a pool process with two tiny models; ``--hostile`` clients post v2 JSON bodies of
``--rows`` samples (10 MB at 50,000) to model b in a loop while a good client infers one
sample on model a every 50 ms for 15 s: the good client's p50/p90/max and the hostile answers.

"Before" is the tree of ``--before REF`` (default ``main``) extracted with ``git archive``,
"after" this checkout; runs interleave (before, after, ...) ``--repeats`` times. Makes the
figures of docs/measurements.md "Can one hostile client take the gRPC port or the pool?".

    python benchmarks/boundaries/new_surfaces.py grpc --out benchmarks/results/hostile/grpc.json
    python benchmarks/boundaries/new_surfaces.py pool --out benchmarks/results/hostile/pool.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Can one hostile client take the gRPC port or the pool from the others?"'
    " (#can-one-hostile-client-take-the-grpc-port-or-the-pool-from-the-others)"
)

ROOT = Path(__file__).resolve().parents[2]


async def grpc_run(n_hostile: int) -> dict[str, Any]:
    import grpc
    from dispatcher_support import GatedRows

    from packrat.runtime import modelid
    from packrat.serve.config import InstanceSpec
    from packrat.serve.dispatcher.app import Dispatcher
    from packrat.serve.dispatcher.oip.grpc_server import GrpcFront
    from packrat.serve.dispatcher.oip.messages import SERVICE, message

    inst = [InstanceSpec(index=0, name="tiny_i0", threads=1, batch=4, cpus=(0,))]
    d = Dispatcher(model="tiny", instances=inst, backend=GatedRows())
    d.inputs = modelid.zoo_input_spec("tiny")
    d.set_up(0, True)
    front = GrpcFront(d)
    port = await front.start("[::]", 0)

    async def never() -> Any:
        await asyncio.Event().wait()
        yield b""

    hostile = grpc.aio.insecure_channel(f"[::1]:{port}")
    rpc = hostile.stream_unary(f"/{SERVICE}/ModelInfer")
    calls = [rpc(never()) for _ in range(n_hostile)]
    await asyncio.sleep(1.0)
    req = message("ModelInferRequest")(model_name="tiny")
    req.inputs.add(name="input__0", datatype="FP32", shape=[1, 16])
    req.raw_input_contents.append(b"\0" * 64)
    ok, lat, codes = 0, [], {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        infer = ch.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=bytes)
        for _ in range(20):
            t0 = time.perf_counter()
            try:
                await infer(req.SerializeToString(), timeout=5)
                ok += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
            lat.append(time.perf_counter() - t0)
    for c in calls:
        c.cancel()
    await hostile.close()
    await front.stop(None)
    d.parser.close()
    lat.sort()
    return {"good_ok": ok, "good_of": 20, "good_p50_ms": round(lat[10] * 1000, 2), "codes": codes}


async def ready(s: Any, url: str) -> bool:
    import aiohttp

    try:
        async with s.get(f"{url}/v2/health/ready") as r:
            return bool(r.status == 200)
    except aiohttp.ClientError:
        return False


async def pool_run(n_hostile: int, rows: int) -> dict[str, Any]:
    import aiohttp

    from packrat.serve.torchserve.process import free_ports

    tmp = Path(tempfile.mkdtemp())
    models = [{"name": n, "spec": "tiny", "seed": i} for i, n in enumerate("ab")]
    cfg = {"directory": str(tmp / "files"), "budget_bytes": 1 << 30, "models": models}
    (tmp / "pool.json").write_text(json.dumps(cfg))
    port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "packrat.serve.pool", str(tmp / "pool.json"), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    good = {
        "inputs": [{"name": "input__0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]
    }
    bad = {"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [rows, 16],
                       "data": [0.123456789] * (rows * 16)}]}  # fmt: skip
    good_b, bad_b = json.dumps(good).encode(), json.dumps(bad).encode()
    answers: dict[str, int] = {}
    lat: list[float] = []
    try:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 120
            while not await ready(s, url) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            for m in "ab":
                async with s.post(f"{url}/v2/models/{m}/infer", data=good_b) as r:
                    assert r.status == 200, await r.text()
            stop = asyncio.Event()

            async def hostile() -> None:
                while not stop.is_set():
                    try:
                        async with s.post(f"{url}/v2/models/b/infer", data=bad_b) as r:
                            await r.read()
                            key = str(r.status)
                    except aiohttp.ClientError as exc:
                        key = type(exc).__name__
                    answers[key] = answers.get(key, 0) + 1

            tasks = [asyncio.create_task(hostile()) for _ in range(n_hostile)]
            await asyncio.sleep(1.0)
            end = time.monotonic() + 15
            while time.monotonic() < end:
                t0 = time.perf_counter()
                async with s.post(f"{url}/v2/models/a/infer", data=good_b) as r:
                    await r.read()
                    assert r.status == 200
                lat.append(time.perf_counter() - t0)
                await asyncio.sleep(0.05)
            stop.set()
            for t in tasks:
                t.cancel()
    finally:
        proc.terminate()
        proc.wait()
    lat.sort()
    return {
        "body_bytes": len(bad_b),
        "good_n": len(lat),
        "good_p50_ms": round(lat[len(lat) // 2] * 1000, 1),
        "good_p90_ms": round(lat[int(len(lat) * 0.9)] * 1000, 1),
        "good_max_ms": round(lat[-1] * 1000, 1),
        "hostile_answers": answers,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, epilog=FIGURE, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("what", choices=["grpc", "pool"])
    p.add_argument("--hostile", type=int, default=None, help="grpc: 100 calls; pool: 2 clients")
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--before", default="main")
    p.add_argument("--out", type=Path)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    hostile = a.hostile if a.hostile is not None else (100 if a.what == "grpc" else 2)
    if a.one:
        run = grpc_run(hostile) if a.what == "grpc" else pool_run(hostile, a.rows)
        print(json.dumps(asyncio.run(run)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", a.before, "operator"], cwd=ROOT,
                                 check=True, capture_output=True).stdout  # fmt: skip
        (Path(tmp) / "t.tar").write_bytes(archive)
        with tarfile.open(Path(tmp) / "t.tar") as tar:
            tar.extractall(tmp, filter="data")
        trees = {"before": Path(tmp) / "operator", "after": ROOT / "operator"}
        runs = []
        for i in range(a.repeats):
            for label, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": f"{tree}:{ROOT / 'tests/support'}"}
                argv = [sys.executable, __file__, a.what, "--one", "--hostile", str(hostile),
                        "--rows", str(a.rows)]  # fmt: skip
                out = subprocess.run(
                    argv, env=env, capture_output=True, text=True, timeout=300, check=True
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                runs.append({"tree": label, "repeat": i, **result})
                print(json.dumps(runs[-1]), flush=True)
    load = os.getloadavg()
    doc = {"what": a.what, "hostile": hostile, "rows": a.rows, "load": load, "runs": runs}
    if a.out:  # the raw runs, as docs/measurements.md cites them
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
