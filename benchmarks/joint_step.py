"""Plan and replicas adapting together on a 4x step load, in simulation (issue 27 item 4).

The planner plans on a sample trace (ResNet-50's TorchServe profile, SLO ``--slo-ms``); on
the evaluation trace (base rate, then 4x, 120 s each) the tuner decides replicas every
second with start-up headroom (a scale-up serves ``--startup-s`` later, as in
``startup_step.py``), and the plan inside a replica either stays the planner's (``fixed``)
or follows the pods' batch-size estimate as autoBatch does, with the slow rules (3
observations read 5 s apart, 60 s between switches: the operator's defaults) or the fast
trigger (``sustainSeconds`` 1: the estimate read every second, a switch once every pod's
estimate has held a new value 1 s; :func:`packrat.plan.reconfig.fast_trigger`), and the fast
trigger with autoBatch's range floored at the planner's batch (``joint-fast-floor``). A switch
serves ``--switch-s`` later (the in-pod switch) and tells the tuner the new plan's capacity;
the ``-floor-keep`` variants are the operator's rule since this stop: the range floored at the
planner's batch and the tuner counting on no more per replica than the planned plan serves.

The pods' estimate is Packrat's estimator (:class:`packrat.plan.estimator.BatchSizeEstimator`,
nearest rounding) fed every 5 ms with the outstanding queries per serving replica, counted
from the DES of the current plan up to that moment (re-simulated from the last switch, with
``WARM_S`` before it, at every read). The evaluation simulates each plan's span the same
way (the queue a new plan inherits is the one its own plan would have built over the warm-up:
an approximation; the DES has no plan switch inside a run). Batch timeouts are not modelled
(the DES does not report them), so only the sustained-change trigger is exercised.

Run: ``.venv/bin/python benchmarks/joint_step.py`` (a minute or two); writes
``benchmarks/results/joint-step.{json,txt}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from packrat.plan.des import simulate
from packrat.plan.envelope import Tuner, envelope, growth_within, window_sizes
from packrat.plan.estimator import BatchSizeEstimator
from packrat.plan.optimizer import Optimizer, Plan
from packrat.plan.profile import load_profile
from packrat.plan.provision import Planner, backlogged_capacity, provision
from packrat.plan.reconfig import (
    FastLook,
    FastPolicy,
    FastState,
    Observation,
    Policy,
    decide,
    fast_trigger,
)
from packrat.plan.traces import gamma_trace, step_trace

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
RESULTS = ROOT / "benchmarks" / "results"
WARM_S = 10.0
SAMPLE_S = 0.005


@dataclass
class Run:
    """One variant's state over the evaluation trace."""

    plan: Plan
    replicas: list[tuple[float, int]]  # (time, serving replicas), scale-ups delayed
    segments: list[tuple[float, Plan]] = field(default_factory=list)
    history: list[Observation] = field(default_factory=list)
    fast: FastState = field(default_factory=FastState)
    last_switch: float | None = None


def serving_at(steps: list[tuple[float, int]], t: float) -> int:
    n = steps[0][1]
    for when, count in steps:
        if when <= t:
            n = count
    return n


def clipped(steps: list[tuple[float, int]], start: float) -> list[tuple[float, int]]:
    return [(start, serving_at(steps, start))] + [(t, n) for t, n in steps if t > start]


def span(trace: np.ndarray, table: dict, plan: Plan, steps: list, lo: float, hi: float) -> Any:
    """Arrivals in [lo, hi) on ``plan``, simulated from ``lo - WARM_S``: (arrivals, latency)."""
    start = max(0.0, lo - WARM_S)
    a, b = np.searchsorted(trace, [start, hi])
    arr = trace[a:b]
    if arr.size == 0:
        return arr, arr
    res = simulate(arr, table, plan.expand(), schedule=clipped(steps, float(arr[0])))
    keep = arr >= lo
    return arr[keep], res.latencies_ms[keep]


def outstanding(arr: np.ndarray, lat_ms: np.ndarray, times: np.ndarray) -> np.ndarray:
    done = np.sort(np.where(np.isfinite(lat_ms), arr + lat_ms / 1000.0, -np.inf))
    return np.searchsorted(arr, times, side="right") - np.searchsorted(done, times, "right")


