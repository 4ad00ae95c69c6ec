"""autoBatch glue: the serving pods' batch-size estimates in, ``status.batchSize`` out.

The decision rules (sustain, minimum interval, expected gain, clamping, pinning) live in the
pure ``packrat.plan.reconfig``; this module only translates between Kubernetes and those
rules: the ``spec.autoBatch`` policy, the override annotations, the observation history kept
in ``status.batchSize`` (all state lives in status, so a restarted operator carries on), a
cache of optimizers (the DP runs once per profile, cpus and maximum batch), and parsing
the estimate a serving pod reports (``estimates`` reads them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.cache import Lru
from packrat.controller.core.model import AutoBatch
from packrat.controller.core.status import parse_time
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import Profile
from packrat.plan.reconfig import Decision, Observation, Policy, combine_estimates

logger = logging.getLogger(__name__)

PIN_ANNOTATION = "packrat.dev/pin-batch"
"""``"N"``: switch to batch N once (clamped to the autoBatch range), then hold there."""
RECONFIGURE_ANNOTATION = "packrat.dev/reconfigure"
"""Any new value: decide at once, ignoring ``minIntervalSeconds`` (sustain and gain apply)."""
HISTORY_LIMIT = 10
"""Switches kept in ``status.switchHistory``."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One round of estimates: one per ready pod, and where they came from."""

    estimates: tuple[int, ...]
    source: str  # "pods" (each ready pod's /status) or "service" (one pod, via the Service)

    @property
    def combined(self) -> int | None:
        return combine_estimates(self.estimates)


EstimateSource = Callable[[str, str], "Reading | int | Sequence[int] | None"]
"""(namespace, name) -> the serving pods' batch-size estimates."""


def as_reading(value: Reading | int | Sequence[int] | None) -> Reading | None:
    """Normalise what an estimate source returns (a plain int counts as one Service read)."""
    if value is None or isinstance(value, Reading):
        return value
    if isinstance(value, int):
        return Reading((value,), "service")
    return Reading(tuple(int(v) for v in value), "pods")


def policy_from_spec(auto: AutoBatch) -> Policy:
    """The decision policy of a model's ``spec.autoBatch``."""
    return Policy(
        min_batch=auto.min,
        max_batch=auto.max,
        sustain=auto.sustain_observations,
        min_interval_s=auto.min_interval_seconds,
        min_gain=auto.min_gain,
    )


def parse_pin(annotations: Mapping[str, str] | None) -> tuple[int | None, str | None]:
    """The pinned batch from the annotation, or (None, why it is unusable)."""
    raw = (annotations or {}).get(PIN_ANNOTATION)
    if raw is None or not str(raw).strip():
        return None, None
    try:
        value = int(str(raw).strip())
    except ValueError:
        return None, f"annotation {PIN_ANNOTATION}={raw!r} is not an integer; ignored"
    if value < 1:
        return None, f"annotation {PIN_ANNOTATION}={raw!r} must be >= 1; ignored"
    return value, None


def pending_trigger(
    annotations: Mapping[str, str] | None, batch_status: Mapping[str, Any]
) -> str | None:
    """The reconfigure annotation's value when it has not been acted on yet."""
    value = (annotations or {}).get(RECONFIGURE_ANNOTATION)
    if value is None or value == batch_status.get("reconfigureHandled"):
        return None
    return str(value)


def record_observation(
    batch_status: Mapping[str, Any], *, reading: Reading, policy: Policy, now: str
) -> dict[str, Any]:
    """``status.batchSize`` with one more observation: the pods' combined estimate clamped to
    the policy's range (``observed``; the raw per-pod values in ``estimates``), and the last
    ``sustain`` observations (``recent``)."""
    out = dict(batch_status)
    if reading.combined is None:
        return out
    combined = policy.clamp(reading.combined)
    out.pop("streak", None)  # superseded by ``recent``
    recent = [dict(o) for o in out.get("recent") or [] if isinstance(o, Mapping)]
    recent.append({"batch": combined, "time": now})
    out["recent"] = recent[-policy.sustain :]
    out["observed"] = combined
    out["observedAt"] = now
    out["estimates"] = list(reading.estimates)
    out["source"] = reading.source
    return out


def observations(batch_status: Mapping[str, Any]) -> list[Observation]:
    """The stored observation history, oldest first, as the decision rules take it."""
    out = []
    for item in batch_status.get("recent") or []:
        when = parse_time(item.get("time")) if isinstance(item, Mapping) else None
        if when is None or not isinstance(item.get("batch"), int):
            continue
        out.append(Observation(time=when.timestamp(), batch=int(item["batch"])))
    return out


def decision_status(decision: Decision, *, now: str, trigger: str | None) -> dict[str, Any]:
    """``status.batchSize.lastDecision``: what was decided, when and why."""
    out: dict[str, Any] = {
        "time": now,
        "outcome": decision.outcome.value,
        "message": decision.message,
    }
    if decision.target is not None:
        out["target"] = decision.target
    if decision.expected_gain is not None:
        out["expectedGain"] = round(decision.expected_gain, 4)
    if trigger is not None:
        out["trigger"] = f"{RECONFIGURE_ANNOTATION}={trigger}"
    return out


def append_history(
    history: Sequence[Mapping[str, Any]] | None,
    entry: Mapping[str, Any],
    *,
    limit: int = HISTORY_LIMIT,
) -> list[dict[str, Any]]:
    """The bounded switch history with ``entry`` appended (oldest dropped first)."""
    out = [dict(h) for h in history or []]
    out.append(dict(entry))
    return out[-limit:]


class OptimizerCache(Lru[tuple[str, int, int], Optimizer]):
    """Optimizers by (profile digest, cpus, max batch): the DP is solved once per key."""

    def optimizer(self, profile: Profile, *, digest: str, cpus: int, max_batch: int) -> Optimizer:
        return self.get_or_make(
            (digest, cpus, max_batch),
            lambda: Optimizer.for_profile(profile, cpus=cpus, max_batch=max_batch),
        )


# -- reading the estimates (I/O) ---------------------------------------------------------------
MAX_ESTIMATE = 1 << 16
"""The largest batch-size estimate taken from a pod (queue depths beyond are not batches)."""


def parse_estimate(doc: Any) -> int | None:
    """The batch-size estimate in a serving pod's ``/status`` document, validated like user
    input: an integer (or an integral number) in 1..``MAX_ESTIMATE``, else None."""
    section = doc.get("batch_size_estimate") if isinstance(doc, Mapping) else None
    value = section.get("estimate") if isinstance(section, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (value.is_integer() and abs(value) <= MAX_ESTIMATE):
        return None
    number = int(value)
    return number if 1 <= number <= MAX_ESTIMATE else None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, not terminating, Ready condition True, with an IP."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
