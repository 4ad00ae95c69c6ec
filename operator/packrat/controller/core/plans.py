"""The plan between the optimizer and the pod, in one place.

``status.plan`` holds the plan in camelCase (what ``kubectl get`` prints); the serving pod
reads the optimizer's JSON form (``packrat serve --plan-env``). These two functions are the
only conversions, both lossless for the fields a pod needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.plan.optimizer import Plan

_FIELDS = (
    ("label", "label"),
    ("cpus", "cpus"),
    ("batch", "batch"),
    ("instances", "instances"),
    ("expected_latency_ms", "expectedLatencyMs"),
    ("fat_latency_ms", "fatLatencyMs"),
    ("expected_speedup", "expectedSpeedup"),
    ("num_instances", "numInstances"),
    ("total_threads", "totalThreads"),
)


def status_plan(plan: Plan | Mapping[str, Any]) -> dict[str, Any]:
    """The plan as shown in ``status.plan`` (from the optimizer's plan or its JSON form)."""
    data = plan.to_dict() if isinstance(plan, Plan) else plan
    out = {camel: data.get(snake) for snake, camel in _FIELDS}
    out["instances"] = [dict(g) for g in data.get("instances") or []]
    return out


def wire_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``status.plan`` back in the plan JSON format ``packrat serve --plan-env`` reads."""
    out = {snake: plan.get(camel) for snake, camel in _FIELDS}
    out["instances"] = [dict(g) for g in plan.get("instances") or []]
    return out


def layout(plan: Mapping[str, Any]) -> tuple[object, ...]:
    """What a plan makes the pods do (cores, batch, instance groups), without the estimates."""
    groups = sorted(
        (int(g.get("threads", 0)), int(g.get("batch", 0)), int(g.get("count", 0)))
        for g in plan.get("instances") or []
    )
    return (plan.get("cpus"), plan.get("batch"), tuple(groups))


def keep_served(served: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """``new``, or the served plan when both lay the pods out alike: a re-profile that only
    moves the latency estimates must not switch slots (the pods would run the same)."""
    if served and served.get("instances") and layout(served) == layout(new):
        return dict(served)
    return dict(new)
