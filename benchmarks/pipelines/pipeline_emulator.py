"""A PackratPipeline on the emulator with real pods: simulated vs measured end-to-end P99.

The real operator runs against the kmock emulator with the integration harness's agent (real
``packrat serve`` pods for the stage models, real ``packrat route`` pods for the router, Service
traffic through its kube-proxy stand-in). The pipeline is two ``tiny`` stages side by side
(both roots: every query visits both, the router joins the answers; ``tiny`` cannot feed
itself). Each stage model gets a profile of ``tiny`` measured on this machine (``packrat
profile``, threads 1 and 2, batches 1..8; or ``--profile FILE``) as its profile ConfigMap.

For each load level (``--rates``): the pipeline's ``slo.rate`` is set to it, the operator
plans and rolls the stage models out, then open-loop gamma arrivals at that rate
(``run_trace``, what ``packrat loadgen --trace`` sends) go through the pipeline's Service for
``--duration`` seconds. Recorded: the planned configuration, the operator's simulated P99
(``status.simulatedP99Ms``, on its own sample trace), the DES re-run of the planned
configuration on the exact trace sent, and the measured end-to-end P99 of the answers.
Outputs: ``benchmarks/results/<stem>.json`` (everything) and ``<stem>.txt`` (one line per level).

A benchmark, not a test: one run on a shared 2-core machine, where the router, both stage
models' pods, the operator, the emulator and the load generator share the cores; the profile
has only the model's compute; the HTTP hops (client -> router -> stage dispatcher ->
TorchServe and back) are the planner's ``spec.slo.hopOverheadMs`` per hop (``--hop-ms``,
default the operator's), in the operator's simulation and in the re-run on the trace sent.

Run: ``.venv/bin/python benchmarks/pipelines/pipeline_emulator.py`` (about 10 minutes with the
defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "operator"))

from harness import OperatorCluster, wait_for  # noqa: E402
from seeding import MeasuredProfiles, seed_profile  # noqa: E402

from packrat.bench.loadgen import Target  # noqa: E402
from packrat.bench.replay import run_trace  # noqa: E402
from packrat.plan.des import nearest_rank  # noqa: E402
from packrat.plan.pipeline.search import PipelinePlanner  # noqa: E402
from packrat.plan.pipeline.simulate import DEFAULT_HOP_OVERHEAD_MS, Pipeline, Stage  # noqa: E402
from packrat.plan.profile import Profile, load_profile  # noqa: E402
from packrat.plan.provision import Config, SimSettings  # noqa: E402
from packrat.plan.traces import gamma_trace  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Does the simulation match a real pod?"'
    " (#does-the-simulation-match-a-real-pod)"
)

RESULTS = ROOT / "benchmarks" / "results"
NAME = "duo"
STAGES = ("left", "right")
DELAY_MS = 2
os.environ.setdefault("PACKRAT_ALLOW_CONTENDED", "1")


def stage_model() -> dict[str, Any]:
    return {
        "model": {"zoo": "tiny"},
        "cpus": 2,
        "maxBatchDelayMs": DELAY_MS,
        "profiling": {"maxBatch": 8, "threads": [1, 2], "precision": 0.2, "backoffLimit": 0},
        "switch": {"readyTimeoutSeconds": 300, "drainSeconds": 2},
    }


def pipeline(rate: float, slo_ms: float, hop_ms: float) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratPipeline",
        "metadata": {"name": NAME},
        "spec": {
            "stages": [{"name": s, "model": stage_model()} for s in STAGES],
            "slo": {
                "latencyP99Ms": slo_ms,
                "rate": rate,
                "durationSeconds": 60,
                "hopOverheadMs": hop_ms,
            },
        },
    }


def status(cluster: OperatorCluster) -> dict[str, Any]:
    obj = cluster.api.get("packratpipelines", NAME) or {}
    return dict(obj.get("status") or {})


def serving(cluster: OperatorCluster, generation: int) -> dict[str, Any] | None:
    s = status(cluster)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in s.get("conditions") or []
    )
    return s if ready and s.get("observedGeneration") == generation else None


def resimulate(
    profile: Profile, stages: list[dict[str, Any]], trace: np.ndarray, slo: float, hop_ms: float
) -> float:
    """The DES on the exact trace sent, for the configuration the operator planned."""
    pipe = Pipeline([Stage(s["name"], profile.table(), 2) for s in stages])
    sim = SimSettings(max_batch_delay_ms=DELAY_MS, overhead_ms=hop_ms)
    planner = PipelinePlanner(pipe, trace, slo_ms=slo, sim=sim)
    by_name = {s["name"]: s for s in stages}
    configs = tuple(
        Config(by_name[n]["cpusPerReplica"], by_name[n]["batch"], by_name[n]["replicas"])
        for n in planner.names
    )
    return float(planner.evaluate(configs).p99_ms)


def level(
    cluster: OperatorCluster, profile: Profile, rate: float, args: argparse.Namespace
) -> dict[str, Any]:
    obj = cluster.api.get("packratpipelines", NAME)
    assert obj is not None
    if obj["spec"]["slo"]["rate"] != rate:
        cluster.api.patch("packratpipelines", NAME, {"spec": {"slo": {"rate": rate}}})
    generation = int((cluster.api.get("packratpipelines", NAME) or {})["metadata"]["generation"])
    planned = wait_for(
        lambda: serving(cluster, generation),
        timeout=900,
        what=f"pipeline serving at rate {rate}",
        period=1.0,
        detail=lambda: f"{status(cluster)}\n{cluster.log_tail(20)}",
    )
    time.sleep(5)  # the switched-out slots drain
    trace = gamma_trace(rate, cv=1.0, duration_s=args.duration, seed=int(rate * 1000) + 7)
    body = json.dumps([0.1] * 16).encode()
    result = asyncio.run(
        run_trace(
            Target(
                url=cluster.agent.proxy.url(NAME),
                model=NAME,
                body=body,
                content_type="application/json",
                timeout_s=30,
            ),
            arrivals_s=trace.tolist(),
        )
    )
    ok = np.array([r.latency_s * 1000.0 for r in result.records if r.ok])
    measured = nearest_rank(ok, 99.0) if ok.size else float("nan")
    return {
        "rate": rate,
        "stages": planned["stages"],
        "cores": planned["cores"],
        "simulated_p99_ms_status": planned.get("simulatedP99Ms"),
        "simulated_p99_ms_sent_trace": resimulate(
            profile, planned["stages"], trace, args.slo, args.hop_ms
        ),
        "measured_p99_ms": measured,
        "measured_p50_ms": float(np.median(ok)) if ok.size else None,
        "requests": len(result.records),
        "errors": result.errors,
        "max_send_lag_ms": result.late_s * 1000.0,
        "summary": result.summary(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="10,60", help="load levels, queries per second")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load per level")
    ap.add_argument("--slo", type=float, default=100.0, help="end-to-end P99 SLO (ms)")
    ap.add_argument("--profile", type=Path, help="a tiny profile (default: measure one now)")
    ap.add_argument(
        "--hop-ms",
        type=float,
        default=DEFAULT_HOP_OVERHEAD_MS,
        help="spec.slo.hopOverheadMs: one HTTP hop's cost in the planner's simulation",
    )
    ap.add_argument("--stem", default="pipeline-emulator")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        profile = (
            load_profile(args.profile) if args.profile else MeasuredProfiles(Path(tmp)).profile(8)
        )
        cluster = OperatorCluster(Path(tmp))
        try:
            cluster.api.create("packratpipelines", pipeline(rates[0], args.slo, args.hop_ms))
            for stage in STAGES:
                name = f"{NAME}-{stage}"
                wait_for(lambda n=name: cluster.api.get("packratmodels", n), timeout=120, what=name)
                seed_profile(cluster, name, profile)
            levels = [level(cluster, profile, rate, args) for rate in rates]
        finally:
            cluster.close()
    out = {"args": {k: str(v) for k, v in vars(args).items()}, "levels": levels}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(out, indent=1, default=str))
    lines = [
        f"hop overhead {args.hop_ms:g} ms per hop",
        "rate/s  config (replicas x cpus, batch per stage)   cores  sim P99 (status)  "
        "sim P99 (sent trace)  measured P99  measured P50  requests  errors",
    ]
    for lv in levels:
        config = ", ".join(
            f"{s['name']} {s['replicas']}x{s['cpusPerReplica']} b{s['batch']}" for s in lv["stages"]
        )
        lines.append(
            f"{lv['rate']:6.0f}  {config:42s}  {lv['cores']:5d}  "
            f"{lv['simulated_p99_ms_status']:16.2f}  {lv['simulated_p99_ms_sent_trace']:20.2f}  "
            f"{lv['measured_p99_ms']:12.2f}  {lv['measured_p50_ms']:12.2f}  "
            f"{lv['requests']:8d}  {lv['errors']:6d}"
        )
    text = "\n".join(lines)
    (RESULTS / f"{args.stem}.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
