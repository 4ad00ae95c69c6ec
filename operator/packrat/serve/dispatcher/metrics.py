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
from typing import Any, Generic, TypeVar, cast, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_M = TypeVar("_M", Counter, Gauge, Histogram)

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


class Declared(Generic[_M]):
    """One metric of a :class:`MetricSet`, declared on its class by :func:`histogram`,
    :func:`counter` or :func:`gauge`: read on an instance, it is that instance's metric, made
    in the instance's registry when the instance was (an instance attribute of the same name,
    which hides this descriptor: it has no ``__set__``, so reading a metric costs no call)."""

    def __init__(
        self, make: Callable[..., _M], name: str, doc: str, labels: tuple[str, ...], shared: bool
    ) -> None:
        self.make: Callable[..., _M] = make
        self.name, self.doc, self.labels, self.shared = name, doc, labels, shared
        self.attr = ""  # the attribute it is declared as (set by Python with the class)

    def __set_name__(self, owner: type[MetricSet], attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, obj: None, owner: type[MetricSet]) -> Declared[_M]: ...

    @overload
    def __get__(self, obj: MetricSet, owner: type[MetricSet]) -> _M: ...

    def __get__(self, obj: MetricSet | None, owner: type[MetricSet]) -> Declared[_M] | _M:
        if obj is None:
            return self
        return cast(_M, obj.__dict__[self.attr])  # not reached once MetricSet.__init__ ran

    def register(self, metric_set: MetricSet) -> _M:
        """This metric, in the set's registry, its labels after the set's shared ones."""
        labels = (*metric_set.shared_labels, *self.labels) if self.shared else self.labels
        return self.make(self.name, self.doc, labels, registry=metric_set.registry)


def _latency_histogram(name: str, doc: str, labels: Sequence[str], **kw: Any) -> Histogram:
    return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, **kw)


def histogram(name: str, doc: str, *labels: str, shared_labels: bool = True) -> Declared[Histogram]:
    """A latency histogram (every histogram here is one), on :data:`LATENCY_BUCKETS`;
    labelled by the set's shared labels (unless ``shared_labels`` is false), then ``labels``."""
    return Declared(_latency_histogram, name, doc, labels, shared_labels)


def counter(name: str, doc: str, *labels: str, shared_labels: bool = True) -> Declared[Counter]:
    """A counter, labelled as :func:`histogram`'s are."""
    return Declared(Counter, name, doc, labels, shared_labels)


def gauge(name: str, doc: str, *labels: str, shared_labels: bool = True) -> Declared[Gauge]:
    """A gauge, labelled as :func:`histogram`'s are."""
    return Declared(Gauge, name, doc, labels, shared_labels)


class MetricSet:
    """One registry (a fresh one unless given) and the metrics its class declares in it.

    Shared by the dispatcher's and the pipeline router's metrics: a subclass names the labels
    its metrics start with (``shared_labels``: the model, the pipeline) and declares each
    metric once, as a class attribute (``requests = counter(name, doc, "code")``); every
    instance registers its own of each in ``self.registry``, in the order declared (the order
    ``/metrics`` lists them in).
    """

    shared_labels: tuple[str, ...] = ()

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for attr, declared in vars(type(self)).items():
            if isinstance(declared, Declared):
                self.__dict__[attr] = declared.register(self)


