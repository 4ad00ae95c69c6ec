"""Coarse-grained baselines for a pipeline: the whole pipeline replicated as one unit.

A unit is one fat replica (one instance on all the stage's cores) per stage, whatever the
stage's scale factor; units are sized for the trace's mean and for its peak (busiest 1 s)
rate, each unit's capacity being its slowest stage divided by the fraction of queries that
visit it. Arrivals are spread over the units at random and stay in their unit, which is
how a pipeline replicated as a unit serves (InferLine's CG-Mean and CG-Peak).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from packrat.plan.des import nearest_rank
from packrat.plan.pipeline.search import Configs, PipelinePlanner
from packrat.plan.pipeline.simulate import PipelineSim, StageRun
from packrat.plan.provision import Config
from packrat.plan.search import finite
from packrat.plan.traces import peak_rate


def coarse_unit(planner: PipelinePlanner) -> Configs:
    """One fat replica per stage; each stage's batch the one with the best throughput
    whose latency fits its share of the SLO (shares in proportion to batch-1 latency)."""
    t = {n: planner.pipeline.stages[n].cpus for n in planner.names}
    tables = {n: planner.pipeline.stages[n].table for n in planner.names}
    one = {n: min(v for (tt, _), v in tables[n].items() if tt == t[n]) for n in planner.names}
    path = planner.pipeline.critical_path(one)
    out = []
    for n in planner.names:
        sizes = sorted(b for (tt, b) in tables[n] if tt == t[n])
        share = planner.slo_ms * one[n] / path
        fits = [b for b in sizes if tables[n][(t[n], b)] <= share] or [sizes[0]]
        out.append(Config(t[n], max(fits, key=lambda b: (b / tables[n][(t[n], b)], -b)), 1))
    return tuple(out)


def unit_capacity(planner: PipelinePlanner, unit: Configs) -> float:
    """Queries per second one unit sustains: its slowest stage, scaled by its visits."""
    caps = []
    for n, c in zip(planner.names, unit, strict=True):
        if planner.scale[n] > 0:
            mu = planner.stage_planners[n].capacity(((c.cpus, c.batch),))
            caps.append(mu / planner.scale[n])
    return min(caps)


def coarse_baseline(planner: PipelinePlanner, rate: float) -> dict[str, Any]:
    unit = coarse_unit(planner)
    units = max(1, math.ceil(rate / unit_capacity(planner, unit) - 1e-9))
    lat = simulate_units(planner, unit, units)
    p99 = nearest_rank(lat, 99.0)
    return {
        "units": units,
        "stages": [
            {"name": n, "cpus_per_replica": c.cpus, "batch": c.batch, "replicas": units}
            for n, c in zip(planner.names, unit, strict=True)
        ],
        "cores": units * sum(c.cpus for c in unit),
        "simulated_p99_ms": finite(p99),
        "slo_miss_rate": float((lat > planner.slo_ms).mean()),
        "feasible": p99 <= planner.slo_ms,
    }


def coarse_baselines(planner: PipelinePlanner) -> dict[str, dict[str, Any]]:
    return {
        "mean": coarse_baseline(planner, planner.rate),
        "peak": coarse_baseline(planner, peak_rate(planner.trace, window_s=1.0)),
    }


def simulate_units(
    planner: PipelinePlanner, unit: Configs, units: int, trace: np.ndarray | None = None
) -> np.ndarray:
    """End-to-end latencies (ms, arrival order) of ``units`` copies of the pipeline, each
    query spread to one unit at random (seeded) and served by that unit's fat replicas."""
    trace = planner.trace if trace is None else trace
    s = planner.sim
    which = np.random.default_rng([s.seed, 1]).integers(0, units, size=trace.size)
    out = np.full(trace.size, np.inf)
    runs = {n: StageRun(((c.cpus, c.batch),), 1) for n, c in zip(planner.names, unit, strict=True)}
    for u in range(units):
        idx = np.flatnonzero(which == u)
        if idx.size == 0:
            continue
        sim = PipelineSim(planner.pipeline, trace[idx], **s.des_options(seed=s.seed + u))
        out[idx] = sim.run(runs).latencies_ms
    return out
