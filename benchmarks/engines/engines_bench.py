"""Engines side by side on the same cores: makes the "fastest engine on every thin instance"
figures of docs/measurements.md (raw results in benchmarks/results/engines/).

For each model and batch B, on ``--cpus`` cores, every configuration is a set of pinned worker
processes run in lockstep rounds (a round lasts from the first instance's start to the last
one's end, as a served plan's batch does), all configurations interleaved (A B C ... then
B C ... A), medians and [min-max] over ``--reps`` rounds:

- ``<engine> thin``: one 1-thread instance per core, B split evenly (the plan Packrat serves
  on 2 cores for the paper models; the profile picks it per engine when it is faster);
- ``<engine> fat``: one instance with ``--cpus`` threads and the whole batch;
- ``ov-hint-LATENCY`` / ``ov-hint-THROUGHPUT``: OpenVINO choosing its own streams and threads
  on the same cores (THROUGHPUT: its automatic NUM_STREAMS, the batch split over its infer
  requests), FP32 like the engines (``--ov-precision auto``: its default, bf16 on CPUs with
  AVX-512 BF16).

Each engine is converted once (cached in ``--artefacts``) and checked against eager first
(:mod:`packrat.runtime.engines.prepare`); an engine that fails is reported and skipped.

    flock /tmp/packrat-bench.lock .venv/bin/python benchmarks/engines/engines_bench.py \\
        --models resnet50 --batches 8,16 --reps 5 --out benchmarks/results/engines/run1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

from packrat.profiler.engines import prepare_engine  # noqa: E402
from packrat.runtime.pinning import thread_env  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Which engine should each thin instance run: eager, ONNX Runtime or'
    " OpenVINO, against fat and OpenVINO's own hints?\""
    ', part "the table of engines, thin and fat, and OpenVINO\'s hints"'
    " (#which-engine-should-a-thin-instance-run-against-fat-and-openvinos-own-hints)"
)

HERE = Path(__file__).resolve().parent


class Proc:
    """One worker process speaking the profiler worker's JSON-lines protocol."""

    def __init__(self, cmd: list[str], threads: int) -> None:
        env = dict(os.environ)
        env.update(thread_env(threads))
        env["PYTHONPATH"] = str(ROOT / "operator")
        self.p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env,
        )  # fmt: skip
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        self.ready = json.loads(line) if line.startswith("{") else {"event": "failed"}
        if self.ready.get("event") != "ready":
            raise RuntimeError(f"worker did not start: {cmd[:8]} {self.ready}")

    def send(self, batch: int) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps({"cmd": "run", "batch": batch}) + "\n")
        self.p.stdin.flush()

    def recv(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        return dict(json.loads(self.p.stdout.readline()))

    def close(self) -> None:
        try:
            assert self.p.stdin is not None
            self.p.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
            self.p.stdin.flush()
            self.p.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def engine_worker(model: str, engine: str, artefact: str | None, cpus: list[int]) -> Proc:
    cmd = [
        sys.executable, "-m", "packrat.profiler.worker", "--model", model,
        "--cpus", ",".join(map(str, cpus)), "--threads", str(len(cpus)), "--engine", engine,
        *(["--artefact", artefact] if artefact else []),
    ]  # fmt: skip
    return Proc(cmd, len(cpus))


def configs(model: str, records: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """name -> (workers, per-worker share of the batch: None = split evenly)."""
    cores = list(range(args.cpus))
    out: dict[str, Any] = {}
    for engine, record in records.items():
        if record["status"] != "ok":
            continue
        path = record.get("artefact", {}).get("path")
        out[f"{engine} thin"] = [engine_worker(model, engine, path, [c]) for c in cores]
        out[f"{engine} fat"] = [engine_worker(model, engine, path, cores)]
    ov = records.get("openvino")
    if ov is not None and ov["status"] == "ok":
        from packrat.runtime.engines import input_specs

        specs = json.dumps([s.to_dict() for s in input_specs(model)])
        for hint in args.ov_hints:
            cmd = [
                sys.executable, str(HERE / "ov_hint_worker.py"), "--artefact",
                ov["artefact"]["path"], "--hint", hint, "--cpus", ",".join(map(str, cores)),
                "--inputs", specs, "--precision", args.ov_precision,
            ]  # fmt: skip
            proc = Proc(cmd, args.cpus)
            out[f"ov-hint-{hint}"] = [proc]
            print(f"  ov-hint-{hint}: {proc.ready}", flush=True)
    return out


def one_round(workers: list[Proc], batch: int) -> float:
    shares = [batch // len(workers) + (i < batch % len(workers)) for i in range(len(workers))]
    live = [(w, s) for w, s in zip(workers, shares, strict=True) if s > 0]
    for w, s in live:
        w.send(s)
    replies = [w.recv() for w, _ in live]
    return (max(r["end"] for r in replies) - min(r["start"] for r in replies)) * 1000.0


def bench_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    records = {"eager": {"status": "ok"}}
    for engine in args.engines:
        if engine != "eager":
            began = time.monotonic()
            records[engine] = prepare_engine(model, engine, args.artefacts, threads=args.cpus)
            print(f"  {engine}: {records[engine]['status']} {records[engine].get('reason', '')}"
                  f" ({time.monotonic() - began:.0f} s)", flush=True)  # fmt: skip
    procs = configs(model, records, args)
    names = list(procs)
    result: dict[str, Any] = {"engines": records, "batches": {}}
    try:
        for batch in args.batches:
            for name in names:  # warm-up round at this batch
                one_round(procs[name], batch)
            times: dict[str, list[float]] = {n: [] for n in names}
            for rep in range(args.reps):
                shift = rep % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name].append(one_round(procs[name], batch))
            rows = {
                n: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t), "ms": t}
                for n, t in times.items()
            }
            result["batches"][str(batch)] = rows
            for n in names:
                r = rows[n]
                print(f"  {model} B={batch:3d} {n:22s} {r['median_ms']:9.1f} ms "
                      f"[{r['min_ms']:.1f}-{r['max_ms']:.1f}]", flush=True)  # fmt: skip
    finally:
        for workers in procs.values():
            for w in workers:
                w.close()
    return result