def run_variant(variant: str, trace: np.ndarray, table: dict, ctx: dict[str, Any]) -> dict:
    opt: Optimizer = ctx["opt"]
    tuner: Tuner = ctx["tuner"]()
    startup_s, switch_s, end = ctx["startup_s"], ctx["switch_s"], float(trace[-1])
    floor = ctx["batch"] if "floor" in variant else 1  # never below the planner's
    policy = Policy(min_batch=floor, max_batch=ctx["max_batch"], sustain=3, min_interval_s=60.0)
    fast = FastPolicy(sustain_s=1.0, min_interval_s=5.0)
    read_every = 1.0 if variant.startswith("joint-fast") else 5.0
    run = Run(plan=opt.plan(ctx["batch"]), replicas=[(0.0, ctx["replicas"])])
    run.segments.append((0.0, run.plan))
    est = BatchSizeEstimator(window=200, rounding="nearest")
    held = (est.estimate, 0.0)
    lo, now, switches = 0, 1.0, 0
    while now <= end:
        hi = int(np.searchsorted(trace, now, side="right"))
        tuner.observe(trace[lo:hi].tolist())
        lo = hi
        d = tuner.decide(now)
        current = run.replicas[-1][1]
        if d.replicas != current:  # a scale-up serves after the start-up, a scale-down at once
            run.replicas.append((now + startup_s if d.replicas > current else now, d.replicas))
            run.replicas.sort()
        if variant != "fixed" and int(now) % int(read_every) == 0:
            seg_start = run.segments[-1][0]
            arr, lat = span(trace, table, run.segments[-1][1], run.replicas, seg_start, now)
            samples = np.arange(now - read_every, now, SAMPLE_S)
            counts = outstanding(arr, lat, samples)
            for s, c in zip(samples, counts, strict=True):
                if c > 0:
                    est.observe(float(c) / max(1, serving_at(run.replicas, float(s))))
                    if est.estimate != held[0]:
                        held = (est.estimate, float(s))
            if step_plan(run, variant, opt, table, policy, fast, est, held, now):
                switches += 1  # the new plan serves after the switch; the tuner learns its
                cap = backlogged_capacity(table, run.plan.expand())  # capacity
                if variant.endswith("keep"):  # the operator's rule: never more than planned
                    cap = min(cap, backlogged_capacity(table, opt.plan(ctx["batch"]).expand()))
                tuner.set_capacity(cap)
                run.segments[-1] = (now + switch_s, run.plan)
        now += 1.0
    arrivals, latencies = [], []
    bounds = [t for t, _ in run.segments[1:]] + [end + 1.0]
    for (t0, plan), t1 in zip(run.segments, bounds, strict=True):
        arr, lat = span(trace, table, plan, run.replicas, t0, t1)
        arrivals.append(arr)
        latencies.append(lat)
    lat = np.concatenate(latencies)
    cores = mean_level(run.replicas, end) * ctx["cpus"]
    return {
        "misses": float((lat > ctx["slo_ms"]).mean()),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "cores": cores,
        "replica_changes": len(run.replicas) - 1,
        "plan_switches": switches,
        "plans": [(round(t, 1), p.label) for t, p in run.segments],
    }


def step_plan(
    run: Run,
    variant: str,
    opt: Optimizer,
    table: dict,
    policy: Policy,
    fast: FastPolicy,
    est: BatchSizeEstimator,
    held: tuple[int, float],
    now: float,
) -> bool:
    """One read of the estimate and autoBatch's decision; True when it switched the plan."""
    observed = policy.clamp(est.estimate)
    run.history.append(Observation(now, observed))
    history, pol, waive = run.history, policy, False
    if variant.startswith("joint-fast"):
        look = FastLook(observed=observed, stable_s=now - held[1], timeout_fraction=None)
        verdict = fast_trigger(
            fast=fast, policy=policy, current=run.plan.batch, look=look, state=run.fast, now=now
        )
        run.fast = verdict.state
        if verdict.fire:
            history, pol, waive = [Observation(now, observed)], replace(policy, sustain=1), True
    d = decide(
        policy=pol,
        current_plan=run.plan,
        table=table,
        optimal_latency=opt.latency,
        history=history,
        last_switch_at=run.last_switch,
        now=now,
        ignore_interval=waive,
    )
    if not d.switch or d.target is None:
        return False
    run.fast = FastState(armed=run.fast.armed, last_at=now, last_from=run.plan.batch)
    run.last_switch = now
    run.plan = opt.plan(d.target)
    run.segments.append((now, run.plan))
    return True


