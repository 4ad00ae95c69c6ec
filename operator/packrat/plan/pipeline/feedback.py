"""Measured scale factors fed back to the pipeline planner, and the ingress scaling rule.

The router counts, per edge, the queries that took it and, per stage, the answers that came
back (:mod:`packrat.serve.router`); their ratio is the edge's measured fraction, the share of
the queries reaching its source that go on along it. The planner simulates the DAG with each
edge's fraction, declared in the spec. Here the declared fraction is replaced by the measured
one, carefully, because the counts are input (a router's answer) and every change of a
fraction plans the pipeline again:

- **validated**: counts that are not finite, negative, or with more queries taking an edge
  than its source answered are no evidence (the round is skipped);
- **enough samples**: nothing replaces the declared fraction before ``min_samples`` answers
  of the edge's source have been counted;
- **smoothed**: each round's fraction enters an exponentially weighted average, weighted by
  the answers it counted (``half_life`` answers halve the weight of older ones), so a short
  burst moves it little and a sustained change moves it all the way;
- **bounded, with hysteresis**: the fraction the planner uses moves (rounded to ``step``)
  only when the smoothed one has left it by more than ``min_change``, so noise around a
  value never plans the pipeline again, and a real change does once.

InferLine tunes every stage from the pipeline's ingress: the demand a stage sees is the
ingress rate times its scale factor (:func:`stage_demand`), available as soon as the ingress
changes, where the stage's own arrivals show it only after the queries have passed the
stages before it. :func:`scale_factors` computes the factors from the fractions (each
edge's draw independent, as the router and the simulation make it).

Pure: no clock, no I/O; the caller keeps the state between rounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Key = tuple[str, str]

MIN_SAMPLES = 200
HALF_LIFE = 1000.0
MIN_CHANGE = 0.05
STEP = 0.01


@dataclass(frozen=True, slots=True)
class EdgeEstimate:
    """One edge's measured fraction: the smoothed value, the (decayed) weight behind it,
    the source answers counted in all, and the fraction the planner uses (None: the
    declared one still)."""

    smoothed: float
    weight: float
    samples: int
    used: float | None = None


@dataclass(frozen=True, slots=True)
class FeedbackPolicy:
    min_samples: int = MIN_SAMPLES
    half_life: float = HALF_LIFE
    min_change: float = MIN_CHANGE
    step: float = STEP

    def __post_init__(self) -> None:
        if self.min_samples < 1 or not (math.isfinite(self.half_life) and self.half_life > 0):
            raise ValueError("min_samples must be >= 1 and half_life a positive number")
        if not (0 <= self.min_change < 1 and 0 < self.step <= 1):
            raise ValueError("need 0 <= min_change < 1 and 0 < step <= 1")


def _valid(taken: float, answered: float) -> bool:
    return (
        math.isfinite(taken)
        and math.isfinite(answered)
        and 0 <= taken <= answered
        and answered < 2**53
    )


def update_edge(
    previous: EdgeEstimate | None,
    *,
    taken: float,
    answered: float,
    policy: FeedbackPolicy = FeedbackPolicy(),
) -> EdgeEstimate | None:
    """The edge's estimate after a round in which its source answered ``answered`` queries
    and ``taken`` of them took the edge (increases since the last round)."""
    if not _valid(taken, answered) or answered == 0:
        return previous
    fraction = taken / answered
    if previous is None:
        smoothed, weight, samples = fraction, answered, int(answered)
    else:
        kept = previous.weight * 0.5 ** (answered / policy.half_life)
        weight = kept + answered
        smoothed = (previous.smoothed * kept + fraction * answered) / weight
        samples = previous.samples + int(answered)
    smoothed = min(1.0, max(0.0, smoothed))
    used = previous.used if previous is not None else None
    if samples >= policy.min_samples:
        rounded = min(1.0, max(0.0, round(smoothed / policy.step) * policy.step))
        if used is None or abs(smoothed - used) > policy.min_change:
            used = round(rounded, 6)
    return EdgeEstimate(smoothed=smoothed, weight=weight, samples=samples, used=used)


def fractions_used(
    declared: Mapping[Key, float], estimates: Mapping[Key, EdgeEstimate]
) -> dict[Key, float]:
    """Each edge's fraction for the planner: the measured one once it has enough samples,
    else the declared one."""
    out = {}
    for key, value in declared.items():
        est = estimates.get(key)
        out[key] = est.used if est is not None and est.used is not None else value
    return out


def scale_factors(order: Sequence[str], edges: Mapping[Key, float]) -> dict[str, float]:
    """Each stage's scale factor, the share of the ingress that visits it: 1 at a root; else
    the chance that some parent edge carries the query on, each drawn independently:
    ``1 - prod(1 - s(parent) * fraction)`` (exact on a tree; on a diamond the parents'
    visits are correlated and the simulation is exact where this is an approximation).
    ``order`` is topological."""
    parents: dict[str, list[tuple[str, float]]] = {name: [] for name in order}
    for (src, dst), fraction in edges.items():
        parents[dst].append((src, fraction))
    out: dict[str, float] = {}
    for name in order:
        ins = parents[name]
        if not ins:
            out[name] = 1.0
            continue
        miss = 1.0
        for src, fraction in ins:
            miss *= 1.0 - out[src] * min(1.0, max(0.0, fraction))
        out[name] = 1.0 - miss
    return out


def stage_demand(ingress_rate: float, scale_factor: float) -> float:
    """The rate a stage should be provisioned for now: the pipeline's ingress times the
    stage's scale factor (0 for anything not finite or negative)."""
    if not (math.isfinite(ingress_rate) and math.isfinite(scale_factor)):
        return 0.0
    return max(0.0, ingress_rate) * min(1.0, max(0.0, scale_factor))


def thin(times: Sequence[float], scale_factor: float, phase: float = 0.0) -> list[float]:
    """The share ``scale_factor`` of ``times``, evenly spread (deterministic): the ingress a
    stage's tuner reads as its own demand. Arrival ``i`` is kept when ``phase + (i + 1) s``
    passes an integer, so ``n`` arrivals keep ``floor(phase + n s)`` of them; ``phase`` is
    what the reads before left over (:func:`thin_phase`), so that many small reads keep
    their share too (each thinned alone to ``floor(n s)``, reads of 5 at 0.1 kept none)."""
    s = min(1.0, max(0.0, scale_factor)) if math.isfinite(scale_factor) else 0.0
    p = phase if math.isfinite(phase) and 0.0 <= phase < 1.0 else 0.0
    return [t for i, t in enumerate(times) if math.floor(p + (i + 1) * s) > math.floor(p + i * s)]


def thin_phase(n: int, scale_factor: float, phase: float = 0.0) -> float:
    """The phase :func:`thin` leaves after ``n`` arrivals: the next read's ``phase``."""
    s = min(1.0, max(0.0, scale_factor)) if math.isfinite(scale_factor) else 0.0
    p = phase if math.isfinite(phase) and 0.0 <= phase < 1.0 else 0.0
    return (p + n * s) % 1.0
