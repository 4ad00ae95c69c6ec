"""A serving pod's start and memory: private weights, one shared mapped copy, and workers
forked from the pod's zygote (issue 14).

For each instance count (1-thread instances) and each weight mode, interleaved and
repeated, one ``packrat serve`` pod is started as a child process and timed from the spawn
to its first ``/ping`` 200, with the phases read from its log (dispatcher listening,
TorchServe up with the archive and weight file made, every warm-up done) and each worker's
model load from TorchServe's model log. Once ready: PSS and RSS of every process of the pod
(``/proc/<pid>/smaps_rollup``), split into dispatcher, JVM and workers, and the serving
latency of sequential single requests. Counts above the machine's cores run through a
child harness that deals the instances round-robin over the cores (``child``), since a real
plan may not exceed its cpuset.

    python benchmarks/cold_start/cold_start.py --model resnet50 --instances 1,2,4,8 --repeats 2 \
        --out benchmarks/results/cold-start-resnet50

Against an older tree, side by side (``before`` runs the pod of that tree as it was):

    git worktree add /tmp/before c93121c
    python benchmarks/cold_start/cold_start.py --instances 2 --modes before,private,zygote \
        --baseline /tmp/before --out benchmarks/results/cold-start-resnet50-n2-before-after
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from packrat.serve.torchserve.process import free_ports

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a serving pod take to start, and how much memory does it hold?"'
    " (#how-long-does-a-serving-pod-take-to-start-and-how-much-memory-does-it-hold)"
)

# private: every worker its own interpreter and weights (before issue 14); shared: one mapped
# weight file; zygote: shared, and workers forked from the pod's zygote; before: the pod of
# another source tree (--baseline, e.g. a worktree of the commit before issue 14), as it was.
MODES = ("private", "shared", "zygote", "before")
PHASES = {
    "listening": "listening on",
    "frontend_up": "TorchServe is up and the archive is built",
    "zygote_ready": "the zygote is ready",
    "ready_log": "every instance is loaded and warmed; ready",
}


# -- the child: one pod, instances dealt round-robin over this process's cores -------------
def child(args: argparse.Namespace) -> int:
    zygote = None
    if args.pod_mode == "zygote":  # first, as ``packrat serve`` does
        from packrat.serve.zygote.process import prestart

        zygote = prestart(args.model, Path(args.workdir))
    from packrat.plan.optimizer import Plan
    from packrat.runtime.cpus import allowed_cpus
    from packrat.serve.pod import server

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    n = args.instances
    plan = Plan.from_dict(
        {
            "cpus": n,
            "batch": n * args.batch,
            "instances": [{"threads": 1, "batch": args.batch, "count": n}],
            "expected_latency_ms": 1.0,
            "fat_latency_ms": 1.0,
        }
    )
    cpus = allowed_cpus()

    def deal(plan: Any, _cpus: Any) -> tuple[list[int], list[list[int]]]:
        return cpus, [[cpus[i % len(cpus)]] for i in range(n)]

    server.resolve_cores = deal  # type: ignore[assignment]
    modes: dict[str, Any] = {}
    if args.pod_mode != "before":  # an older tree's options may not have these
        modes = {
            "shared_weights": args.pod_mode != "private",
            "zygote": zygote is not None,
            "zygote_process": zygote,
        }
    opts = server.ServeOptions(
        model=args.model,
        plan=plan,
        host="127.0.0.1",
        port=args.port,
        workdir=Path(args.workdir),
        **modes,
    )
    return asyncio.run(server.serve(opts))


# -- the parent -----------------------------------------------------------------------------
def _parents() -> dict[int, int]:
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        out[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    return out


def _children(pid: int) -> list[int]:
    out, frontier = [pid], [pid]
    parents: dict[int, list[int]] = {}
    for child, ppid in _parents().items():
        parents.setdefault(ppid, []).append(child)
    while frontier:
        nxt = [c for p in frontier for c in parents.get(p, [])]
        out += nxt
        frontier = nxt
    return out


def _rollup(pid: int) -> dict[str, int]:
    kb: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            kb[key] = int(rest.split()[0])
    return kb


def pod_memory(root: int) -> dict[str, Any]:
    """PSS/RSS in MB per process kind of the pod rooted at ``root``."""
    kinds: dict[str, dict[str, float]] = {}
    parent_of = _parents()
    zygotes: set[int] = set()
    for pid in _children(root):  # breadth first: a zygote comes before its workers
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            roll = _rollup(pid)
        except OSError:
            continue
        ppid = parent_of.get(pid)
        kind = (
            "dispatcher"
            if pid == root
            else "zygote"
            if "packrat.serve.zygote.zygote" in cmd and ppid == root
            else "worker"  # forked by the zygote (its cmdline is the zygote's)
            if ppid in zygotes or ("model_service_worker" in cmd and "worker_launcher" not in cmd)
            else "launcher"
            if "worker_launcher" in cmd
            else "jvm"
            if "java" in cmd.split(" ")[0]
            else "other"
        )
        if kind == "zygote":
            zygotes.add(pid)
        k = kinds.setdefault(kind, {"count": 0, "pss_mb": 0.0, "rss_mb": 0.0})
        k["count"] += 1
        k["pss_mb"] += roll.get("Pss", 0) / 1024
        k["rss_mb"] += roll.get("Rss", 0) / 1024
    total = {
        "pss_mb": sum(k["pss_mb"] for k in kinds.values()),
        "rss_mb": sum(k["rss_mb"] for k in kinds.values()),
    }
    return {"kinds": kinds, **total}


def _stamp(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def phases(log: str, t0: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    warmed = []
    for line in log.splitlines():
        for key, needle in PHASES.items():
            if needle in line and key not in out:
                out[key] = round(_stamp(line) - t0, 3)
        if " warmed with a batch of " in line:
            warmed.append(_stamp(line) - t0)
    if warmed:
        out["first_warmed"], out["last_warmed"] = round(min(warmed), 3), round(max(warmed), 3)
    return out


async def _ping(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(f"{url}/ping", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def _latency(url: str, model: str, body: bytes, count: int) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as s:
        for _ in range(count):
            start = time.perf_counter()
            async with s.post(
                f"{url}/predictions/{model}",
                data=body,
                headers={"Content-Type": "application/octet-stream"},
            ) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"prediction failed: {r.status}")
            out.append((time.perf_counter() - start) * 1000)
    return out


def one_pod(args: argparse.Namespace, n: int, mode: str, body: bytes) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="packrat-cold-"))
    port = free_ports(1)[0]
    cmd = [sys.executable, __file__, "child", "--model", args.model, "--instances", str(n)]
    cmd += ["--port", str(port), "--workdir", str(work / "w"), "--batch", str(args.batch)]
    cmd += ["--pod-mode", mode]
    log = work / "serve.log"
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    if mode == "before":  # the child runs this file against the baseline tree's packrat
        env["PYTHONPATH"] = str(Path(args.baseline, "operator").resolve())
    t0 = time.time()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    async def until_ready() -> float:
        async with aiohttp.ClientSession() as s:
            while await _ping(s, url) != 200:
                if proc.poll() is not None:
                    raise RuntimeError(log.read_text(errors="replace")[-3000:])
                await asyncio.sleep(0.05)
        return time.time() - t0

    try:
        ready = asyncio.run(until_ready())
        time.sleep(1.0)  # let the last warm-up's buffers settle before reading memory
        memory = pod_memory(proc.pid)
        lat = asyncio.run(_latency(url, _name(args.model), body, args.requests))
        model_log = (work / "w" / "logs" / "model_log.log").read_text(errors="replace")
        loads = [float(x) for x in re.findall(r"model loaded in ([0-9.]+) s", model_log)]
        return {
            "instances": n,
            "mode": mode,
            "shared": mode != "private",
            "ready_s": round(ready, 3),
            "phases": phases(log.read_text(errors="replace"), t0),
            "model_load_s": loads,
            "memory": memory,
            "latency_ms": {"p50": statistics.median(lat), "all": [round(x, 2) for x in lat]},
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["rm", "-rf", str(work)], check=False)


def _name(model: str) -> str:
    from packrat.serve.torchserve.archive import default_model_name

    return default_model_name(model)


def compile_tree(packages: Path) -> None:
    """Bytecode for a tree's packrat, as the serving image has it (compiled at its build), so
    that a pod's processes import rather than compile it (PYTHONDONTWRITEBYTECODE may be
    set where this runs)."""
    compileall.compile_dir(packages / "packrat", quiet=1)


def parent(args: argparse.Namespace) -> int:
    import packrat
    from packrat.serve.codec import example_body

    compile_tree(Path(packrat.__file__).parent.parent)
    if args.baseline:
        compile_tree(Path(args.baseline, "operator"))

    body = example_body(args.model)
    counts = [int(x) for x in args.instances.split(",")]
    out = Path(args.out + ".json")
    results: list[dict[str, Any]] = []
    modes = args.modes.split(",")
    for rep in range(args.repeats):
        for n in counts:
            for mode in modes if rep % 2 == 0 else modes[::-1]:  # interleaved
                r = one_pod(args, n, mode, body)
                r["repeat"] = rep
                results.append(r)
                print(
                    f"rep {rep} n={n} {mode:7} ready {r['ready_s']:.2f} s"
                    f" pss {r['memory']['pss_mb']:.0f} MB rss {r['memory']['rss_mb']:.0f} MB"
                    f" p50 {r['latency_ms']['p50']:.1f} ms {r['phases']}",
                    flush=True,
                )
                out.write_text(json.dumps({"model": args.model, "results": results}, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    c = sub.add_parser("child")
    c.add_argument("--model", required=True)
    c.add_argument("--instances", type=int, required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--workdir", required=True)
    c.add_argument("--batch", type=int, default=1)
    c.add_argument("--pod-mode", choices=MODES, default="zygote")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--instances", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES), help="of " + ",".join(MODES))
    parser.add_argument("--batch", type=int, default=1, help="per-instance batch (warm-up size)")
    parser.add_argument("--requests", type=int, default=20, help="sequential requests timed")
    parser.add_argument("--out", default="benchmarks/results/cold-start-resnet50")
    parser.add_argument("--baseline", help="source tree of the 'before' mode (a git worktree)")
    args = parser.parse_args()
    if args.command != "child" and "before" in args.modes.split(",") and not args.baseline:
        parser.error("the 'before' mode needs --baseline PATH (e.g. a git worktree)")
    return child(args) if args.command == "child" else parent(args)


if __name__ == "__main__":
    sys.exit(main())
