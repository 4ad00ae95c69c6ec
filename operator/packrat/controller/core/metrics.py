"""The operator's own Prometheus metrics, served on ``--metrics-port``.

Conventions (docs/metrics.md): base units, counters end in ``_total``, and every series
carries ``namespace`` and ``model`` (the PackratModel's namespace and name), so an alert can
say which model it is about. ``forget_model`` drops every series of a deleted model.
Handlers record through the functions below; the metric objects stay importable for tests.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from packrat.controller.core.status import PHASES

REGISTRY = CollectorRegistry(auto_describe=True)
MODEL = ["namespace", "model"]

_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)


def per_model(
    kind: type[_Metric], name: str, documentation: str, *labels: str, **options: Any
) -> _Metric:
    """A ``kind`` metric on the operator's registry, labelled by the model's ``namespace`` and
    ``model`` and then by ``labels``; ``options`` go to ``kind`` (a Histogram's buckets)."""
    return kind(name, documentation, [*MODEL, *labels], registry=REGISTRY, **options)


RECONCILES = per_model(
    Counter, "packrat_operator_reconciles", "Reconcile passes by result.", "result"
)
ERRORS = per_model(
    Counter,
    "packrat_operator_reconcile_errors",
    "Reconcile passes that raised, by exception type.",
    "error",
)
EVENTS = per_model(
    Counter,
    "packrat_operator_events",
    "Kubernetes Events the operator posted about a model, by type and reason "
    "(ProfilingFailed, SwitchAborted, PlanFailed, ...).",
    "type",
    "reason",
)
PHASE = per_model(
    Gauge,
    "packrat_model_phase",
    "1 for the model's current phase (status.phase), 0 for the others.",
    "phase",
)
PROFILING_SECONDS = per_model(
    Histogram,
    "packrat_operator_profiling_duration_seconds",
    "Wall time of successful profiling Jobs.",
    buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
)
PROFILING_POINTS_DONE = per_model(
    Gauge,
    "packrat_model_profiling_points_done",
    "Profile points (threads, batch) measured so far by the running profiling Job.",
)
PROFILING_POINTS = per_model(
    Gauge,
    "packrat_model_profiling_points",
    "Profile points the running profiling Job measures in all.",
)
PROFILING_ETA = per_model(
    Gauge,
    "packrat_model_profiling_eta_seconds",
    "The profiler's estimate of the seconds left in the running profiling Job.",
)
SWITCHES = per_model(
    Counter,
    "packrat_operator_switches",
    "Active-passive slot switches by result (succeeded, aborted).",
    "result",
)
EXPECTED_SPEEDUP = per_model(
    Gauge,
    "packrat_model_expected_speedup",
    "Expected speedup of the active plan over one fat instance.",
)
EXPECTED_LATENCY = per_model(
    Gauge, "packrat_model_expected_latency_seconds", "Expected batch latency of the active plan."
)
CORES_EXCLUSIVE = per_model(
    Gauge,
    "packrat_cores_exclusive",
    "The CoresExclusive condition as a number: 1 when the isolation check of the model's "
    "profiling pod (on the serving nodes) found an exact, quiet cpuset, 0 when it found shared "
    "or busy cores; absent while no stored profile records the check.",
)

# -- autoBatch (online reconfiguration) -----------------------------------------------------------
OBSERVED_BATCH = per_model(
    Gauge,
    "packrat_model_observed_batch_size",
    "autoBatch: the serving pods' combined batch-size estimate (mode over ready pods).",
)
DECISIONS = per_model(
    Counter,
    "packrat_operator_autobatch_decisions",
    "autoBatch decisions by outcome (switch, hold_not_sustained, hold_too_soon, "
    "hold_gain_too_small, hold_same, hold_pinned, hold_infeasible, hold_no_data).",
    "outcome",
)
SWITCH_SECONDS = per_model(
    Histogram,
    "packrat_operator_switch_duration_seconds",
    "Completed plan switches: seconds from the start to the Service selecting the new slot.",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)

_PER_MODEL: tuple[MetricWrapperBase, ...] = (
    PROFILING_SECONDS,
    PROFILING_POINTS_DONE,
    PROFILING_POINTS,
    PROFILING_ETA,
    EXPECTED_SPEEDUP,
    EXPECTED_LATENCY,
    CORES_EXCLUSIVE,
    OBSERVED_BATCH,
    SWITCH_SECONDS,
)

_PROGRESS = (PROFILING_POINTS_DONE, PROFILING_POINTS, PROFILING_ETA)


def _remove(metrics: Iterable[MetricWrapperBase], namespace: str, model: str) -> None:
    """Drop the model's series of each of ``metrics`` (labelled by namespace and model only)."""
    for metric in metrics:
        with contextlib.suppress(KeyError):
            metric.remove(namespace, model)


# Label values used per model, so that forget_model can drop exactly those series.
_seen: dict[tuple[str, str], set[tuple[MetricWrapperBase, tuple[str, ...]]]] = {}
_seen_lock = threading.Lock()


def _child(metric: MetricWrapperBase, namespace: str, model: str, *extra: str) -> MetricWrapperBase:
    values = (namespace, model, *extra)
    with _seen_lock:
        _seen.setdefault((namespace, model), set()).add((metric, values))
    return metric.labels(*values)


def _counter(metric: Counter, namespace: str, model: str, *extra: str) -> Counter:
    child = _child(metric, namespace, model, *extra)
    assert isinstance(child, Counter)
    return child


def _gauge(metric: Gauge, namespace: str, model: str, *extra: str) -> Gauge:
    child = _child(metric, namespace, model, *extra)
    assert isinstance(child, Gauge)
    return child


def _histogram(metric: Histogram, namespace: str, model: str) -> Histogram:
    child = _child(metric, namespace, model)
    assert isinstance(child, Histogram)
    return child


# Counters alerts watch with increase(): created at 0 when a model is first seen, so that the
# first increment is an increase (a series that appears at 1 shows none).
_ZEROED: tuple[tuple[Counter, tuple[str, ...]], ...] = (
    (SWITCHES, ("succeeded",)),
    (SWITCHES, ("aborted",)),
    (EVENTS, ("Warning", "ProfilingFailed")),
    (EVENTS, ("Warning", "SwitchAborted")),
)


def _first_sight(namespace: str, model: str) -> None:
    with _seen_lock:
        known = (namespace, model) in _seen
    if not known:
        for counter, extra in _ZEROED:
            _counter(counter, namespace, model, *extra)


def record_reconcile(namespace: str, model: str, result: str) -> None:
    """One reconcile pass ended with ``result`` (ok, waiting, invalid, error, ...)."""
    _first_sight(namespace, model)
    _counter(RECONCILES, namespace, model, result).inc()


def record_error(namespace: str, model: str, error: str) -> None:
    """A reconcile pass raised ``error`` (the exception's type name)."""
    _first_sight(namespace, model)
    _counter(RECONCILES, namespace, model, "error").inc()
    _counter(ERRORS, namespace, model, error).inc()


ALERTED_WARNINGS = ("ProfilingFailed", "SwitchAborted")


def record_event(namespace: str, model: str, type_: str, reason: str) -> None:
    """The operator posted an Event (Normal or Warning) with ``reason`` about a model."""
    _counter(EVENTS, namespace, model, type_, reason).inc()


def record_phase(namespace: str, model: str, phase: str, phases: Iterable[str] = PHASES) -> None:
    """The model's status.phase is ``phase``: 1 for it, 0 for every other phase."""
    for each in {*phases, phase}:
        _gauge(PHASE, namespace, model, each).set(1 if each == phase else 0)
    # the Warning events alerts count with increase(): a series that first appears at 1 has
    # no increase to show, so each exists at 0 from the model's first pass
    for reason in ALERTED_WARNINGS:
        _counter(EVENTS, namespace, model, "Warning", reason)
    if phase != "Profiling":  # progress is only shown while a profiling Job runs
        _remove(_PROGRESS, namespace, model)


def record_profiling(namespace: str, model: str, seconds: float) -> None:
    """A profiling Job succeeded after ``seconds``; the progress gauges are dropped."""
    _histogram(PROFILING_SECONDS, namespace, model).observe(seconds)
    _remove(_PROGRESS, namespace, model)


def record_profiling_progress(
    namespace: str, model: str, *, done: int, total: int, eta_seconds: float | None
) -> None:
    """The running profiling Job's progress (status.profiling.progress)."""
    _gauge(PROFILING_POINTS_DONE, namespace, model).set(done)
    _gauge(PROFILING_POINTS, namespace, model).set(total)
    if eta_seconds is not None:
        _gauge(PROFILING_ETA, namespace, model).set(eta_seconds)


def record_switch(namespace: str, model: str, result: str) -> None:
    """A slot switch ended with ``result`` (succeeded or aborted)."""
    _counter(SWITCHES, namespace, model, result).inc()


def record_plan(
    namespace: str, model: str, *, expected_speedup: float | None, expected_latency_ms: float | None
) -> None:
    """The active plan's expectations (the optimizer's numbers, not measurements)."""
    if expected_speedup is not None:
        _gauge(EXPECTED_SPEEDUP, namespace, model).set(float(expected_speedup))
    if expected_latency_ms is not None:
        _gauge(EXPECTED_LATENCY, namespace, model).set(float(expected_latency_ms) / 1000.0)


def record_cores_exclusive(namespace: str, model: str, exclusive: bool) -> None:
    """Whether every serving pod of the model has an exclusive cpuset."""
    _gauge(CORES_EXCLUSIVE, namespace, model).set(1 if exclusive else 0)


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
        _gauge(OBSERVED_BATCH, namespace, model).set(observed_batch)
    if decision is not None:
        _counter(DECISIONS, namespace, model, decision).inc()
    if switch_seconds is not None:
        _histogram(SWITCH_SECONDS, namespace, model).observe(switch_seconds)


def forget_model(namespace: str, model: str) -> None:
    """Drop every series of a deleted model."""
    with _seen_lock:
        children = _seen.pop((namespace, model), set())
    for metric, values in children:
        with contextlib.suppress(KeyError):
            metric.remove(*values)
    _remove(_PER_MODEL, namespace, model)  # also series set through .labels() directly
