"""The operator's own Prometheus metrics (base units), served on ``--metrics-port``."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "packrat_operator_reconciles",
    "Reconcile passes by result.",
    ["result"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "packrat_operator_reconcile_errors",
    "Reconcile passes that raised, by exception type.",
    ["error"],
    registry=REGISTRY,
)
PROFILING_SECONDS = Histogram(
    "packrat_operator_profiling_duration_seconds",
    "Wall time of successful profiling Jobs.",
    buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
    registry=REGISTRY,
)
SWITCHES = Counter(
    "packrat_operator_switches",
    "Active-passive slot switches by result.",
    ["result"],
    registry=REGISTRY,
)
EXPECTED_SPEEDUP = Gauge(
    "packrat_model_expected_speedup",
    "Expected speedup of the active plan over one fat instance.",
    ["namespace", "model"],
    registry=REGISTRY,
)
EXPECTED_LATENCY = Gauge(
    "packrat_model_expected_latency_seconds",
    "Expected batch latency of the active plan.",
    ["namespace", "model"],
    registry=REGISTRY,
)


def forget_model(namespace: str, model: str) -> None:
    """Drop a deleted model's gauges."""
    for gauge in (EXPECTED_SPEEDUP, EXPECTED_LATENCY):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, model)
