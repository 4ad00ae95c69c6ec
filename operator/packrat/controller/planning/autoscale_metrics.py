"""The tuner's metrics (``spec.autoscaling`` envelope), on the operator's registry.

Per model: the live envelope's rate per window, the capacity the replicas sustain, the
replica count the tuner wants, and its decisions by action. ``metrics.forget_model`` drops
them with the model's other series.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge

from packrat.controller.core import metrics
from packrat.controller.core.metrics import per_model

ENVELOPE_RATE = per_model(
    Gauge,
    "packrat_tuner_envelope_rate",
    "Tuner: the largest arrival rate (requests/s) seen in any window of this length, over the "
    "last 60 s of the arrivals the ready pods saw.",
    "window_seconds",
)
PLANNED_CAPACITY = per_model(
    Gauge,
    "packrat_tuner_capacity",
    "Tuner: requests/s the wanted replicas sustain at best (replicas x one replica's capacity).",
)
WANTED_REPLICAS = per_model(
    Gauge,
    "packrat_tuner_replicas",
    "Tuner: the replica count it decided on (status.autoscaling.replicas).",
)
TUNER_DECISIONS = per_model(
    Counter,
    "packrat_tuner_decisions",
    "Tuner decisions by action (scale_up, scale_down, hold).",
    "action",
)


def publish(namespace: str, model: str, decision: Mapping[str, Any]) -> None:
    """Record one pass's tuner decision (``Result.autoscale``)."""
    for window, rate in (decision.get("rates") or {}).items():
        metrics._gauge(ENVELOPE_RATE, namespace, model, f"{float(window):g}").set(float(rate))
    metrics._gauge(PLANNED_CAPACITY, namespace, model).set(float(decision["capacity"]))
    metrics._gauge(WANTED_REPLICAS, namespace, model).set(int(decision["replicas"]))
    metrics._counter(TUNER_DECISIONS, namespace, model, str(decision["action"])).inc()
