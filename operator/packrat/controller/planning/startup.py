"""How long a new replica of this model takes to serve: measured from its own pods.

The tuner keeps headroom for the time between asking for a replica and its serving
(:class:`packrat.plan.envelope.Tuner`'s ``startup_s``). That time is the model's: image
pull, weights, TorchServe's JVM, the plan's workers; so it is read from the model's pods, as
the time from a pod's creation to its ``Ready`` condition, the slowest of the most recent
``RECENT`` pods that became ready (a conservative reading: the next start may well be as
slow). A node scale-up is invisible there while the cluster has room, so
``spec.autoscaling.startupFloorSeconds`` sets a floor (say 120 s where a node must be added
for most scale-ups).

Pod fields are input like any other: a timestamp that does not parse, lies in the future or
gives a start-up beyond ``MAX_STARTUP_S`` is ignored, never trusted.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.status import parse_time

RECENT = 10
MAX_STARTUP_S = 3600.0


@dataclass(frozen=True, slots=True)
class Startup:
    """The start-up time the tuner plans with, and where it came from."""

    seconds: float
    measured: float | None
    floor: float
    pods: int  # how many pods the measurement rests on

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": round(self.seconds, 3), "floorSeconds": self.floor}
        if self.measured is not None:
            out["measuredSeconds"] = round(self.measured, 3)
            out["pods"] = self.pods
        return out


def pod_startup(pod: Mapping[str, Any]) -> tuple[float, float] | None:
    """``(ready time, seconds from creation to Ready)`` of a pod whose Ready condition is
    True, or None (not ready, or fields missing or implausible)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if not isinstance(meta, Mapping) or not isinstance(status, Mapping):
        return None
    created = _time(meta.get("creationTimestamp"))
    ready = next(
        (
            c
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        ),
        None,
    )
    when = _time(ready.get("lastTransitionTime")) if ready is not None else None
    if created is None or when is None:
        return None
    seconds = (when - created).total_seconds()
    if not 0.0 <= seconds <= MAX_STARTUP_S:
        return None
    return when.timestamp(), seconds


def _time(value: Any) -> datetime.datetime | None:
    return parse_time(value) if isinstance(value, str) else None


def measure(pods: Iterable[Mapping[str, Any]], *, floor_s: float) -> Startup:
    """The slowest start-up of the ``RECENT`` pods that became ready last, at least
    ``floor_s``; the floor alone when no pod has become ready yet."""
    seen = sorted(s for pod in pods if (s := pod_startup(pod)) is not None)[-RECENT:]
    if not seen:
        return Startup(seconds=floor_s, measured=None, floor=floor_s, pods=0)
    measured = max(seconds for _, seconds in seen)
    return Startup(seconds=max(floor_s, measured), measured=measured, floor=floor_s, pods=len(seen))
