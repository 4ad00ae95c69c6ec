"""The serving pod's Prometheus metrics, in one registry per dispatcher.

Names follow Prometheus conventions (base units, ``_total`` counters, histograms for
latency). Per-instance series label the thin instance ``plan_instance`` (``instance`` is
Prometheus' own target label and would be renamed ``exported_instance`` on scrape).
``packrat_batch_size_estimate`` is the number online reconfiguration acts on:
Packrat's estimator over the dispatcher's queue depth. A registry per dispatcher (not the
global default) keeps tests and benchmarks that run several dispatchers in one process
independent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Prometheus scrapes every 15-60 s; the shortest window the dashboards and alerts rate() over
# is 10 s, which a 2 s snapshot (:class:`Snapshot`) still fills with several points
METRICS_INTERVAL_S = 2.0

# 1 ms .. 30 s: tiny models answer in ~1 ms, a ResNet-50 batch of 32 on two cores in seconds.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class MetricSet:
    """One registry (a fresh one unless given) and the constructors of the metrics in it.

    Shared by the dispatcher's and the pipeline router's metrics: every metric registers in
    ``self.registry``, and every histogram (all are latencies) uses :data:`LATENCY_BUCKETS`.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()

    def _histogram(self, name: str, doc: str, labels: Sequence[str]) -> Histogram:
        return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry)

    def _counter(self, name: str, doc: str, labels: Sequence[str]) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Sequence[str]) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)


