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

# -- autoBatch (online reconfiguration) -----------------------------------------------------------
OBSERVED_BATCH = Gauge(
    "packrat_model_observed_batch_size",
    "autoBatch: the serving pods' combined batch-size estimate (mode over ready pods).",
    ["namespace", "model"],
    registry=REGISTRY,
)
DECISIONS = Counter(
    "packrat_operator_autobatch_decisions",
    "autoBatch decisions by outcome (switch, hold_not_sustained, hold_too_soon, "
    "hold_gain_too_small, hold_same, hold_pinned, hold_infeasible, hold_no_data).",
    ["outcome"],
    registry=REGISTRY,
)
SWITCH_SECONDS = Histogram(
    "packrat_operator_switch_duration_seconds",
    "Completed plan switches: seconds from the start to the Service selecting the new slot.",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)


def publish_autobatch(
    *,
    namespace: str,
    model: str,
    observed_batch: int | None,
    decision: str | None,
    switch_seconds: float | None,
) -> None:
    """Record one reconcile pass's autoBatch observation, decision and switch duration."""
    if observed_batch is not None:
        OBSERVED_BATCH.labels(namespace=namespace, model=model).set(observed_batch)
    if decision is not None:
        DECISIONS.labels(outcome=decision).inc()
    if switch_seconds is not None:
        SWITCH_SECONDS.observe(switch_seconds)


def forget_model(namespace: str, model: str) -> None:
    """Drop a deleted model's gauges."""
    for gauge in (EXPECTED_SPEEDUP, EXPECTED_LATENCY, OBSERVED_BATCH):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, model)
