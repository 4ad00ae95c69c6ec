"""Issue 26, item 3, before and after, side by side in one run: how long the in-pod switch's
plan post holds reconcile threads when models' pods blackhole it.

``MODELS`` models whose one serving pod (a loopback listener) accepts ``POST /admin/plan`` and
never answers each start a reconcile pass on an 8-thread pool (the operator's reconcile
threads); one more model, whose pod answers at once, is queued behind them. Reported per run:
how long a hostile model's pass holds its thread (``hostile_pass_s``, the median of the
``MODELS``) and when the good model's pass completes (``good_pass_s``, from the start). The
passes are the real ones (``Reconciler`` on the unit tests' in-memory API), through the real
pod client (``PodFanout``, ``PlanPoster``) to real sockets.

"Before" is the tree of ``--before REF`` (default ``main``), extracted with ``git archive``;
"after" is this checkout. Runs are interleaved (before, after, before, ...), ``--repeats``
each; the JSON written to ``--out`` holds every run, and the summary prints medians and
ranges and the load average (the machine is shared and noisy).

    python benchmarks/boundaries/inpod_blackhole.py --repeats 3 \
        --out benchmarks/results/inpod_blackhole.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Is every boundary bounded?"'
    " (#is-every-boundary-bounded)"
)

ROOT = Path(__file__).resolve().parents[2]
MODELS = 8

CHILD = r"""
import dataclasses, datetime, json, socket, statistics, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
try:  # the unit tests' fakes: tests/support since issue 36, tests/unit/conftest.py before
    from kube_support import NS, T0, ready_model, set_spec
except ImportError:
    from conftest import NS, T0, ready_model, set_spec
from packrat.controller.core.fanout import PodFanout
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.serving import manifests as m
from packrat.controller.switch.inpod import PodClient
from packrat.controller.switch.plan_poster import PlanPoster
try:  # the plan post is one value (PlanPost) since issue 36
    from packrat.controller.switch.plan_poster import PlanPost
except ImportError:
    PlanPost = None

stop = threading.Event()

def listen(answer):
    server = socket.create_server(("127.0.0.1", 0))
    def handle(conn):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            if answer:
                body = b'{"plan": "ok"}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                stop.wait(120)
    def serve():
        while True:
            conn, _ = server.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]

def model(port, poster, name):
    kube, rec = ready_model()
    kube.create("pods", NS, {
        "metadata": {"name": str(port), "labels": m.service_selector("tiny", slot="a")},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
    set_spec(kube, batchSize=8)
    def post(*args, **kwargs):
        if PlanPost is None:  # a tree from before the post was one value
            return poster(*args, **{**kwargs, "owner": f"{name}/{kwargs.get('owner', '')}"})
        (request,) = args
        return poster(dataclasses.replace(request, owner=f"{name}/{request.owner}"))
    return Reconciler(kube, config=rec.config, pods=PodClient("http://{ip}:{pod}", post))

models = int(sys.argv[1])
fanout = PodFanout()
poster = PlanPoster(fanout)
hostile = [model(listen(False), poster, f"h{i}") for i in range(models)]
good = model(listen(True), poster, "good")
pool = ThreadPoolExecutor(max_workers=8)
now = T0 + datetime.timedelta(seconds=1)
start = time.monotonic()

def timed(rec):
    t = time.monotonic()
    rec.reconcile(NS, "tiny", now=now)
    return time.monotonic() - t

held = [pool.submit(timed, rec) for rec in hostile]
good_pass = pool.submit(timed, good)
good_pass.result()
good_done = time.monotonic() - start
holds = [f.result() for f in held]
stop.set()
print(json.dumps({"good_pass_s": round(good_done, 3),
                  "hostile_pass_s": round(statistics.median(holds), 3),
                  "hostile_pass_max_s": round(max(holds), 3)}))
"""


def extract(ref: str, into: Path) -> Path:
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "operator/packrat", "tests"],
            stdout=out,
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def run(tree: Path, models: int) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(tree / p) for p in ("operator", "tests/support", "tests/unit")
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(models)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main", help="git ref of the before tree")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", type=int, default=MODELS, help="blackholed models")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before = extract(args.before, Path(tmp))
        for i in range(args.repeats):
            for which, tree in (("before", before), ("after", ROOT)):
                result = run(tree, args.models)
                runs[which].append(result)
                print(f"{i + 1}/{args.repeats} {which}: {result}", flush=True)
    report = {
        "models": args.models,
        "before_ref": args.before,
        "loadavg": os.getloadavg(),
        "runs": runs,
        "summary": {
            which: {key: summary(rs, key) for key in ("good_pass_s", "hostile_pass_s")}
            for which, rs in runs.items()
        },
    }
    print(json.dumps(report["summary"], indent=1), f"loadavg {report['loadavg']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
