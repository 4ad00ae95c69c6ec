"""Search pieces shared by the single-model and the pipeline planners.

:func:`fewest_feasible` is the replica-count search of both
(:meth:`packrat.plan.provision.Planner.fewest_replicas`,
:meth:`packrat.plan.pipeline.search.PipelinePlanner.fewest_replicas`); :func:`cheapest` is
both exhaustive references; :func:`finite` is how both write a P99 into JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar


class _Feasible(Protocol):
    @property
    def feasible(self) -> bool: ...


class _Measured(_Feasible, Protocol):
    @property
    def p99_ms(self) -> float: ...


E = TypeVar("E", bound=_Feasible)
M = TypeVar("M", bound=_Measured)
C = TypeVar("C")


def cheapest(candidates: Iterable[tuple[int, C]], evaluate: Callable[[C], M]) -> M | None:
    """The feasible candidate of least cost (ties: lower P99, then the earlier candidate), or
    None; ``candidates`` are (cost, candidate) pairs.

    Evaluated in order of cost, one cost at a time: past the first cost with a feasible
    candidate nothing can be cheaper, so the rest is never evaluated (the same answer as
    evaluating every candidate)."""
    by_cost: dict[int, list[C]] = {}
    for cost, candidate in candidates:
        by_cost.setdefault(cost, []).append(candidate)
    for cost in sorted(by_cost):
        best: M | None = None
        for candidate in by_cost[cost]:
            ev = evaluate(candidate)
            if ev.feasible and (best is None or ev.p99_ms < best.p99_ms):
                best = ev
        if best is not None:
            return best
    return None


def fewest_feasible(lo: int, limit: int, evaluate: Callable[[int], E]) -> E | None:
    """The evaluation of the smallest ``n`` in ``(lo, limit]`` that is feasible, or None.

    ``lo`` is known infeasible (or 0), and feasibility is assumed monotone in ``n`` (more
    replicas do not raise P99): gallop up from ``lo + 1`` in doubling steps, then bisect.
    """
    found: E | None = None
    step, hi = 1, lo + 1
    while hi <= limit:
        ev = evaluate(hi)
        if ev.feasible:
            found = ev
            break
        lo, step = hi, step * 2
        hi = min(lo + step, limit) if lo < limit else limit + 1
    if found is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ev = evaluate(mid)
        if ev.feasible:
            hi, found = mid, ev
        else:
            lo = mid
    return found


def finite(value: float) -> float | None:
    """``value``, or None for inf/NaN (JSON has no infinity)."""
    return value if math.isfinite(value) else None
