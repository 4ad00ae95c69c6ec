"""Issue 26 before and after, side by side in one run: the router's memory under large queries
and a huge stage answer, and how long the operator's storage check is held by a store that
never answers.

"Before" is the tree of ``--before REF`` (default ``main``), extracted with ``git archive``
into a temporary directory and run with ``PYTHONPATH`` pointing at it; "after" is this
checkout. Configurations are interleaved (before, after, before, after, ...), each repeated
``--repeats`` times; the JSON written to ``--out`` holds every run, and the summary prints
medians and ranges. The machine is shared: read the load average printed with the results.

    python benchmarks/boundaries/boundaries.py --repeats 3 --out benchmarks/results/boundaries.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Is every boundary bounded?"'
    " (#is-every-boundary-bounded)"
)

ROOT = Path(__file__).resolve().parents[2]
QUERY_BYTES = 6 * 1024 * 1024 - 1024
CONCURRENT = 24

STAGE = r"""
import asyncio, sys
from aiohttp import web
HUGE = int(sys.argv[2])
async def echo(request):
    body = await request.read()
    await asyncio.sleep(2.0)
    return web.Response(body=body[:1024], content_type="application/octet-stream")
async def huge(request):
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    await resp.prepare(request)
    chunk = b"\0" * (1 << 20)
    for _ in range(HUGE):
        await resp.write(chunk)
    return resp
app = web.Application(client_max_size=64 << 20)
app.router.add_post("/echo", echo)
app.router.add_post("/huge", huge)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def peak_rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in text.splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def extract(ref: str, into: Path) -> Path:
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "operator/packrat"], stdout=out, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "operator"


def post(url: str, body: bytes, timeout: float = 120.0) -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/x"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return -1


def router_run(tree: Path, stage_port: int, path: str, queries: int, size: int) -> dict[str, Any]:
    """One router process: ``queries`` concurrent bodies of ``size`` bytes to stage ``path``;
    its peak RSS and the answers' status codes."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "router.yaml"
        config.write_text(
            "pipeline: p\n"
            f"stages: {{s: 'http://127.0.0.1:{stage_port}/{path}'}}\n"
            "deadlineMs: 60000\n"
        )
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "packrat",
                "route",
                "--config",
                str(config),
                "--port",
                str(port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(port)
            body = b"x" * size
            codes: list[int] = []
            threads = [
                threading.Thread(
                    target=lambda: codes.append(
                        post(f"http://127.0.0.1:{port}/predictions/p", body)
                    )
                )
                for _ in range(queries)
            ]
            start = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - start
            rss = peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    return {"peak_rss_mib": round(rss, 1), "codes": sorted(codes), "wall_s": round(wall, 2)}


HOLD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from packrat.runtime import fetch
kwargs = {}
if sys.argv[3] == "after":  # loopback allowed: the blackhole listens there
    from packrat.runtime.egress import EgressPolicy
    kwargs["limits"] = fetch.FetchLimits(
        policy=EgressPolicy.parse(["127.0.0.0/8"]), timeout_s=20.0, identity="none"
    )
start = time.monotonic()
try:
    fetch.object_version("s3://bucket/m.pt", {"AWS_ENDPOINT_URL": sys.argv[2]}, **kwargs)
    print("answered", round(time.monotonic() - start, 2))
except fetch.FetchError as exc:
    print(exc.reason, round(time.monotonic() - start, 2))
"""


def blackhole_run(tree: Path, which: str) -> dict[str, Any]:
    """How long one storage check is held by an endpoint that accepts and never answers."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)  # connections wait in the backlog, never accepted, never answered
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    try:
        out = subprocess.run(
            [sys.executable, "-c", HOLD, str(tree), url, which],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
            env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"},
        ).stdout.split()
    finally:
        hole.close()
    return {"reason": out[0] if out else "?", "held_s": float(out[1]) if len(out) > 1 else None}


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [r[key] for r in runs if r.get(key) is not None]
    return {
        "median": round(statistics.median(values), 2),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="git ref of the 'before' tree")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--huge-mib", type=int, default=1024, help="the hostile stage answer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="boundaries-") as tmp:
        trees = {"before": extract(args.before, Path(tmp)), "after": ROOT / "operator"}
        stage_port = free_port()
        stage = subprocess.Popen(
            [sys.executable, "-c", STAGE, str(stage_port), str(args.huge_mib)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        results: dict[str, Any] = {"load_before": os.getloadavg()}
        try:
            wait_port(stage_port)
            # the old storage check takes minutes against a blackhole: run it beside the rest
            holds: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            old_hold = threading.Thread(
                target=lambda: holds["before"].append(blackhole_run(trees["before"], "before"))
            )
            old_hold.start()
            router: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for _ in range(args.repeats):
                for which in ("before", "after"):  # interleaved
                    run = router_run(trees[which], stage_port, "echo", CONCURRENT, QUERY_BYTES)
                    router[which].append(run)
                    print(which, "24 x 6 MiB", run, flush=True)
            holds["after"] = [blackhole_run(trees["after"], "after") for _ in range(args.repeats)]
            huge = router_run(trees["after"], stage_port, "huge", 1, 1024)
            print("after, one 1 GiB stage answer", huge, flush=True)
            old_hold.join()
        finally:
            stage.terminate()
            stage.wait(30)
        results.update(
            router_24x6MiB={
                w: {"runs": r, "peak_rss_mib": summary(r, "peak_rss_mib")}
                for w, r in router.items()
            },
            router_huge_answer_after=huge,
            storage_blackhole={
                w: {"runs": r, "held_s": summary(r, "held_s")} for w, r in holds.items()
            },
            load_after=os.getloadavg(),
        )
    print(json.dumps({k: v for k, v in results.items() if "runs" not in str(v)[:10]}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
