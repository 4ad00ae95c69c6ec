"""Monotone plans: a batch of B may run on the plan for a larger batch B' (slots left idle).

The optimizer answers "the best multiset of instances whose batches sum to *exactly* B". With
batches profiled at powers of two, an odd B has to be cut into awkward pieces, and on the
paper's ResNet-50 profile 8 of 128 batch sizes got a plan up to 1.86x slower than the next
size up (B=63: 353.7 ms, B=64: 220.9 ms). Nothing forces the instances' batches to sum to B:
a plan whose batches sum to B' >= B serves a batch of B with B' - B slots left empty, and an
instance given fewer requests than its batch runs a smaller batch, which is no slower.

So the plan for B is the optimizer's plan for the B' in [B, horizon] with the lowest expected
latency; among equal latencies the smallest B' (no padding when padding does not help). The
expected latency is then a suffix minimum of the optimizer's, hence non-decreasing in B.

A pure post-pass over :class:`~packrat.plan.optimizer.Optimizer`'s answers: its DP and its
signatures are untouched, and the horizon is the optimizer's own ``max_batch`` (the caller
builds it with :func:`padding_horizon` to leave room above the batches it will ask for).
A padded plan keeps ``batch = B``; its instances' batches sum to its ``capacity`` B'.
"""

from __future__ import annotations

from dataclasses import replace

from packrat.plan.optimizer import (
    MAX_PLAN_BATCH,
    Alternative,
    InstanceGroup,
    Optimizer,
    Plan,
    PlanError,
)

__all__ = ["PaddedPlans", "padded_plan", "padding_horizon"]


def padding_horizon(max_batch: int) -> int:
    """The largest batch the optimizer should solve for when batches up to ``max_batch`` are
    to be planned with padding: twice as far (with batches profiled at powers of two, the
    next profiled batch above any B is below 2B), and never past a plan's largest batch."""
    return max(max_batch, min(2 * max_batch, MAX_PLAN_BATCH))


class PaddedPlans:
    """The monotone plans of one optimizer: ``plan(B)`` is the best plan for any B' >= B
    that the optimizer solved. Precomputed in one backward pass (a suffix minimum)."""

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self._target: dict[int, int] = {}
        best: int | None = None
        for b in range(optimizer.max_batch, 0, -1):
            if optimizer.feasible(b) and (
                best is None or optimizer.latency(b) <= optimizer.latency(best)
            ):
                best = b  # ties go to the smaller B' (less padding)
            if best is not None:
                self._target[b] = best

    def feasible(self, batch: int) -> bool:
        return batch in self._target

    def target(self, batch: int) -> int:
        """The batch B' >= ``batch`` whose plan serves ``batch``."""
        if batch not in self._target:
            self.optimizer.latency(batch)  # its PlanError says why (bad, too large, no plan)
            raise PlanError(f"no plan for batch {batch}")  # pragma: no cover (feasible => target)
        return self._target[batch]

    def latency(self, batch: int) -> float:
        return self.optimizer.latency(self.target(batch))

    def plan(self, batch: int) -> Plan:
        """The plan for ``batch``: the optimizer's own when no larger batch is faster, else
        the faster one's instances with ``batch`` set to ``batch`` (its capacity is B')."""
        target = self.target(batch)
        exact = self.optimizer.plan(batch) if self.optimizer.feasible(batch) else None
        if target == batch and exact is not None:
            return exact
        padded = self.optimizer.plan(target)
        fat = self.optimizer.table.get((self.optimizer.cpus, batch))
        source = exact if exact is not None else padded
        alternatives = tuple(
            Alternative("fat", (InstanceGroup(self.optimizer.cpus, batch, 1, fat),), fat)
            if a.name == "fat"
            else a
            for a in source.alternatives
        )
        return replace(padded, batch=batch, fat_latency_ms=fat, alternatives=alternatives)


def padded_plan(optimizer: Optimizer, batch: int) -> Plan:
    """The monotone plan for ``batch`` (see :class:`PaddedPlans`); for one question."""
    return PaddedPlans(optimizer).plan(batch)
