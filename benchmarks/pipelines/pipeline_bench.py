"""A 3-stage pipeline in simulation: InferLine's per-stage planner vs the coarse-grained
baselines (the whole pipeline replicated as one unit, sized for the mean and the peak rate).

Run: ``.venv/bin/python benchmarks/pipelines/pipeline_bench.py`` (a few minutes on 2 busy cores).
Writes ``benchmarks/results/pipeline.{json,txt}`` and ``docs/img/pipeline-cost-miss.png``.

Pipeline: ``benchmarks/pipelines/three-stage.yaml`` (ResNet-50 profiles of the Packrat
paper, T = 16: detect -> classify -> refine, the last taken by 30% of the queries).
For each workload (gamma inter-arrivals, CV 1 and CV 4) and SLO, the planner plans on a
sample trace; the plan is then simulated on an evaluation trace of the same process (another
seed, twice as long). The baselines are sized for the evaluation trace's own mean and peak
(busiest 1 s) rates, i.e. they are given the whole trace in advance. Cores are total cores;
the miss rate is the fraction of evaluation queries slower than the SLO (shed ones count).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from packrat.plan.pipeline.baselines import coarse_baselines
from packrat.plan.pipeline.provision import provision_pipeline
from packrat.plan.pipeline.search import PipelinePlanner
from packrat.plan.pipeline.spec import load_pipeline_spec
from packrat.plan.traces import gamma_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What does a pipeline cost against coarse-grained provisioning?"'
    " (#what-does-a-pipeline-cost-against-coarse-grained-provisioning)"
)

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "benchmarks" / "pipelines" / "three-stage.yaml"
RESULTS = ROOT / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"


def one(spec_path: Path, *, cv: float, slo: float, rate: float, duration: float) -> dict[str, Any]:
    spec = load_pipeline_spec(spec_path)
    sample = gamma_trace(rate, cv=cv, duration_s=duration, seed=10)
    evaluation = gamma_trace(rate, cv=cv, duration_s=2 * duration, seed=20)
    start, cpu = time.perf_counter(), time.process_time()
    plan = provision_pipeline(PipelinePlanner(spec.pipeline, sample, slo_ms=slo))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    judge = PipelinePlanner(spec.pipeline, evaluation, slo_ms=slo)
    ev = judge.evaluate(plan.best.configs)
    base = coarse_baselines(judge)
    return {
        "cv": cv,
        "slo_ms": slo,
        "rate": rate,
        "sample_arrivals": int(sample.size),
        "eval_arrivals": int(evaluation.size),
        "planner": {
            "stages": plan.to_dict()["stages"],
            "cores": plan.best.cores,
            "sample_p99_ms": plan.best.p99_ms,
            "eval_p99_ms": ev.p99_ms,
            "miss_rate": ev.miss_rate,
            "evaluations": plan.evaluations,
            "wall_s": wall,
            "cpu_s": cpu,
            "steps": plan.steps,
        },
        "cg_mean": base["mean"],
        "cg_peak": base["peak"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        f"{'workload':16}{'planner cores':>14}{'miss %':>8}{'CG-mean':>9}{'miss %':>8}"
        f"{'CG-peak':>9}{'miss %':>8}{'plan s':>8}  per-stage plan"
    ]
    for r in rows:
        p, m, k = r["planner"], r["cg_mean"], r["cg_peak"]
        stages = ", ".join(
            f"{s['name']} {s['replicas']}x{s['cpus_per_replica']}c/b{s['batch']}"
            for s in p["stages"]
        )
        out.append(
            f"{'CV ' + str(r['cv']) + ', SLO ' + str(int(r['slo_ms'])):16}{p['cores']:>14}"
            f"{100 * p['miss_rate']:>8.2f}{m['cores']:>9}{100 * m['slo_miss_rate']:>8.2f}"
            f"{k['cores']:>9}{100 * k['slo_miss_rate']:>8.2f}{p['cpu_s']:>8.1f}  {stages}"
        )
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"CV {r['cv']:g}\nSLO {r['slo_ms']:g} ms" for r in rows]
    series = [
        (
            "planner (per stage)",
            [r["planner"]["cores"] for r in rows],
            [r["planner"]["miss_rate"] for r in rows],
        ),
        (
            "CG-mean",
            [r["cg_mean"]["cores"] for r in rows],
            [r["cg_mean"]["slo_miss_rate"] for r in rows],
        ),
        (
            "CG-peak",
            [r["cg_peak"]["cores"] for r in rows],
            [r["cg_peak"]["slo_miss_rate"] for r in rows],
        ),
    ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.27
    for j, (name, cores, miss) in enumerate(series):
        xs = [i + (j - 1) * width for i in range(len(rows))]
        ax1.bar(xs, cores, width, label=name)
        ax2.bar(xs, [100 * m for m in miss], width, label=name)
    for ax, title in ((ax1, "total cores"), (ax2, "SLO misses (% of queries)")):
        ax.set_xticks(range(len(rows)), labels)
        ax.set_title(title)
    ax2.set_yscale("symlog", linthresh=0.1)
    ax1.legend()
    fig.suptitle("3-stage pipeline (ResNet-50 profiles, T=16), simulated on held-out gamma traces")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=60.0, help="sample trace (s)")
    parser.add_argument("--slo", type=float, nargs="+", default=[600.0, 1000.0])
    parser.add_argument("--name", default="pipeline", help="results file stem")
    args = parser.parse_args()
    rows = []
    for cv in (1.0, 4.0):
        for slo in args.slo:
            rows.append(one(SPEC, cv=cv, slo=slo, rate=args.rate, duration=args.duration))
            print(table(rows[-1:]), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(rows, indent=2, default=str))
    (RESULTS / f"{args.name}.txt").write_text(table(rows) + "\n")
    plot(rows, IMG / f"{args.name}-cost-miss.png")
    print(table(rows))


if __name__ == "__main__":
    main()