def mean_level(steps: list[tuple[float, int]], end: float) -> float:
    total = 0.0
    for (t, n), nxt in zip(steps, [*steps[1:], (end, 0)], strict=False):
        total += n * max(0.0, min(nxt[0], end) - min(t, end))
    return total / end


def workload(table: dict, name: str, sample: np.ndarray, seeds: list[int], args: Any) -> dict:
    prov = provision(table, sample, slo_ms=args.slo_ms, max_cores=args.max_cores)
    planner = Planner(table, sample, slo_ms=args.slo_ms, max_cores=args.max_cores)
    cfg = prov.best.config
    max_batch = max(b for (t, b) in table if t <= cfg.cpus)
    opt = Optimizer(table, cpus=cfg.cpus, max_batch=max_batch)
    windows = window_sizes(opt.plan(cfg.batch).expected_latency_ms / 1000.0, min_window_s=0.1)
    growth = growth_within(sample, args.startup_s + 1.0, noise_z=1.0)

    def make_tuner() -> Tuner:
        return Tuner(
            planned_replicas=cfg.replicas,
            replica_capacity=backlogged_capacity(table, opt.plan(cfg.batch).expand()),
            windows=windows,
            planned_rates=envelope(sample, [min(w, float(sample[-1])) for w in windows]).tolist(),
            max_replicas=planner.max_cores // cfg.cpus,
            scale_down_delay_s=60.0,
            noise_z=3.0,
            startup_s=args.startup_s,
            growth=growth,
        )

    ctx = {
        "opt": opt, "tuner": make_tuner, "startup_s": args.startup_s, "switch_s": args.switch_s,
        "max_batch": max_batch, "batch": cfg.batch, "replicas": cfg.replicas, "cpus": cfg.cpus,
        "slo_ms": args.slo_ms,
    }  # fmt: skip
    variants = (
        "fixed", "joint-slow", "joint-fast", "joint-fast-floor",
        "joint-slow-floor-keep", "joint-fast-floor-keep",
    )  # fmt: skip
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    for seed in seeds:  # the variants interleaved on each trace
        trace = step_trace([args.rate, 4 * args.rate], cv=1.0, phase_s=120, seed=seed)
        for variant, runs in rows.items():
            runs.append(run_variant(variant, trace, table, ctx))
    return {"workload": name, "plan": cfg.label, "rows": rows}


def summary(runs: list[dict], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in runs]
    return statistics.median(values), min(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="base rate (x4 after the step)")
    parser.add_argument("--slo-ms", type=float, default=500.0)
    parser.add_argument("--startup-s", type=float, default=5.0)
    parser.add_argument("--switch-s", type=float, default=1.0)
    parser.add_argument("--max-cores", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[31, 32, 33])
    parser.add_argument("--stem", default="joint-step")
    args = parser.parse_args()
    table = dict(load_profile(PROFILE).table())
    r = args.rate
    samples = [
        ("step, sample has it", step_trace([r, 4 * r], cv=1.0, phase_s=120, seed=41)),
        ("step, steady sample", gamma_trace(r, cv=1.0, duration_s=60, seed=30)),
    ]
    out = [workload(table, name, sample, args.seeds, args) for name, sample in samples]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(
        json.dumps({"args": vars(args), "results": out}, indent=1, default=float) + "\n"
    )
    lines = [
        f"4x step from {r:g}/s, SLO {args.slo_ms:g} ms, start-up {args.startup_s:g} s, "
        f"switch {args.switch_s:g} s, {PROFILE.name}, seeds {args.seeds}: median (min-max)"
    ]
    for w in out:
        lines += ["", f"{w['workload']}: planned {w['plan']}"]
        for variant, runs in w["rows"].items():
            m, lo, hi = summary(runs, "misses")
            c, clo, chi = summary(runs, "cores")
            p, plo, phi = summary(runs, "p99_ms")
            s, slo, shi = summary(runs, "plan_switches")
            lines.append(
                f"  {variant:16} misses {100 * m:6.2f}% ({100 * lo:.2f}-{100 * hi:.2f})"
                f"  cores {c:5.1f} ({clo:.1f}-{chi:.1f})  P99 {p:8.1f} ms ({plo:.0f}-{phi:.0f})"
                f"  switches {s:g} ({slo:g}-{shi:g})"
            )
        for variant in ("joint-fast", "joint-fast-floor", "joint-slow-floor-keep"):
            lines.append(f"  {variant}, first seed: {w['rows'][variant][0]['plans']}")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