def summary(model: str, result: dict[str, Any]) -> list[str]:
    """Ratios per batch: the fastest thin plan (2x1t on 2 cores) against the fastest fat
    engine, OpenVINO's own best hint and today's eager plan (> 1: the thin plan is faster).
    A profile picks thin or fat per engine; where fat wins, the served plan is that fat."""
    lines = []
    for batch, rows in result["batches"].items():
        med = {n: r["median_ms"] for n, r in rows.items()}
        thin = min((v, n) for n, v in med.items() if n.endswith(" thin"))
        fat = min((v, n) for n, v in med.items() if n.endswith(" fat"))
        hints = [(v, n) for n, v in med.items() if n.startswith("ov-hint")]
        line = (f"{model} B={batch}: thin {thin[1]} {thin[0]:.1f} ms; fastest fat {fat[1]} "
                f"{fat[0]:.1f} ms (x{fat[0] / thin[0]:.2f})")  # fmt: skip
        if hints:
            hint = min(hints)
            line += f"; OpenVINO's best hint {hint[1]} {hint[0]:.1f} ms (x{hint[0] / thin[0]:.2f})"
        if "eager thin" in med:
            line += f"; eager plan {med['eager thin']:.1f} ms (x{med['eager thin'] / thin[0]:.2f})"
        lines.append(line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--models", default="resnet50,inception_v3,bert-base,gpt2")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--batches", default="4,8,16")
    parser.add_argument("--engines", default="eager,onnxruntime,openvino")
    parser.add_argument("--ov-hints", default="LATENCY,THROUGHPUT")
    parser.add_argument("--ov-precision", default="f32", help="f32, bf16 or auto (its default)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--artefacts", type=Path, default=Path("/tmp/packrat-artefacts"))
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.engines = [e for e in args.engines.split(",") if e]
    args.ov_hints = [h for h in args.ov_hints.split(",") if h]
    if len(os.sched_getaffinity(0)) < args.cpus:
        parser.error(f"--cpus {args.cpus}: this process may use {len(os.sched_getaffinity(0))}")
    results: dict[str, Any] = {"cpus": args.cpus, "reps": args.reps, "models": {}}
    lines: list[str] = []
    for model in args.models.split(","):
        print(f"{model}:", flush=True)
        results["models"][model] = bench_model(model, args)
        lines += summary(model, results["models"][model])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(lines))
    results["summary"] = lines
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
