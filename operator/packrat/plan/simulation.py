"""One configuration on one trace, summarised: what ``packrat simulate`` prints.

The planner keeps only a P99 per configuration; checking a plan on traffic it was not made
on needs the rest too: the median, the mean, how many queries were shed, and how close to
saturation the replicas run (utilisation: the trace's sustained rate, its busiest 60 s,
over what the replicas serve backlogged, as the planner computes it). Pure: the same DES
(:func:`packrat.plan.des.simulate`) the planner searches with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packrat.plan.des import SimulationError, simulate
from packrat.plan.provision import SimSettings, backlogged_capacity, sustained_rate
from packrat.plan.search import finite
from packrat.plan.traces import mean_rate

Table = Mapping[tuple[int, int], float]


@dataclass(frozen=True, slots=True)
class Summary:
    """Latency percentiles (ms; ``inf`` when they fall on a shed query), load and sheds."""

    queries: int
    shed: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    mean_ms: float
    max_ms: float
    utilization: float
    mean_rate: float
    sustained_rate: float
    capacity_per_replica: float
    slo_ms: float | None
    slo_miss_rate: float | None

    @property
    def shed_rate(self) -> float:
        return self.shed / self.queries if self.queries else 0.0

    @property
    def meets_slo(self) -> bool | None:
        return None if self.slo_ms is None else self.p99_ms <= self.slo_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "queries": self.queries,
            "p50_ms": finite(self.p50_ms),
            "p99_ms": finite(self.p99_ms),
            "p999_ms": finite(self.p999_ms),
            "mean_ms": finite(self.mean_ms),
            "max_ms": finite(self.max_ms),
            "utilization": self.utilization,
            "shed": self.shed,
            "shed_rate": self.shed_rate,
            "mean_rate": self.mean_rate,
            "sustained_rate": self.sustained_rate,
            "capacity_per_replica": self.capacity_per_replica,
            "slo_p99_ms": self.slo_ms,
            "slo_miss_rate": self.slo_miss_rate,
            "meets_slo": self.meets_slo,
        }


def simulate_config(
    table: Table,
    trace_s: np.ndarray,
    instances: Sequence[tuple[int, int]],
    *,
    replicas: int,
    sim: SimSettings | None = None,
    slo_ms: float | None = None,
    service_cv: float = 0.0,
) -> Summary:
    """Simulate ``replicas`` replicas of ``instances`` on ``trace_s`` and summarise.

    The mean over served queries only (a shed query has no latency), the percentiles over
    all of them (a shed query counts as infinitely slow, as the planner counts it)."""
    if trace_s.size == 0:
        raise SimulationError("the trace has no arrivals")
    if slo_ms is not None and not (math.isfinite(slo_ms) and slo_ms > 0):
        raise SimulationError(f"the SLO must be a number of ms > 0, got {slo_ms!r}")
    settings = (sim or SimSettings()).des_options()
    result = simulate(
        trace_s, table, list(instances), replicas=replicas, service_cv=service_cv, **settings
    )
    lat = result.latencies_ms
    served = lat[np.isfinite(lat)]
    capacity = backlogged_capacity(table, instances)
    sustained = sustained_rate(trace_s)
    return Summary(
        queries=result.queries,
        shed=result.shed,
        p50_ms=result.percentile(50.0),
        p99_ms=result.p99_ms,
        p999_ms=result.percentile(99.9),
        mean_ms=float(served.mean()) if served.size else math.nan,
        max_ms=float(lat.max()),
        utilization=sustained / (replicas * capacity),
        mean_rate=mean_rate(trace_s) or float(trace_s.size),
        sustained_rate=sustained,
        capacity_per_replica=capacity,
        slo_ms=slo_ms,
        slo_miss_rate=None if slo_ms is None else result.miss_rate(slo_ms),
    )
