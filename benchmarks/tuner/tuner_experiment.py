"""The tuner on the emulator with real ``packrat serve`` pods: an arrival-rate step.

The real operator runs against the kmock emulator with the integration harness's agent (real
``packrat serve`` processes, Service traffic through its kube-proxy stand-in, round robin).
One PackratModel with ``spec.slo`` (gamma sample trace at the base rate) and
``spec.autoscaling`` envelope is profiled by a real profiling Job, provisioned by the planner
and served; then open-loop Poisson arrivals (``run_trace``, what ``packrat loadgen --trace``
sends) go through the Service: the base rate, a step to ``--factor`` times it, and back.
Recorded over time: every request (send time, latency, status), and the model's status
(the tuner's replica count, ready replicas, its decisions). Outputs under
``benchmarks/results/``: ``<stem>.json`` (everything), ``<stem>.txt`` (per phase: requests,
failed, SLO misses, P99, replicas) and ``<stem>.png`` (latency and misses per 5 s, failed
requests, replicas wanted and ready).

A benchmark, not a test: one run on a shared machine. With the tiny model, latency is mostly
HTTP and Python overhead, which the planner's profile does not contain; the point is the
mechanism (scale-up time after the step, no failed requests, scale-down after the delay).

Run: ``.venv/bin/python benchmarks/tuner/tuner_experiment.py`` (about 6 minutes with the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "operator"))

from harness import OperatorCluster, wait_for  # noqa: E402

from packrat.bench.loadgen import Target  # noqa: E402
from packrat.bench.replay import run_trace  # noqa: E402
from packrat.plan.des import nearest_rank  # noqa: E402
from packrat.plan.traces import step_trace, trace_to_csv  # noqa: E402
from packrat.serve.codec import example_body  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How does the tuner follow a load step?"'
    " (#how-does-the-tuner-follow-a-load-step)"
)

RESULTS = ROOT / "benchmarks" / "results"
NAME = "tuned"
# a shared machine: the profiler's isolation check would refuse every profile (as in the tests)
os.environ.setdefault("PACKRAT_ALLOW_CONTENDED", "1")


def spec_for(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": {"zoo": args.model},
        "cpus": 2,
        "maxBatchDelayMs": 5,
        "profiling": {
            "maxBatch": 8,
            "threads": [1, 2],
            "precision": 0.2,
            "timeBudgetSeconds": 40,
            "backoffLimit": 1,
        },
        "switch": {"readyTimeoutSeconds": 180, "drainSeconds": 2},
        "slo": (
            {"latencyP99Ms": args.slo, "trace": {"configMap": "sample", "key": "trace.csv"}}
            if args.sample_step
            else {"latencyP99Ms": args.slo, "rate": args.rate, "durationSeconds": 60}
        ),
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": args.max_replicas,
            "scaleDownDelaySeconds": args.scale_down_delay,
            "intervalSeconds": 2,
            "startupFloorSeconds": args.startup_floor,
        },
    }


def sample_configmap(args: argparse.Namespace) -> dict[str, Any]:
    """The planner's sample with the step in it (another seed than the load's): base rate,
    then the step, ``--phase`` seconds each."""
    trace = step_trace([args.rate, args.rate * args.factor], phase_s=args.phase, seed=11)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "sample"},
        "data": {"trace.csv": trace_to_csv(trace)},
    }


def sample_status(cluster: OperatorCluster, t0: float, stop: threading.Event) -> list[dict]:
    samples: list[dict[str, Any]] = []

    def run() -> None:
        while not stop.is_set():
            status = cluster.status(NAME)
            auto = status.get("autoscaling") or {}
            samples.append(
                {
                    "t": time.monotonic() - t0,
                    "wanted": auto.get("replicas"),
                    "ready": status.get("readyReplicas"),
                    "action": (auto.get("lastDecision") or {}).get("action"),
                    "reason": (auto.get("lastDecision") or {}).get("reason"),
                }
            )
            stop.wait(0.5)

    threading.Thread(target=run, daemon=True).start()
    return samples


def summarize(rows: list[dict[str, Any]], samples: list[dict], args: argparse.Namespace) -> str:
    phases = [("base", 0.0, args.phase), ("step", args.phase, 2 * args.phase)]
    phases.append(("after", 2 * args.phase, 3 * args.phase))
    lines = [
        f"{args.model}: rate {args.rate}/s -> x{args.factor} -> back, {args.phase:g} s phases, "
        f"SLO P99 {args.slo:g} ms, scale-down delay {args.scale_down_delay} s",
        f"{'phase':>6}{'requests':>10}{'failed':>8}{'misses':>8}{'miss %':>8}{'P99 ms':>9}"
        f"{'replicas':>10}",
    ]
    for name, lo, hi in phases:
        sel = [r for r in rows if lo <= r["t"] < hi]
        ok = np.array([r["latency_ms"] for r in sel if r["code"] == 200])
        failed = sum(1 for r in sel if r["code"] != 200)
        misses = failed + int((ok > args.slo).sum())
        reps = sorted({s["wanted"] for s in samples if lo <= s["t"] - samples_offset(samples) < hi})
        p99 = nearest_rank(np.array([*ok, *([np.inf] * failed)]), 99) if sel else float("nan")
        lines.append(
            f"{name:>6}{len(sel):>10}{failed:>8}{misses:>8}"
            f"{100.0 * misses / max(1, len(sel)):>8.2f}{p99:>9.1f}{reps!s:>10}"
        )
    quiet = [s["wanted"] for s in samples if s["t"] - samples_offset(samples) >= 3 * args.phase]
    if quiet:
        lines.append(
            f"after the load: replicas {quiet[0]} -> {quiet[-1]} "
            f"({samples[-1]['t'] - samples_offset(samples) - 3 * args.phase:.0f} s later)"
        )
    ups = [s for s in samples if s["action"] == "scale_up"]
    if ups:
        lines.append(
            f"first scale-up decision seen {ups[0]['t'] - samples_offset(samples):.1f} s "
            "after the load started"
        )
    return "\n".join(lines) + "\n"


def samples_offset(samples: list[dict]) -> float:
    return float(samples[0].get("load_start", 0.0)) if samples else 0.0


def plot(
    rows: list[dict[str, Any]], samples: list[dict], args: argparse.Namespace, out: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offset = samples_offset(samples)
    end = 3 * args.phase
    edges = np.arange(0, end + 5, 5.0)
    mids = edges[:-1] + 2.5
    t = np.array([r["t"] for r in rows])
    code = np.array([r["code"] for r in rows])
    lat = np.array([r["latency_ms"] for r in rows])
    p99, miss, failed = [], [], []
    for lo, hi in itertools.pairwise(edges):
        sel = (t >= lo) & (t < hi)
        ok = lat[sel & (code == 200)]
        nf = int((sel & (code != 200)).sum())
        n = int(sel.sum())
        p99.append(nearest_rank(np.array([*ok, *([np.inf] * nf)]), 99) if n else np.nan)
        miss.append(100.0 * (nf + int((ok > args.slo).sum())) / n if n else np.nan)
        failed.append(nf)
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax = axes[0]
    ax.plot(mids, np.minimum(p99, 10 * args.slo), marker=".", label="P99 per 5 s (measured)")
    ax.axhline(args.slo, color="red", linestyle="--", label=f"SLO {args.slo:g} ms")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.legend(loc="upper left")
    ax = axes[1]
    ax.bar(mids, miss, width=4, label="SLO misses (% of requests, failed included)")
    ax.bar(mids, failed, width=2, color="black", label="failed requests (count)")
    ax.legend(loc="upper left")
    ax = axes[2]
    st = [s["t"] - offset for s in samples]
    ax.step(st, [s["wanted"] or 0 for s in samples], where="post", label="tuner's replicas")
    ax.step(st, [s["ready"] or 0 for s in samples], where="post", label="ready replicas")
    ax.set_ylabel("replicas")
    ax.set_xlabel("seconds since the load started")
    ax.legend(loc="upper left")
    for a in axes:
        for x in (args.phase, 2 * args.phase):
            a.axvline(x, color="grey", linewidth=0.8)
    fig.suptitle(
        f"Tuner under a x{args.factor:g} arrival-rate step ({args.model}, base {args.rate:g}/s)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--phase", type=float, default=60.0)
    parser.add_argument("--slo", type=float, default=250.0)
    parser.add_argument("--max-replicas", type=int, default=4)
    parser.add_argument("--scale-down-delay", type=int, default=30)
    parser.add_argument("--after", type=float, default=105.0, help="seconds watched after the load")
    parser.add_argument(
        "--startup-floor", type=int, default=0, help="spec.autoscaling.startupFloorSeconds"
    )
    parser.add_argument(
        "--sample-step",
        action="store_true",
        help="plan on a sample that has the step (a trace ConfigMap), not the base rate",
    )
    parser.add_argument("--stem", default="tuner-step")
    parser.add_argument("--from-json", type=Path, help="only summarize and plot a saved run")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        for key, value in saved["args"].items():
            if key not in ("from_json", "stem"):
                setattr(args, key, value)
        text = summarize(saved["rows"], saved["samples"], args)
        (RESULTS / f"{args.stem}.txt").write_text(text)
        plot(saved["rows"], saved["samples"], args, RESULTS / f"{args.stem}.png")
        print(text)
        return
    with tempfile.TemporaryDirectory(prefix="packrat-tuner-") as tmp:
        cluster = OperatorCluster(Path(tmp))
        try:
            body = {"apiVersion": "packrat.dev/v1alpha1", "kind": "PackratModel"}
            if args.sample_step:
                cluster.api.create("configmaps", sample_configmap(args))
            cluster.api.create(
                "packratmodels", {**body, "metadata": {"name": NAME}, "spec": spec_for(args)}
            )
            wait_for(
                lambda: cluster.status(NAME).get("phase") == "Ready",
                timeout=900,
                what="the model Ready",
                period=1.0,
                detail=lambda: json.dumps(cluster.status(NAME))[:2000] + cluster.log_tail(),
            )
            provisioning = cluster.status(NAME).get("provisioning")
            print("provisioned:", json.dumps(provisioning), flush=True)
            rates = [args.rate, args.rate * args.factor, args.rate]
            trace = step_trace(rates, phase_s=args.phase, seed=5)
            stop = threading.Event()
            t0 = time.monotonic()
            samples = sample_status(cluster, t0, stop)
            start = time.monotonic() - t0
            result = asyncio.run(
                run_trace(
                    Target(
                        url=cluster.agent.proxy.url(NAME),
                        model=NAME,
                        body=example_body(args.model),
                        timeout_s=30,
                    ),
                    arrivals_s=trace.tolist(),
                )
            )
            if samples:
                samples[0]["load_start"] = start
            # watch the scale-down after the load
            time.sleep(args.after)
            stop.set()
            final = cluster.status(NAME)
        finally:
            cluster.close()
    rows = [
        {"t": r.sent_s, "latency_ms": r.latency_s * 1000.0, "code": r.status, "error": r.error}
        for r in result.records
    ]
    doc = {
        "args": vars(args),
        "provisioning": provisioning,
        "final_autoscaling": final.get("autoscaling"),
        "send_lag_ms": result.late_s * 1000.0,
        "rows": rows,
        "samples": samples,
    }
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(doc) + "\n")
    text = summarize(rows, samples, args)
    (RESULTS / f"{args.stem}.txt").write_text(text)
    plot(rows, samples, args, RESULTS / f"{args.stem}.png")
    print(text)


if __name__ == "__main__":
    main()
