"""The plan between the optimizer and the pod, in one place.

Inside the operator a plan is the optimizer's :class:`~packrat.plan.optimizer.Plan`, from the
optimizer to the two edges where it leaves as data, each converted here once:

- the **status** edge: ``status.plan`` (and a switch's plan) hold it in camelCase, what
  ``kubectl get`` prints (:func:`to_status`), and a pass reads the served plan back from there
  (:func:`from_status`; anything that is not a valid plan is none);
- the **pod** edge: the slot's plan ConfigMap and the in-pod switch's ``POST /admin/plan``
  carry the JSON ``packrat serve --plan-env`` reads (:func:`to_pod`).

All three keep every field a pod needs; the estimates (latencies, speedup) ride along for
``kubectl`` and the metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.plan.optimizer import Plan, PlanError

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
    ("capacity", "capacity"),  # > batch for a padded plan (plan/padding.py)
)


def to_pod(plan: Plan) -> dict[str, Any]:
    """The plan as the serving pod reads it (``packrat serve --plan-env``, ``/admin/plan``);
    its engine only when not eager (so eager plans keep their old form and hashes)."""
    data = plan.to_dict()
    out = {snake: data.get(snake) for snake, _ in _FIELDS}
    if "engine" in data:
        out["engine"] = data["engine"]
    out["instances"] = [dict(g) for g in data["instances"]]
    return out


def to_status(plan: Plan) -> dict[str, Any]:
    """The plan as shown in ``status.plan``."""
    data = to_pod(plan)
    out = {camel: data[snake] for snake, camel in _FIELDS}
    if "engine" in data:
        out["engine"] = data["engine"]
    return out


def from_status(doc: Any) -> Plan | None:
    """The plan a status holds (``to_status``'s form), or None when it holds none."""
    if not isinstance(doc, Mapping):
        return None
    try:
        fields = {snake: doc.get(camel) for snake, camel in _FIELDS}
        if "engine" in doc:
            fields["engine"] = doc["engine"]
        return Plan.from_dict(fields)
    except PlanError:
        return None


def layout(plan: Plan | Mapping[str, Any]) -> tuple[object, ...]:
    """What a plan makes the pods do (cores, batch, instance groups, engine), without the estimates
    (of a plan, or of one in its pod or status form)."""
    if isinstance(plan, Plan):
        groups = sorted((g.threads, g.batch, g.count) for g in plan.instances)
        return (plan.cpus, plan.batch, tuple(groups), *_engine(plan.engine))
    groups = sorted(
        (int(g.get("threads", 0)), int(g.get("batch", 0)), int(g.get("count", 0)))
        for g in plan.get("instances") or []
    )
    return (plan.get("cpus"), plan.get("batch"), tuple(groups), *_engine(plan.get("engine")))


def _engine(engine: Any) -> tuple[object, ...]:
    """An engine other than eager is part of the layout; eager adds nothing (so the layouts,
    and the slot hashes made from them, of eager plans are what they were)."""
    return () if engine in (None, "eager") else (engine,)


def keep_served(served: Plan | None, new: Plan) -> Plan:
    """``new``, or the served plan when both lay the pods out alike: a re-profile that only
    moves the latency estimates must not switch slots (the pods would run the same)."""
    if served is not None and layout(served) == layout(new):
        return served
    return new
