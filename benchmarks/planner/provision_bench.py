"""InferLine on Packrat plans, in simulation: DES speed, planner time, planner + tuner vs
coarse-grained provisioning.

Run: ``.venv/bin/python benchmarks/planner/provision_bench.py`` (about 2-4 minutes on 2 busy cores).
Writes ``benchmarks/results/provision.{json,txt}`` and ``provision-step.png``.

(a) DES speed: simulated queries per second on a 20,000-arrival trace for three
    configurations (median, min, max of repeats), and the planner's wall time on that trace.
(c) Cores and SLO-miss rate on an evaluation trace, for: the planner alone (static, planned
    on a sample trace of the same process, another seed), the planner + tuner (replicas
    follow the tuner's decisions, a new replica serving ``--startup-s`` after the decision),
    and fat replicas (one T-thread instance each) sized for the evaluation trace's own mean
    and peak (1 s) rates: the coarse-grained baselines, given the whole trace in advance.
    Workloads: gamma CV 1, gamma CV 4, and a 4x rate step (the sample is the first phase).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from packrat.plan.des import simulate
from packrat.plan.envelope import Tuner, envelope, replay, schedule, window_sizes
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import load_profile
from packrat.plan.provision import Config, Planner, SimSettings, provision
from packrat.plan.traces import gamma_trace, mean_rate, peak_rate, step_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How many cores does a P99 SLO take, and does the plan hold out of sample?"'
    " (#how-many-cores-does-a-p99-slo-take-and-does-the-plan-hold-out-of-sample)"
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
RESULTS = ROOT / "benchmarks" / "results"


def des_speed(table: dict[tuple[int, int], float], repeats: int) -> list[dict[str, Any]]:
    trace = gamma_trace(200.0, cv=1.0, duration_s=100.0, seed=1)[:20_000]
    opt = Optimizer(table, cpus=16, max_batch=128, alternatives=False)
    configs = [
        ("1 replica, fat 16t/b1", [(16, 1)], 5),
        (
            "4 replicas, 4x1t/b2 plan (c=4, B=8)",
            Optimizer(table, cpus=4, max_batch=8).plan(8).expand(),
            4,
        ),
        ("2 replicas, 16-instance plan (c=16, B=32)", opt.plan(32).expand(), 2),
    ]
    out = []
    for name, instances, replicas in configs:
        runs = []
        for _ in range(repeats):  # CPU time: the machine is shared, wall time would be noise
            start = time.process_time()
            simulate(trace, table, instances, replicas=replicas)
            runs.append(time.process_time() - start)
        qps = [trace.size / r for r in runs]
        out.append(
            {
                "config": name,
                "queries": int(trace.size),
                "median_qps": statistics.median(qps),
                "min_qps": min(qps),
                "max_qps": max(qps),
            }
        )
    return out


def planner_time(table: dict[tuple[int, int], float], slo: float) -> list[dict[str, Any]]:
    out = []
    for cv in (1.0, 4.0):
        trace = gamma_trace(200.0, cv=cv, duration_s=200.0, seed=2)[:20_000]
        start, cpu = time.perf_counter(), time.process_time()
        result = provision(Planner(table, trace, slo_ms=slo, max_cores=512))
        best = result.best.config
        out.append(
            {
                "cv": cv,
                "arrivals": int(trace.size),
                "wall_s": time.perf_counter() - start,
                "cpu_s": time.process_time() - cpu,
                "simulations": result.evaluations,
                "config": f"{best.replicas}x{best.cpus}c/b{best.batch}",
                "cores": result.best.config.cores,
                "feasible": result.feasible,
            }
        )
    return out


def tuned_schedule(
    planner: Planner, best: Config, sample: np.ndarray, trace: np.ndarray, startup_s: float
) -> tuple[list[tuple[float, int]], list[str]]:
    instances = planner.instances(best.cpus, best.batch)
    service_s = (
        Optimizer(planner.table, cpus=best.cpus, max_batch=best.batch).latency(best.batch) / 1000
    )
    windows = window_sizes(service_s)
    tuner = Tuner(
        planned_replicas=best.replicas,
        replica_capacity=planner.capacity(instances),
        windows=windows,
        planned_rates=envelope(sample, windows).tolist(),
        max_replicas=planner.max_cores // best.cpus,
        scale_down_delay_s=120.0,
    )
    decisions = replay(tuner, trace, interval_s=1.0)
    steps = schedule(decisions, initial=best.replicas)
    effective: list[tuple[float, int]] = [steps[0]]
    for (t, n), (_, prev) in zip(steps[1:], steps, strict=False):
        effective.append((t + startup_s, n) if n > prev else (t, n))
    effective.sort()
    reasons = [d.reason for d in decisions if d.action != "hold"]
    return effective, reasons


def mean_replicas(steps: list[tuple[float, int]], end: float) -> float:
    total = 0.0
    for (t, n), nxt in zip(steps, [*steps[1:], (end, 0)], strict=False):
        total += n * max(0.0, min(nxt[0], end) - min(t, end))
    return total / end


def compare(
    table: dict[tuple[int, int], float],
    name: str,
    sample: np.ndarray,
    trace: np.ndarray,
    slo: float,
    startup_s: float,
    max_cores: int,
) -> dict[str, Any]:
    sim = SimSettings()
    planner = Planner(table, sample, slo_ms=slo, max_cores=max_cores, sim=sim)
    best, _ = planner.greedy()
    cfg = best.config
    instances = planner.instances(cfg.cpus, cfg.batch)
    end = float(trace[-1])
    static = simulate(trace, table, instances, replicas=cfg.replicas)
    steps, reasons = tuned_schedule(planner, cfg, sample, trace, startup_s)
    tuned = simulate(trace, table, instances, schedule=steps)
    evaluator = Planner(table, trace, slo_ms=slo, max_cores=max_cores * 4, sim=sim)
    rows: dict[str, Any] = {
        "planner": {
            "cores": cfg.cores,
            "miss_rate": static.miss_rate(slo),
            "p99_ms": static.p99_ms,
            "config": f"{cfg.replicas}x{cfg.cpus}c/b{cfg.batch}",
        },
        "planner+tuner": {
            "cores": mean_replicas(steps, end) * cfg.cpus,
            "max_cores": max(n for _, n in steps) * cfg.cpus,
            "miss_rate": tuned.miss_rate(slo),
            "p99_ms": tuned.p99_ms,
            "changes": len(steps) - 1,
            "first_reasons": reasons[:3],
        },
    }
    for label, rate in (("cg-mean", mean_rate(trace)), ("cg-peak", peak_rate(trace, window_s=1.0))):
        ev = evaluator.baseline(rate)
        rows[label] = {
            "cores": ev.config.cores,
            "miss_rate": ev.miss_rate,
            "p99_ms": ev.p99_ms,
            "config": f"{ev.config.replicas}x{ev.config.cpus}c/b{ev.config.batch} fat",
        }
    return {
        "workload": name,
        "slo_ms": slo,
        "arrivals": int(trace.size),
        "rows": rows,
        "schedule": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--slo-ms", type=float, default=500.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--startup-s", type=float, default=5.0)
    parser.add_argument("--max-cores", type=int, default=256)
    parser.add_argument("--stem", default="provision")
    args = parser.parse_args()
    table = load_profile(PROFILE).table()
    speed = des_speed(table, args.repeats)
    wall = planner_time(table, args.slo_ms)
    r = args.rate
    workloads = [
        (
            "gamma CV 1",
            gamma_trace(r, cv=1.0, duration_s=180, seed=10),
            gamma_trace(r, cv=1.0, duration_s=180, seed=11),
        ),
        (
            "gamma CV 4",
            gamma_trace(r, cv=4.0, duration_s=180, seed=20),
            gamma_trace(r, cv=4.0, duration_s=180, seed=21),
        ),
        (
            "4x step",
            gamma_trace(r / 4, cv=1.0, duration_s=60, seed=30),
            step_trace([r / 4, r], cv=1.0, phase_s=90, seed=31),
        ),
    ]
    comparisons = [
        compare(table, name, sample, trace, args.slo_ms, args.startup_s, args.max_cores)
        for name, sample, trace in workloads
    ]
    doc = {
        "profile": str(PROFILE.relative_to(ROOT)),
        "des_speed": speed,
        "planner": wall,
        "comparisons": comparisons,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(doc, indent=2, default=float) + "\n")
    lines = [
        f"profile {doc['profile']}, SLO P99 {args.slo_ms} ms",
        "",
        "DES speed (20,000 arrivals, CPU time):",
    ]
    for s in speed:
        lines.append(
            f"  {s['config']:44} median {s['median_qps']:>9,.0f} q/s "
            f"(min {s['min_qps']:,.0f}, max {s['max_qps']:,.0f})"
        )
    lines.append("planner wall time (20,000 arrivals, rate 200/s):")
    for w in wall:
        lines.append(
            f"  CV {w['cv']:g}: {w['wall_s']:.2f} s wall, {w['cpu_s']:.2f} s CPU, "
            f"{w['simulations']} simulations -> {w['config']} ({w['cores']} cores)"
        )
    for c in comparisons:
        lines.append("")
        lines.append(f"{c['workload']} ({c['arrivals']} arrivals), SLO {c['slo_ms']:g} ms:")
        lines.append(f"  {'':16}{'cores':>8}{'miss %':>9}{'P99 ms':>10}  config")
        for label, row in c["rows"].items():
            lines.append(
                f"  {label:16}{row['cores']:>8.1f}{100 * row['miss_rate']:>9.2f}"
                f"{row['p99_ms']:>10.1f}  {row.get('config', '')}"
                f"{' changes ' + str(row['changes']) if 'changes' in row else ''}"
            )
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)
    plot(comparisons[-1], RESULTS / f"{args.stem}-step.png")


def plot(comparison: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = comparison["schedule"]
    fig, ax = plt.subplots(figsize=(7, 3))
    xs = [t for t, _ in steps] + [steps[-1][0] + 30]
    ys = [n for _, n in steps] + [steps[-1][1]]
    ax.step(xs, ys, where="post", label="planner + tuner replicas")
    ax.axvline(90, color="grey", ls="--", label="4x rate step")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("replicas")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
