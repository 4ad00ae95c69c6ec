"""``status.measured``: the speedup the profiling run measured for the plan being served.

``status.plan.expectedSpeedup`` is the optimizer's expectation, from latencies measured one
instance at a time. The profiling run also measures plans for real, side by side with the
fat instance (:mod:`packrat.bench.verify`, kept in the profile's ``meta.extra.verified``);
this module picks the record that matches the served plan, so ``kubectl get prm`` shows a
measured speedup only where one was measured for exactly that plan (same cores, batch and
instances), and nothing otherwise. The profile arrives through a pod's log: every field is
checked before it reaches status.

The served plan never loses to fat: when the verification measured the optimizer's plan
slower than the fat instance beyond noise (:data:`NOISE`), :func:`guard` serves the fat
instance instead, says so in the ``PlanVerified`` condition and a ``PlanSlowerThanFat``
event, and :func:`publish` keeps the refused plan's measured speedup in ``status.measured``
(the Measured column), naming the plan that was refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.plans import layout
from packrat.controller.core.status import ModelStatus, get_condition
from packrat.plan.baselines import FAT, baseline_plan
from packrat.plan.engines import fastest_per_pair
from packrat.plan.optimizer import Plan
from packrat.plan.profile import VERIFIED_KEY, Profile

# A plan whose measured median is more than this much slower than the fat instance's loses.
NOISE = 0.05
CONDITION = "PlanVerified"


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def measured(plan: Plan | None, profile: Profile | None) -> dict[str, Any] | None:
    """The ``status.measured`` object for the served ``plan``, or None."""
    if plan is None or profile is None:
        return None
    record = profile.meta.extra.get(VERIFIED_KEY)
    if not isinstance(record, Mapping) or not isinstance(record.get("results"), list):
        return None
    for entry in record["results"]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("plan"), Mapping):
            continue
        try:
            same = layout(entry["plan"]) == layout(plan)
        except (AttributeError, TypeError, ValueError):
            continue
        speedup = _positive(entry.get("speedup"))
        plan_ms, fat_ms = _positive(entry.get("planMs")), _positive(entry.get("fatMs"))
        if not same or speedup is None or plan_ms is None or fat_ms is None:
            continue
        out: dict[str, Any] = {
            "speedup": f"{speedup:.2f}x",
            "batch": int(plan.batch or 0),
            "latencyMs": round(plan_ms, 4),
            "fatLatencyMs": round(fat_ms, 4),
            "source": "profiling run: plan and fat instance interleaved on the profiled cores",
        }
        expected = _positive(entry.get("expectedMs"))
        if expected is not None:  # the estimate the measurement corrects
            out["expectedLatencyMs"] = round(expected, 4)
        when = record.get("measuredAt")
        if isinstance(when, str) and len(when) <= 40:
            out["measuredAt"] = when
        return out
    return None


def loses_to_fat(found: Mapping[str, Any], *, noise: float = NOISE) -> bool:
    """A :func:`measured` record whose plan ran slower than fat beyond ``noise``."""
    return float(found["latencyMs"]) > float(found["fatLatencyMs"]) * (1 + noise)


def guard(p: Pass, plan: Plan, profile: Profile) -> tuple[Plan, Plan | None]:
    """The plan to serve and the refused one: ``plan`` itself, or the fat instance when the
    profiling run measured ``plan`` slower than fat beyond noise. Sets the PlanVerified
    condition; a new refusal is also a Warning event."""
    found = measured(plan, profile)
    if found is None:
        p.status.drop_condition(CONDITION)
        return plan, None
    shown = (
        f"plan {plan.label} measured {found['latencyMs']:.4g} ms against the fat instance's "
        f"{found['fatLatencyMs']:.4g} ms ({found['speedup']}) at batch {found['batch']}"
    )
    if not loses_to_fat(found) or _is_fat(plan):
        p.cond(CONDITION, True, "NotSlowerThanFat", shown)
        return plan, None
    fat = fat_plan(profile, cpus=plan.cpus, batch=plan.batch)
    message = f"{shown}: serving the fat instance {fat.label} instead"
    before = get_condition(p.status.get("conditions"), CONDITION) or {}
    if before.get("reason") != "SlowerThanFat" or before.get("message") != message:
        p.emit("Warning", "PlanSlowerThanFat", message)
    p.cond(CONDITION, False, "SlowerThanFat", message)
    return fat, plan


def fat_plan(profile: Profile, *, cpus: int, batch: int) -> Plan:
    """The fat instance to serve: on the engine whose fat instance the profile found fastest
    (the one the plan was verified against)."""
    fastest = fastest_per_pair(profile.tables()).get((cpus, batch))
    engine = fastest[1] if fastest is not None else profile.engines[0]
    table = profile.for_engine(engine).table()
    return replace(baseline_plan(FAT, cpus=cpus, batch=batch, table=table), engine=engine)


def _is_fat(plan: Plan) -> bool:
    return len(plan.instances) == 1 and plan.instances[0].threads == plan.cpus


def publish(status: ModelStatus, profile: Profile | None, *, refused: Plan | None = None) -> None:
    """Set ``status.measured`` for the served plan (or for the ``refused`` plan that lost to
    fat, naming it), or drop a stale one."""
    found = measured(refused if refused is not None else status.served_plan, profile)
    if found is not None and refused is not None:
        found["refusedPlan"] = refused.label
    status.set_measured(found)
