"""A pooled model's compute demand, from what its pool pod reports and its own plan.

The demand of a model on a pool pod is ``rate x service time`` in cores, where

- the **rate** (requests per second) is the difference of two readings of the pod's request
  counter over the time between them (:func:`next_rate`): 0 before two readings, and the
  readings are untrusted (the pod runs an image the pool's author chose): a counter that went
  backwards (the pod restarted, or lies) starts a new baseline at rate 0, a reading from
  another pod too (the model moved: that pod counts from 0), a rate is capped at
  ``MAX_RATE``, and readings closer than ``MIN_INTERVAL_S`` keep the previous baseline (a
  rate over a second or two is noise);
- the **service time** of one request is the model's own profile on the pool's cores: its
  plan's threads times the profiled batch-1 latency on them (core-seconds per request, as the
  pool pod runs one request at a time per model with the plan's threads).

:func:`sticky` keeps the previous placement while it is still feasible and not much worse
than the planner's best (a move is a cold start on the new pod, so demand that wobbles
between two readings must not move models back and forth).

Pure: no torch, no Kubernetes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packrat.plan.pool.placement import ModelDemand, Placement, PodCapacity, load_of

__all__ = [
    "MAX_RATE",
    "MIN_INTERVAL_S",
    "STICKY_SLACK",
    "RateReading",
    "next_rate",
    "service_seconds",
    "sticky",
]

MAX_RATE = 100_000.0
"""Requests per second beyond which a reading is no evidence (capped there)."""
MIN_INTERVAL_S = 5.0
"""Readings closer than this keep the previous baseline and rate."""
MAX_COUNTER = 1 << 62
STICKY_SLACK = 1.25
"""The previous placement is kept while its busiest pod is within this factor of the best."""


@dataclass(frozen=True, slots=True)
class RateReading:
    """A baseline: the pod, its request counter for the model, when it was read (seconds,
    any epoch shared by the readings), and the rate measured up to it."""

    pod: str
    requests: int
    at: float
    rate: float = 0.0


def _valid(r: RateReading | None) -> bool:
    if r is None:
        return False
    counter_ok = isinstance(r.requests, int) and 0 <= r.requests < MAX_COUNTER
    return counter_ok and math.isfinite(r.at) and 0 <= r.rate <= MAX_RATE


def next_rate(
    previous: RateReading | None, *, pod: str, requests: int, at: float
) -> RateReading | None:
    """The baseline after a new reading (``requests`` of ``pod`` at ``at``), with the rate
    since ``previous``; see the module's docstring for the rules on hostile readings (an
    unusable reading leaves ``previous`` as it was; None: no baseline yet)."""
    ok = isinstance(requests, int) and not isinstance(requests, bool)
    if not (ok and 0 <= requests < MAX_COUNTER and math.isfinite(at)):
        return previous if _valid(previous) else None
    fresh = RateReading(pod, requests, at)
    if previous is None or not _valid(previous) or previous.pod != pod:
        return fresh
    elapsed = at - previous.at
    if elapsed < 0 or requests < previous.requests:
        return fresh  # time or the counter went backwards: a new baseline
    if elapsed < MIN_INTERVAL_S:
        return previous
    rate = min((requests - previous.requests) / elapsed, MAX_RATE)
    return RateReading(pod, requests, at, rate)


def service_seconds(threads: int, batch1_latency_ms: float | None) -> float:
    """Core-seconds one request takes on ``threads`` (0 when not profiled yet)."""
    if batch1_latency_ms is None or not (math.isfinite(batch1_latency_ms) and threads >= 1):
        return 0.0
    return threads * max(0.0, batch1_latency_ms) / 1000.0


def sticky(
    best: Placement,
    previous: Mapping[str, str],
    models: Sequence[ModelDemand],
    pods: Sequence[PodCapacity],
    *,
    max_utilisation: float = 0.8,
    slack: float = STICKY_SLACK,
) -> Placement:
    """``previous`` when every model has a pod there that still exists, it places as many
    models as ``best``, it is feasible (each model's weights within its pod's budget, each
    pod's demand within ``max_utilisation`` of its cores) and its busiest pod is within
    ``slack`` of ``best``'s; else ``best``."""
    names = {p.name: p for p in pods}
    kept = {m.name: previous.get(m.name) for m in models}
    if any(pod not in names for pod in kept.values()) or len(kept) < len(best.assignment):
        return best
    assignment = {n: str(p) for n, p in kept.items()}
    for pod in pods:
        mine = [m for m in models if assignment[m.name] == pod.name]
        if any(m.weight_bytes > pod.budget_bytes for m in mine):
            return best
        if sum(m.cores for m in mine) > max_utilisation * pod.cores + 1e-9:
            return best
    load = load_of(assignment, models, pods)
    if load > best.load * slack + 1e-9:
        return best
    return Placement(assignment=dict(sorted(assignment.items())), load=load, moves=0)
