"""Measured edge fractions fed back to the pipeline planner (issue 27 item 5).

Each pass with a router reading (:class:`packrat.controller.pipeline.latency.Measured`:
the routers' edge and answer counters' increase since the last reading) updates every
edge's estimate (:func:`packrat.plan.pipeline.feedback.update_edge`: validated, only after
enough samples, smoothed, with hysteresis) and keeps it in ``status.edges`` (declared,
measured, samples, the fraction the planner uses), so a restarted operator carries on. The
planner is then given the pipeline with the used fractions; the router keeps drawing the
declared ones (an unconditional edge's measured fraction is its declared one, within noise;
a branch decided by a stage's answer is where the measurement tells the planner something).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from packrat.controller.core.context import PipelinePass as Pass
from packrat.controller.pipeline.latency import Measured
from packrat.controller.pipeline.spec import PipelineObject
from packrat.plan.pipeline.feedback import EdgeEstimate, fractions_used, update_edge

Key = tuple[str, str]


def _number(value: Any, *, lo: float, hi: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if lo <= value <= hi and math.isfinite(value) else None


def stored_estimates(edges: Any) -> dict[Key, EdgeEstimate]:
    """The estimates kept in ``status.edges``; an entry that does not read is dropped."""
    out: dict[Key, EdgeEstimate] = {}
    for entry in edges if isinstance(edges, list) else []:
        if not isinstance(entry, Mapping):
            continue
        smoothed = _number(entry.get("measured"), lo=0.0, hi=1.0)
        weight = _number(entry.get("weight"), lo=0.0, hi=2.0**53)
        samples = _number(entry.get("samples"), lo=0.0, hi=2.0**53)
        used = _number(entry.get("used"), lo=0.0, hi=1.0)
        if smoothed is None or weight is None or samples is None:
            continue
        key = (str(entry.get("from")), str(entry.get("to")))
        out[key] = EdgeEstimate(smoothed, weight, int(samples), used)
    return out


def feed_back(p: Pass, pipe: PipelineObject, measured: Measured | None) -> PipelineObject:
    """``status.edges`` updated with this pass's reading, and ``pipe`` with the fractions
    the planner is to use (the declared ones until an edge has enough samples)."""
    estimates = stored_estimates(p.status.get("edges"))
    counts = measured.edges if measured is not None else None
    for edge in pipe.edges:
        key = (edge.src, edge.dst)
        if counts is not None and edge.src in counts.answered:
            updated = update_edge(
                estimates.get(key),
                taken=counts.taken.get(key, 0.0),
                answered=counts.answered[edge.src],
            )
            if updated is not None:
                estimates[key] = updated
    declared = {(e.src, e.dst): e.fraction for e in pipe.edges}
    used = fractions_used(declared, estimates)
    entries = []
    for edge in pipe.edges:
        key = (edge.src, edge.dst)
        entry: dict[str, Any] = {"from": edge.src, "to": edge.dst, "declared": edge.fraction}
        est = estimates.get(key)
        if est is not None:
            entry.update(
                measured=round(est.smoothed, 4), weight=round(est.weight, 3), samples=est.samples
            )
            if est.used is not None:
                entry["used"] = est.used
        entries.append(entry)
    p.status.set_edges(entries or None)
    if all(used[k] == v for k, v in declared.items()):
        return pipe
    return replace(pipe, edges=tuple(replace(e, fraction=used[(e.src, e.dst)]) for e in pipe.edges))
