"""``status.measured``: the speedup the profiling run measured for the plan being served.

``status.plan.expectedSpeedup`` is the optimizer's expectation, from latencies measured one
instance at a time. The profiling run also measures plans for real, side by side with the
fat instance (:mod:`packrat.bench.verify`, kept in the profile's ``meta.extra.verified``);
this module picks the record that matches the served plan, so ``kubectl get prm`` shows a
measured speedup only where one was measured for exactly that plan (same cores, batch and
instances), and nothing otherwise. The profile arrives through a pod's log: every field is
checked before it reaches status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from packrat.controller.core.plans import layout
from packrat.controller.core.status import ModelStatus
from packrat.plan.profile import VERIFIED_KEY, Profile


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def measured(plan: Mapping[str, Any] | None, profile: Profile | None) -> dict[str, Any] | None:
    """The ``status.measured`` object for the served ``plan`` (status form), or None."""
    if not plan or profile is None:
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
            "batch": int(plan.get("batch") or 0),
            "latencyMs": round(plan_ms, 4),
            "fatLatencyMs": round(fat_ms, 4),
            "source": "profiling run: plan and fat instance interleaved on the profiled cores",
        }
        when = record.get("measuredAt")
        if isinstance(when, str) and len(when) <= 40:
            out["measuredAt"] = when
        return out
    return None


def publish(status: ModelStatus, profile: Profile | None) -> None:
    """Set ``status.measured`` for the served plan, or drop a stale one."""
    status.set_measured(measured(status.get("plan"), profile))
