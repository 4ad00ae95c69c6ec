"""A thread grid for big nodes: coarse first, then refined around the optimizer's candidates.

Profiling every t in 1..T costs T x |batches| points: hours on a 64-core node. The optimizer
only ever uses a handful of thread counts, and L(t, b) is smooth in t, so Packrat profiles
a coarse grid (powers of two, and T), plans every profiled batch with it, and then measures
the midpoints between each thread count the plans chose and its measured neighbours, where
a better plan can hide (a second round halves those gaps again). Pure: tables in, thread
counts and errors out.

:func:`grid_error` states the procedure's error where a full grid is known (the paper's
16-core profiles; ``docs/measurements.md``): the optimal plan latency with the full grid
against the one with the coarse or refined grid, per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from packrat.plan.optimizer import Optimizer, PlanError

__all__ = ["FULL_GRID_UP_TO", "coarse_threads", "grid_error", "refine_threads", "sub_table"]

Table = Mapping[tuple[int, int], float]

# Up to this many cores the full grid 1..T is cheap enough: "auto" profiles all of it.
FULL_GRID_UP_TO = 8


def coarse_threads(cpus: int) -> list[int]:
    """Powers of two up to T, and T itself."""
    if cpus < 1:
        raise ValueError(f"cpus must be >= 1, got {cpus}")
    out = {cpus}
    t = 1
    while t <= cpus:
        out.add(t)
        t *= 2
    return sorted(out)


def sub_table(table: Table, threads: Iterable[int]) -> dict[tuple[int, int], float]:
    keep = set(threads)
    return {k: v for k, v in table.items() if k[0] in keep}


def _chosen_threads(table: Table, cpus: int, batches: Sequence[int]) -> set[int]:
    """Every thread count some optimal plan for ``batches`` uses."""
    if not table or not batches:
        return set()
    try:
        optimizer = Optimizer(table, cpus=cpus, max_batch=max(batches), alternatives=False)
    except PlanError:
        return set()
    used: set[int] = set()
    for b in batches:
        if optimizer.feasible(b):
            used.update(g.threads for g in optimizer.plan(b).instances)
    return used


def refine_threads(table: Table, *, cpus: int, batches: Sequence[int]) -> list[int]:
    """Thread counts to measure next, around those the plans for ``batches`` chose on the
    grid measured so far (``table``); empty when there is nothing new to try."""
    measured = sorted({t for t, _ in table})
    wanted: set[int] = set()
    for t in _chosen_threads(table, cpus, batches):
        lower = max((m for m in measured if m < t), default=0)
        upper = min((m for m in measured if m > t), default=cpus + 1)
        wanted.update({(lower + t + 1) // 2, (t + upper) // 2})
    return sorted(w for w in wanted if 1 <= w <= cpus and w not in measured)


def grid_error(
    table: Table, threads: Iterable[int], *, cpus: int, batches: Sequence[int]
) -> dict[int, float]:
    """Per batch: the optimal plan latency using only ``threads`` over the one using every
    thread count in ``table``, minus 1 (0.0: the subset loses nothing; inf: infeasible)."""
    full = Optimizer(table, cpus=cpus, max_batch=max(batches), alternatives=False)
    part_table = sub_table(table, threads)
    part = (
        Optimizer(part_table, cpus=cpus, max_batch=max(batches), alternatives=False)
        if part_table
        else None
    )
    out: dict[int, float] = {}
    for b in batches:
        if not full.feasible(b):
            continue
        best = full.latency(b)
        got = part.latency(b) if part is not None and part.feasible(b) else float("inf")
        out[b] = got / best - 1.0
    return out