class ServeMetrics(MetricSet):
    """Every metric the dispatcher exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._add_request_metrics()
        self._add_instance_traffic_metrics()
        self._add_queue_metrics()
        self._add_health_metrics()
        self._add_robustness_metrics()

    def _add_request_metrics(self) -> None:
        """Predictions answered: their duration, status codes and errors."""
        self.request_duration = self._histogram(
            "packrat_request_duration_seconds",
            "Time from receiving a prediction request to sending its answer (dispatcher view).",
            ["model"],
        )
        self.requests = self._counter(
            "packrat_requests",
            "Prediction requests answered, by HTTP status code.",
            ["model", "code"],
        )
        self.errors = self._counter(
            "packrat_request_errors",
            "Prediction requests answered with an error status, by code and by who answered "
            "(native or torchserve: the runtime's answer passed through; dispatcher: shed, "
            "draining, backend unreachable, a malformed v2 request).",
            ["model", "code", "source"],
        )

    def _add_instance_traffic_metrics(self) -> None:
        """What each plan instance was sent, and how long it took."""
        self.instance_requests = self._counter(
            "packrat_instance_requests",
            "Prediction requests forwarded to each instance.",
            ["model", "plan_instance"],
        )
        self.instance_duration = self._histogram(
            "packrat_instance_request_duration_seconds",
            "Time the runtime took to answer a forwarded request, per plan instance: the "
            "instance's batch latency plus its batching delay (compare with the plan's "
            "expected batch latency).",
            ["model", "plan_instance"],
        )

    def _add_queue_metrics(self) -> None:
        """Requests in flight and queued, and the batch-size estimator's readings."""
        self.in_flight = self._gauge(
            "packrat_requests_in_flight",
            "Requests forwarded to TorchServe and not answered yet.",
            ["model"],
        )
        self.queue_depth = self._gauge(
            "packrat_queue_depth",
            "Requests waiting in the dispatcher for an instance to take them.",
            ["model"],
        )
        self.queue_limit = self._gauge(
            "packrat_queue_limit",
            "Requests the dispatcher queues before it answers 503.",
            ["model"],
        )
        self.batch_size_estimate = self._gauge(
            "packrat_batch_size_estimate",
            "Packrat's batch-size estimate: EWMA of outstanding requests, floored to a power "
            "of two, mode over the recent window.",
            ["model"],
        )
        self.batches = self._counter(
            "packrat_batches",
            "Batches the native runtime sent to an instance's worker, by why they left: full "
            "(the instance's batch size reached) or timeout (the batch delay ran out first). "
            "Frequent timeouts mean the plan's batch is larger than the load forms.",
            ["model", "plan_instance", "reason"],
        )
        self.outstanding_ewma = self._gauge(
            "packrat_outstanding_requests_ewma",
            "The estimator's moving average of outstanding requests (queued + in flight).",
            ["model"],
        )

    def _add_health_metrics(self) -> None:
        """Instances up and restarted, the pod's readiness and the plan's batch size."""
        self.instance_up = self._gauge(
            "packrat_instance_up",
            "1 when the instance's worker is loaded, warmed and ready.",
            ["model", "plan_instance"],
        )
        self.instance_restarts = self._counter(
            "packrat_instance_restarts",
            "Worker restarts observed per instance (a new worker process id).",
            ["model", "plan_instance"],
        )
        self.ready = self._gauge(
            "packrat_ready",
            "1 when every instance is ready and the pod is not draining.",
            ["model"],
        )
        self.startup_seconds = self._gauge(
            "packrat_startup_seconds",
            "The pod's start-up timeline: seconds from its process's start to the end of each "
            "step (zygote_spawned, torch_imported, model_built, workers_forked, workers_warmed, "
            "ready, ...: packrat.serve.pod.timeline), set once, when it first became ready.",
            ["model", "step"],
        )
        self.planned_batch = self._gauge(
            "packrat_plan_batch_size",
            "The batch size B the running plan was computed for.",
            ["model"],
        )
        self.plan_engine = self._gauge(
            "packrat_plan_engine",
            "1 for the engine the running plan's instances run (eager, onnxruntime, openvino, "
            "inductor), 0 for an engine an earlier plan ran.",
            ["model", "engine"],
        )

    def _add_robustness_metrics(self) -> None:
        """Robustness (issue 10): what the dispatcher refused, dropped or is holding."""
        self.cancelled = self._counter(
            "packrat_requests_cancelled",
            "Prediction requests whose client disconnected before the answer, by the stage "
            "they were in (reading: body; queued: dropped before any worker saw it; in_flight: "
            "already forwarded, ran to completion unanswered). Not counted in packrat_requests.",
            ["model", "stage"],
        )
        self.buffered_bytes = self._gauge(
            "packrat_request_buffered_bytes",
            "Request body bytes the dispatcher has reserved for requests being read, queued "
            "or forwarded.",
            ["model"],
        )
        self.max_buffered_bytes = self._gauge(
            "packrat_request_buffered_bytes_limit",
            "Body bytes the dispatcher buffers across all requests before it answers 503.",
            ["model"],
        )
        self.connections_closed = self._counter(
            "packrat_connections_closed",
            "Client connections the dispatcher closed itself, by reason (refused: over the "
            "connection cap; header_timeout: the request head did not arrive in time).",
            ["reason"],
        )


class Snapshot:
    """A public ``/metrics`` body, rendered again at most every ``interval_s`` (issue 38):
    a client polling it between its requests would otherwise read each request's time off
    the counters (the arrival log by another door); rendering it at most that often also
    bounds what a flood of ``/metrics`` costs. Shared by the dispatcher, the pipeline
    router and the pool process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._taken: tuple[float, bytes] | None = None

    def fresh(self, interval_s: float) -> bytes | None:
        """The body taken less than ``interval_s`` ago (None: time to render it again)."""
        if self._taken is None or self._clock() - self._taken[0] >= interval_s:
            return None
        return self._taken[1]

    def keep(self, body: bytes) -> bytes:
        self._taken = (self._clock(), body)
        return body

    def get(self, interval_s: float, render: Callable[[], bytes]) -> bytes:
        """The body of at most ``interval_s`` ago, rendered now when older."""
        body = self.fresh(interval_s)
        return body if body is not None else self.keep(render())
