"""autoBatch in a pass: the batch size to plan for, and recording the pods' estimate and
the decision (``plan.reconfig``); a new target is switched to by the next pass.

With ``spec.slo`` too (issue 27 item 4), the planner's batch is where the plan starts and the
batch then follows the load upwards within ``autoBatch``'s range (:func:`slo_batch`), on the
replica size the planner chose, while the tuner sets the replicas. The planner's batch is the
floor (:func:`slo_floor`): it chose that batch for the SLO's capacity, and a plan that
followed a quiet period's small estimates down met the next step with too little (the DES,
``benchmarks/tuner/joint_step.py``: 0% -> 12% misses). The top is the batch whose plan serves the
most among those expected within the SLO (:func:`slo_top`): a backlog reads as the largest
batch, whose plan can miss the SLO for every query it holds and serve fewer. The tuner is
told each pass what the running plan serves per replica (:func:`plan_capacity`) and counts
on no more than the planned plan serves: a larger batch absorbs a surge while replicas
start, it does not replace them."""

from __future__ import annotations

import datetime
from dataclasses import replace

from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.status import BatchRecord, ModelStatus, now_iso
from packrat.controller.planning import autobatch as ab
from packrat.plan.optimizer import Optimizer, Plan
from packrat.plan.padding import PaddedPlans
from packrat.plan.profile import Profile
from packrat.plan.provision import backlogged_capacity
from packrat.plan.reconfig import (
    Decision,
    FastLook,
    FastVerdict,
    Policy,
    decide,
    fast_due,
    slo_ceiling,
)


def batch_to_plan(model: ModelSpec, status: ModelStatus) -> int:
    """The batch size to plan for: fixed, or the automatic range's target/current/min."""
    auto = model.auto
    if auto is None:
        return model.fixed_batch
    batch = status.batch_target or status.batch_current or auto.min
    return max(auto.min, min(auto.max, int(batch)))


def slo_floor(model: ModelSpec, planned: int) -> int:
    """With an SLO and autoBatch: the smallest batch autoBatch may choose, the planner's
    batch clamped to autoBatch's range."""
    assert model.auto is not None
    return max(model.auto.min, min(model.auto.max, planned))


def slo_top(
    model: ModelSpec, optimizer: Optimizer, profile: Profile, *, floor: int, slo_ms: float
) -> int:
    """With an SLO and autoBatch: the largest batch autoBatch may choose, the one in its range
    whose optimal plan serves the most backlogged among those expected within the SLO
    (:func:`packrat.plan.reconfig.slo_ceiling`), never below ``floor``."""
    assert model.auto is not None
    top = min(model.auto.max, optimizer.max_batch)
    table = profile.table()
    plans = PaddedPlans(optimizer)  # the plans the operator serves (plan/padding.py)

    def capacity(batch: int) -> float:
        return backlogged_capacity(table, plans.plan(batch).expand())

    return slo_ceiling(
        plans.latency, slo_ms=slo_ms, floor=floor, top=max(floor, top), capacity=capacity
    )


def slo_batch(model: ModelSpec, status: ModelStatus, planned: int) -> tuple[int, int]:
    """With an SLO: the batch to plan for and the optimizer's largest batch. Without
    autoBatch the planner's; with it, autoBatch's target or current batch once it has one,
    else the planner's, clamped to autoBatch's range above the planner's (:func:`slo_floor`)."""
    auto = model.auto
    if auto is None:
        return planned, planned
    chosen = status.batch_target or status.batch_current or planned
    batch = max(slo_floor(model, planned), min(auto.max, int(chosen)))
    return batch, max(batch, auto.max)


def plan_capacity(profile: Profile, plan: Plan) -> float | None:
    """Queries per second one replica running ``plan`` serves backlogged; None when the plan
    is not one of the profile's."""
    try:
        return backlogged_capacity(profile.table(), plan.expand())
    except (KeyError, ValueError):
        return None


