"""Online batch-size reconfiguration for ``spec.autoBatch``: when to re-plan, as a pure function.

The serving pods estimate the batch size their load forms (Packrat's estimator, exported on
``/status``). The operator re-plans for a new batch size only when the estimate is stable
(``sustainObservations`` equal readings), the last switch is old enough
(``minIntervalSeconds``) and the new plan is expected to be meaningfully faster (``minGain``):
a switch costs a second set of warm pods, so it must pay for itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any


def clamp(estimate: int, *, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(estimate)))


def effective_latency(plan_latency_ms: float, *, plan_batch: int, load_batch: int) -> float:
    """Latency of a plan made for ``plan_batch`` when the load forms batches of ``load_batch``.

    Larger batches need ``ceil(load / plan)`` rounds; smaller ones still wait for instances
    sized for the plan's batch (approximated by the full batch latency).
    """
    rounds = max(1, math.ceil(load_batch / plan_batch))
    return plan_latency_ms * rounds


def expected_gain(
    *, current_batch: int, current_latency_ms: float, new_batch: int, new_latency_ms: float
) -> float:
    """Relative latency gain of re-planning for ``new_batch`` under a load of that batch."""
    before = effective_latency(current_latency_ms, plan_batch=current_batch, load_batch=new_batch)
    if before <= 0:
        return 0.0
    return 1.0 - new_latency_ms / before


def observe(
    batch_status: Mapping[str, Any], *, estimate: int, auto: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """``status.batchSize`` after one reading: the clamped estimate and how long it held."""
    value = clamp(estimate, lo=int(auto["min"]), hi=int(auto["max"]))
    out = dict(batch_status)
    streak = int(out.get("streak") or 0)
    out["streak"] = streak + 1 if out.get("observed") == value else 1
    out["observed"] = value
    out["observedAt"] = now
    return out


def decide(
    *,
    batch_status: Mapping[str, Any],
    auto: Mapping[str, Any],
    seconds_since_switch: float | None,
    latency: Callable[[int], float | None],
) -> int | None:
    """The batch size to switch to, or None to keep the current plan."""
    current = batch_status.get("current")
    observed = batch_status.get("observed")
    if current is None or observed is None or observed == current:
        return None
    if int(batch_status.get("streak") or 0) < int(auto["sustainObservations"]):
        return None
    if seconds_since_switch is not None and seconds_since_switch < float(
        auto["minIntervalSeconds"]
    ):
        return None
    current_latency = latency(int(current))
    new_latency = latency(int(observed))
    if current_latency is None or new_latency is None:
        return None
    gain = expected_gain(
        current_batch=int(current),
        current_latency_ms=current_latency,
        new_batch=int(observed),
        new_latency_ms=new_latency,
    )
    return int(observed) if gain >= float(auto["minGain"]) else None