class ServeMetrics(MetricSet):
    """Every metric the dispatcher exports, by model but for the pod's connections."""

    shared_labels = ("model",)

    # Predictions answered: their duration, status codes and errors.
    request_duration = histogram(
        "packrat_request_duration_seconds",
        "Time from receiving a prediction request to sending its answer (dispatcher view).",
    )
    requests = counter(
        "packrat_requests",
        "Prediction requests answered, by HTTP status code.",
        "code",
    )
    errors = counter(
        "packrat_request_errors",
        "Prediction requests answered with an error status, by code and by who answered "
        "(native or torchserve: the runtime's answer passed through; dispatcher: shed, "
        "draining, backend unreachable, a malformed v2 request).",
        "code",
        "source",
    )

    # What each plan instance was sent, and how long it took.
    instance_requests = counter(
        "packrat_instance_requests",
        "Prediction requests forwarded to each instance.",
        "plan_instance",
    )
    instance_duration = histogram(
        "packrat_instance_request_duration_seconds",
        "Time the runtime took to answer a forwarded request, per plan instance: the "
        "instance's batch latency plus its batching delay (compare with the plan's "
        "expected batch latency).",
        "plan_instance",
    )

    # Requests in flight and queued, and the batch-size estimator's readings.
    in_flight = gauge(
        "packrat_requests_in_flight",
        "Requests forwarded to TorchServe and not answered yet.",
    )
    queue_depth = gauge(
        "packrat_queue_depth",
        "Requests waiting in the dispatcher for an instance to take them.",
    )
    queue_limit = gauge(
        "packrat_queue_limit",
        "Requests the dispatcher queues before it answers 503.",
    )
    batch_size_estimate = gauge(
        "packrat_batch_size_estimate",
        "Packrat's batch-size estimate: EWMA of outstanding requests, floored to a power "
        "of two, mode over the recent window.",
    )
    batches = counter(
        "packrat_batches",
        "Batches the native runtime sent to an instance's worker, by why they left: full "
        "(the instance's batch size reached) or timeout (the batch delay ran out first). "
        "Frequent timeouts mean the plan's batch is larger than the load forms.",
        "plan_instance",
        "reason",
    )
    outstanding_ewma = gauge(
        "packrat_outstanding_requests_ewma",
        "The estimator's moving average of outstanding requests (queued + in flight).",
    )

    # Instances up and restarted, the pod's readiness and the plan's batch size.
    instance_up = gauge(
        "packrat_instance_up",
        "1 when the instance's worker is loaded, warmed and ready.",
        "plan_instance",
    )
    instance_restarts = counter(
        "packrat_instance_restarts",
        "Worker restarts observed per instance (a new worker process id).",
        "plan_instance",
    )
    ready = gauge(
        "packrat_ready",
        "1 when every instance is ready and the pod is not draining.",
    )
    startup_seconds = gauge(
        "packrat_startup_seconds",
        "The pod's start-up timeline: seconds from its process's start to the end of each "
        "step (zygote_spawned, torch_imported, model_built, workers_forked, workers_warmed, "
        "ready, ...: packrat.serve.pod.timeline), set once, when it first became ready.",
        "step",
    )
    planned_batch = gauge(
        "packrat_plan_batch_size",
        "The batch size B the running plan was computed for.",
    )
    plan_engine = gauge(
        "packrat_plan_engine",
        "1 for the engine the running plan's instances run (eager, onnxruntime, openvino, "
        "inductor), 0 for an engine an earlier plan ran.",
        "engine",
    )

    # Robustness (issue 10): what the dispatcher refused, dropped or is holding.
    cancelled = counter(
        "packrat_requests_cancelled",
        "Prediction requests whose client disconnected before the answer, by the stage "
        "they were in (reading: body; queued: dropped before any worker saw it; in_flight: "
        "already forwarded, ran to completion unanswered). Not counted in packrat_requests.",
        "stage",
    )
    buffered_bytes = gauge(
        "packrat_request_buffered_bytes",
        "Request body bytes the dispatcher has reserved for requests being read, queued "
        "or forwarded.",
    )
    max_buffered_bytes = gauge(
        "packrat_request_buffered_bytes_limit",
        "Body bytes the dispatcher buffers across all requests before it answers 503.",
    )
    connections_closed = counter(
        "packrat_connections_closed",
        "Client connections the dispatcher closed itself, by reason (refused: over the "
        "connection cap; header_timeout: the request head did not arrive in time).",
        "reason",
        shared_labels=False,
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