def observe_batch(
    p: Pass,
    model: ModelSpec,
    *,
    reading: ab.Reading | None,
    optimizer: Optimizer,
    profile: Profile,
    floor: int | None = None,
    ceiling: int | None = None,
) -> None:
    """``floor`` / ``ceiling``: the smallest and largest batch to decide for (with an SLO,
    :func:`slo_floor` and :func:`slo_top`)."""
    status = p.status
    policy = _policy(model, floor=floor, ceiling=ceiling)
    annotations = model.annotations
    seen = status.batch
    pinned, pin_error = ab.parse_pin(annotations)
    trigger = ab.pending_trigger(annotations, seen)
    stamp = now_iso(p.now)
    if reading is not None and reading.combined is not None:
        seen = ab.record_observation(seen, reading=reading, policy=policy, now=stamp)
        p.result.observed_batch = ab.observed(seen)
    elif pinned is None and trigger is None:
        return  # nothing new to decide on
    last_result, last_at = status.last_switch
    if last_result == "Aborted" and _within(p, last_at, policy.min_interval_s):
        pinned = None  # a pinned switch that aborted is retried after minIntervalSeconds
    current_plan = status.served_plan
    if current_plan is None:
        return  # nothing serves yet to decide against
    fast, seen = _fast(
        p, model, seen, reading=reading, policy=policy, current=current_plan.batch, last_at=last_at
    )
    history = ab.observations(seen)
    if fast is not None and fast.fire:  # decide on this one observation, the interval
        policy = replace(policy, sustain=1)  # waived (the gain rule applies)
        history = history[-1:]
    decision = decide(
        policy=policy,
        current_plan=current_plan,
        table=profile.table(),
        optimal_latency=PaddedPlans(optimizer).latency,
        history=history,
        last_switch_at=last_at.timestamp() if last_at else None,
        now=p.now.timestamp(),
        pinned=pinned,
        ignore_interval=trigger is not None or (fast is not None and fast.fire),
    )
    fired = fast is not None and fast.fire
    seen, previous = ab.record_decision(
        seen,
        decision,
        now=stamp,
        trigger=trigger,
        pin_error=pin_error,
        fast_note=f"{fast.reason.value}: {fast.message}" if fast is not None and fired else None,
    )
    status.set_batch(_decided(p, seen, decision, previous=previous, pin_error=pin_error))


def _decided(
    p: Pass, seen: BatchRecord, decision: Decision, *, previous: str | None, pin_error: str | None
) -> BatchRecord:
    """Report ``decision`` (the pass's result, an event) and the record it leaves."""
    p.result.decision = decision.outcome.value
    if decision.switch and decision.target is not None:
        seen = ab.fast_switched(seen, left=decision.current, now=p.now.timestamp())
        p.emit("Normal", "BatchSizeChanged", decision.message)
        # the next pass plans for the new batch and starts the switch: at once, not an
        # estimate interval later (measured: the in-pod switch completed 5 s after the
        # decision, in 0.1 s of its own)
        p.result.again_within(0.0)
    elif previous != decision.outcome.value and pin_error:
        p.emit("Warning", "BadAnnotation", pin_error)
    return seen


def _policy(model: ModelSpec, *, floor: int | None, ceiling: int | None) -> Policy:
    """autoBatch's policy for ``model`` within ``floor`` and ``ceiling``."""
    assert model.auto is not None
    policy = ab.policy_from_spec(model.auto, batch_delay_ms=model.max_batch_delay_ms)
    if floor is not None:
        policy = replace(policy, min_batch=max(policy.min_batch, floor))
    if ceiling is not None:
        policy = replace(policy, max_batch=max(policy.min_batch, min(policy.max_batch, ceiling)))
    return policy


def _within(p: Pass, since: datetime.datetime | None, seconds: float) -> bool:
    """Whether ``since`` is less than ``seconds`` before this pass."""
    return since is not None and (p.now - since).total_seconds() < seconds


def _fast(
    p: Pass,
    model: ModelSpec,
    seen: BatchRecord,
    *,
    reading: ab.Reading | None,
    policy: Policy,
    current: int,
    last_at: datetime.datetime | None,
) -> tuple[FastVerdict | None, BatchRecord]:
    """autoBatch's fast trigger on this pass's reading (None when off or nothing was read),
    and ``status.batchSize`` with its state."""
    assert model.auto is not None
    if reading is None or reading.combined is None or model.auto.sustain_seconds <= 0:
        return None, seen
    fast = ab.fast_policy_from_spec(model.auto)
    verdict, seen = ab.fast_look(
        seen,
        reading=reading,
        fast=fast,
        policy=policy,
        current=current,
        last_switch_at=last_at.timestamp() if last_at else None,
        now=p.now.timestamp(),
    )
    if not verdict.fire:  # a new estimate it cannot act on yet: look again when it can
        look = FastLook(observed=reading.combined, stable_s=reading.stable_s, timeout_fraction=None)
        due = fast_due(
            fast=fast,
            policy=policy,
            current=current,
            look=look,
            state=verdict.state,
            now=p.now.timestamp(),
        )
        if due is not None:
            p.result.again_within(due_delay(due))
    return verdict, seen


FAST_DUE_MARGIN = 0.05
"""Seconds after a new estimate can be acted on that the pass reads it again (the pod's clock
and this one's are not the same: a little late, not a read too early)."""
FAST_DUE_FLOOR = 0.1
"""The shortest delay a due estimate asks for (the pass is not re-run in a tight loop)."""


def due_delay(due_s: float) -> float:
    """The delay until the next pass for an estimate the fast trigger can act on in
    ``due_s`` seconds (:func:`packrat.plan.reconfig.fast_due`)."""
    return max(FAST_DUE_FLOOR, due_s + FAST_DUE_MARGIN)
