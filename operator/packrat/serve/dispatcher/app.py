"""The serving pod's one public port: TorchServe's inference API in front of the thin instances.

Clients see one model (``POST /predictions/{model}``); behind it every plan instance is its
own TorchServe registration. The dispatcher sends each request to the instance with the least
outstanding work relative to its batch size (:mod:`packrat.serve.dispatcher.routing`), passes
bodies,
content types and status codes through unchanged, and keeps at most two batches outstanding
per instance, so the rest waits here, in a bounded FIFO queue: beyond ``queue_limit`` waiting
requests it answers 503 with ``Retry-After`` instead of growing without bound.

Admission comes before the body is read: a request whose ``Content-Length`` exceeds
``max_body_bytes`` (default 6 MiB, below TorchServe's own 6.5 MB limit) is answered 413 at
once, and one that would not fit the queue, or would take the bytes buffered across all
requests past ``max_buffered_bytes``, is answered 503; only then is the body read, within
``body_timeout_s`` (408 beyond). A body refused (413, 408, broken) is not read further, nor
discarded byte by byte: its connection stops reading and closes after the answer. A client
that disconnects while its request waits (or while its body is read) is dropped from the
queue before it reaches a worker and counted in ``packrat_requests_cancelled_total``, not as
an answer; once forwarded, a request runs to completion (its slot stays taken until
TorchServe answers) and is counted cancelled too. When TorchServe is gone
(:meth:`Dispatcher.fail`), every queued request and every new one is answered 503 at once.

An in-pod plan switch (:mod:`packrat.serve.pod.inpod`) hands the dispatcher a new, warmed set of
instances with :meth:`Dispatcher.swap`; new requests go to the new set while the old one
finishes its own (:mod:`packrat.serve.dispatcher.swap`).

Liveness (``GET /healthz``) is 200 unless TorchServe is gone. Readiness (``GET /ping``) is
owned by whoever watches the instances (see :mod:`packrat.serve.pod.health`): it marks instances
up only after they loaded and answered a warm-up batch, and down while their worker
restarts. These and the other read-only endpoints are in :mod:`packrat.serve.dispatcher.endpoints`.
During a drain the listener is closed by the owner; requests that still arrive on open
connections are served and answered with ``Connection: close``.

The batch-size estimator (:mod:`packrat.serve.dispatcher.sampler`) samples the outstanding requests
(queued + in flight) every few milliseconds while there are any, and exports Packrat's
estimate as a gauge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from packrat.plan.estimator import SERVING_ROUNDING, BatchSizeEstimator
from packrat.serve.auth import AdminToken
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.arrivals import ArrivalLog
from packrat.serve.dispatcher.canary import CanarySplit, canary_routes
from packrat.serve.dispatcher.connections import (
    BodyRefusedError,
    BufferBudget,
    ConnectionLimits,
    GuardedAppRunner,
    disconnected,
    receive_body,
    refuse_body,
    shield,
)
from packrat.serve.dispatcher.endpoints import METRICS_INTERVAL_S, read_only_routes
from packrat.serve.dispatcher.metrics import ServeMetrics
from packrat.serve.dispatcher.payload_log import PayloadLogger
from packrat.serve.dispatcher.sampler import EstimatorSampler
from packrat.serve.dispatcher.slots import STUCK_AFTER_S, BackendGoneError, QueueFullError, Slots
from packrat.serve.dispatcher.swap import SwapMixin
from packrat.serve.dispatcher.upstream import Upstream, error_response, passthrough
from packrat.serve.dispatcher.v2 import v2_routes

__all__ = ["Backend", "BackendGoneError", "Dispatcher", "QueueFullError", "Stage"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Answer:
    """One request's answer, who gave it (``dispatcher`` or the runtime's kind), and whether
    its client left while it ran (then it is not counted as an answer)."""

    response: web.Response
    source: str
    gone: bool = False


class Stage:
    """Where a request is (reading, queued, in_flight): a cancelled one is counted there."""

    __slots__ = ("stage",)

    def __init__(self) -> None:
        self.stage = "reading"


class Backend(Protocol):
    """Where the dispatcher sends a request for one plan instance: TorchServe's HTTP API
    (:class:`~packrat.serve.dispatcher.upstream.Upstream`) or a runtime backend
    (:mod:`packrat.serve.pod.runtime`)."""

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response: ...


# TorchServe refuses bodies over 6.5 MB (max_request_size 6553500); stay below it.
DEFAULT_MAX_BODY_BYTES = 6 * 1024 * 1024
DEFAULT_MAX_BUFFERED_BYTES = 128 * 1024 * 1024


class Dispatcher(SwapMixin):
    """Routes, queues, sheds and measures prediction requests for one model's instances."""

    def __init__(
        self,
        *,
        model: str,
        instances: Sequence[InstanceSpec],
        backend_url: str | None = None,
        backend: Backend | None = None,
        queue_limit: int = 1024,
        queue_timeout_s: float = 60.0,
        retry_after_s: int = 1,
        estimator_interval_s: float = 0.005,
        estimator_window: int = 200,
        estimator_rounding: str = SERVING_ROUNDING,
        metrics: ServeMetrics | None = None,
        status: Callable[[], Mapping[str, Any]] | None = None,
        alive: Callable[[], bool] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
        body_timeout_s: float = 30.0,
        routes: Sequence[web.RouteDef] = (),
        payload_log: PayloadLogger | None = None,
        admin_token: AdminToken = None,
        stuck_after_s: float = STUCK_AFTER_S,
        metrics_interval_s: float = METRICS_INTERVAL_S,
    ) -> None:
        if max_body_bytes < 1 or max_buffered_bytes < max_body_bytes:
            raise ValueError("need 1 <= max_body_bytes <= max_buffered_bytes")
        self.model = model
        self.metrics_interval_s = metrics_interval_s  # /metrics: a snapshot at most this often
        self.instances = list(instances)
        self._attach_backend(backend, backend_url)
        self._retiring: list[Slots] = []  # old sets still finishing after a swap
        self.slots = Slots(
            [inst.batch for inst in self.instances],
            queue_limit=queue_limit,
            queue_timeout_s=queue_timeout_s,
            on_change=self._gauges,
            stuck_after_s=stuck_after_s,
        )
        self.retry_after_s = retry_after_s
        self.max_body_bytes = max_body_bytes
        # The pod's own ceiling, kept when the owner lowers max_body_bytes to one sample's worth:
        # a v2 request may carry a batch of samples.
        self.batch_body_bytes = max_body_bytes
        self.max_buffered_bytes = max_buffered_bytes
        self.body_timeout_s = body_timeout_s
        self.budget = BufferBudget(max_buffered_bytes)
        self.metrics = metrics or ServeMetrics()
        self.estimator = BatchSizeEstimator(window=estimator_window, rounding=estimator_rounding)
        self.sampler = EstimatorSampler(
            self.estimator,
            pending=lambda: self.pending,
            interval_s=estimator_interval_s,
            metrics=self.metrics,
            model=model,
        )
        self.arrivals = ArrivalLog()
        # batches the runtime sent, by why they left (the native runtime reports them)
        self.batch_counts: dict[str, int] = {"full": 0, "timeout": 0}
        self.canary = CanarySplit(  # 0% until set; its answers charged to the pod's budget
            model=model, registry=self.metrics.registry, budget=self.budget
        )
        self.payload_log = payload_log  # request and response logging, when on
        if payload_log is not None:  # its queue is inside this pod's buffer budget
            payload_log.budget = self.budget
        self.draining = False
        # The model's inputs (packrat.runtime.modelid's dicts), for the v2 protocol; None for a
        # user's .mar, whose handler decides. The owner sets them once the model is prepared.
        self.inputs: list[dict[str, Any]] | None = None
        self._routes = [
            *read_only_routes(self, status=status, alive=alive, token=admin_token),
            *v2_routes(self, alive=alive),
            *canary_routes(self.canary, admin_token),  # POST /admin/canary, with a token only
            *routes,
        ]
        self._init_metrics(queue_limit=queue_limit, max_buffered_bytes=max_buffered_bytes)

    def _attach_backend(self, backend: Backend | None, backend_url: str | None) -> None:
        """Exactly one of a runtime backend or TorchServe's URL (then an Upstream session)."""
        if (backend is None) == (backend_url is None):
            raise ValueError("give the dispatcher a backend_url or a backend, not both")
        # Without a backend of its own the dispatcher proxies to TorchServe's HTTP API and
        # owns that session; a runtime backend is its owner's to start and stop.
        self.upstream: Upstream | None = None
        self.backend: Backend
        if backend is None:
            self.upstream = self.backend = Upstream(str(backend_url))
        else:
            self.backend = backend
        self.source = getattr(self.backend, "kind", "torchserve")  # who answered, in metrics

    def _init_metrics(self, *, queue_limit: int, max_buffered_bytes: int) -> None:
        """The dispatcher's series, labelled once, set to their starting values."""
        model = self.model
        m = self.metrics
        m.queue_limit.labels(model).set(queue_limit)
        self._label_instances()
        m.ready.labels(model).set(0)
        m.max_buffered_bytes.labels(model).set(max_buffered_bytes)
        # Labelled children looked up once: the request path runs for every request.
        # Gauges of what changes on every request are read at scrape time, not set per change
        # (a gauge set takes a lock; the request path is the dispatcher's hot loop).
        m.queue_depth.labels(model).set_function(lambda: sum(s.queued for s in self._every()))
        m.in_flight.labels(model).set_function(lambda: sum(s.in_flight for s in self._every()))
        m.buffered_bytes.labels(model).set_function(lambda: self.budget.used)
        self._duration = m.request_duration.labels(model)
        self._by_code: dict[str, Any] = {}
        # The series alerts take rate() of exist at 0 from the start: a counter first scraped
        # at its value after a burst of 503s shows no increase, so the shed alert would miss it.
        for code in ("200", "503"):
            self._by_code[code] = m.requests.labels(model, code)
        m.errors.labels(model, "503", "dispatcher")

    def _label_instances(self) -> None:
        m, model = self.metrics, self.model
        m.planned_batch.labels(model).set(sum(self.slots.batches))
        for inst in self.instances:
            m.instance_up.labels(model, inst.name).set(0)
        self._per_instance = [m.instance_requests.labels(model, i.name) for i in self.instances]

    @property
    def buffered_bytes(self) -> int:
        """Bytes of request bodies held right now (reserved at admission)."""
        return self.budget.used

    # -- lifecycle ------------------------------------------------------------------------------
    def runner(self, limits: ConnectionLimits | None = None, **kwargs: Any) -> web.AppRunner:
        """An app runner with the connection cap and deadlines, and handler cancellation on
        (a client that disconnects cancels its handler, so its queued request is dropped)."""
        closed = self.metrics.connections_closed
        kwargs.setdefault("access_log", None)
        return GuardedAppRunner(
            self.app(),
            limits=limits or ConnectionLimits(),
            on_event=lambda reason: closed.labels(reason).inc(),
            handler_cancellation=True,
            **kwargs,
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.batch_body_bytes)
        app.router.add_post("/predictions/{model}", self.handle_predict)
        app.router.add_post("/predictions/{model}/{version}", self.handle_predict)
        app.router.add_routes(self._routes)  # the read-only endpoints, then the owner's
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.close()

    async def start(self) -> None:
        if self.upstream is not None:
            await self.upstream.start()
        self.sampler.start()
        if self.payload_log is not None:
            await self.payload_log.start()

    async def close(self) -> None:
        await self.sampler.close()
        if self.upstream is not None:
            await self.upstream.close()
        await self.canary.close()
        if self.payload_log is not None:
            await self.payload_log.close()

    # -- state the owner drives -----------------------------------------------------------------
    @property
    def backend_url(self) -> str:
        """TorchServe's inference API; the owner sets it again when TorchServe moved ports."""
        assert self.upstream is not None, "the dispatcher has a runtime backend"
        return self.upstream.base_url

    @backend_url.setter
    def backend_url(self, url: str) -> None:
        assert self.upstream is not None, "the dispatcher has a runtime backend"
        self.upstream.base_url = url.rstrip("/")

    def set_up(self, index: int, up: bool) -> None:
        if self.slots.up[index] != up:
            log.info("instance %s is %s", self.instances[index].name, "up" if up else "down")
        self.metrics.instance_up.labels(self.model, self.instances[index].name).set(int(up))
        self.slots.set_up(index, up and not self.slots.failed)
        self._update_ready()

    @property
    def up(self) -> list[bool]:
        return list(self.slots.up)

    @property
    def failed(self) -> str | None:
        return self.slots.failed

    @property
    def ready(self) -> bool:
        s = self.slots
        ok = bool(self.instances) and all(s.up) and not self.draining and not s.failed
        # every instance hung: not ready until one answers (issue 38); one slow request only
        # takes its own instance out of the routing, not the pod out of the Service
        return ok and len(s.stuck()) < len(self.instances)

    def fail(self, reason: str) -> None:
        """TorchServe is gone: every queued request and every new one gets a 503 at once."""
        for old in self._retiring:
            old.fail(reason)
        self.slots.fail(reason)
        for inst in self.instances:
            self.metrics.instance_up.labels(self.model, inst.name).set(0)
        self._update_ready()

    def _update_ready(self) -> None:
        self.metrics.ready.labels(self.model).set(int(self.ready))

    def begin_drain(self) -> None:
        self.draining = True
        self._update_ready()

    def record_batch(self, instance: str, *, full: bool) -> None:
        """The runtime sent ``instance`` a batch, ``full`` or on its delay timeout."""
        reason = "full" if full else "timeout"
        self.batch_counts[reason] += 1
        self.metrics.batches.labels(self.model, instance, reason).inc()

    @property
    def pending(self) -> int:
        """Outstanding requests: queued here plus in flight to TorchServe (old sets too)."""
        return self.slots.pending + sum(s.pending for s in self._retiring)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is outstanding; False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        for slots in [*self._retiring, self.slots]:
            if not await slots.wait_idle(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def _every(self) -> list[Slots]:
        return [self.slots, *self._retiring]

    def _gauges(self) -> None:
        """After every change of the slots: the estimator samples while work is outstanding."""
        if self.slots.pending or any(s.pending for s in self._retiring):
            self.sampler.wake()

    # -- HTTP handlers --------------------------------------------------------------------------
    async def handle_predict(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["model"]
        if name != self.model:
            return error_response(404, f"Model not found: {name}")
        start = time.perf_counter()
        track = Stage()
        admitted = await self.admit(request, start, track)
        if isinstance(admitted, web.Response):
            return admitted
        body, reserve = admitted
        try:
            if self.canary.take():  # a share of the traffic goes to the canary's Service
                answered = await self.canary.forward(request.headers, request.query, body)
                if answered is not None:  # else (canary failed): served here
                    reserve += answered[1]  # its answer's bytes, held as the body's are
                    return self._answer(answered[0], start, source="canary")
            headers = passthrough(request.headers.items())
            answer = await self.run_one(request, headers, request.query, body, track)
            if answer.gone:  # answered, but nobody to answer: not a 200
                self.metrics.cancelled.labels(self.model, track.stage).inc()
                return answer.response
        except asyncio.CancelledError:
            self.metrics.cancelled.labels(self.model, track.stage).inc()
            raise
        finally:
            self.budget.release(reserve)
        response = answer.response
        if self.payload_log is not None:  # sampled, queued, never awaited
            self.payload_log.offer(
                headers=request.headers,
                request_body=body,
                status=response.status,
                response_headers=response.headers,
                response_body=response.body if isinstance(response.body, bytes) else b"",
                latency_s=time.perf_counter() - start,
            )
        return self.finish(response, start, answer.source)

    async def admit(
        self, request: web.Request, start: float, track: Stage, *, cap: int | None = None
    ) -> tuple[bytes, int] | web.Response:
        """Admission, before a byte of the body is read, then the body: ``(body, reserved
        bytes)`` (the caller gives the bytes back to :attr:`budget`), or the refusal, already
        counted. ``cap``: the largest body (default :attr:`max_body_bytes`, one request)."""
        limit = cap or self.max_body_bytes
        if self.failed:
            return self._shed(error_response(503, "the model server is gone"), start)
        length = request.content_length
        if length is not None and length > limit:
            return self._refuse(request, self._too_large(length, limit), start)
        if not self.slots.admissible():
            return self._shed(error_response(503, "queue full", **self._retry()), start)
        reserve = length if length is not None else limit
        if not self.budget.reserve(reserve):
            return self._shed(
                error_response(503, "too many request bodies buffered", **self._retry()), start
            )
        try:
            body = await receive_body(request, length, limit, self.body_timeout_s)
        except BodyRefusedError as exc:
            self.budget.release(reserve)
            answer = self._too_large(None, limit) if exc.status == 413 else None
            answer = answer or error_response(exc.status, exc.message)
            return self._refuse(request, answer, start)
        except asyncio.CancelledError:
            self.budget.release(reserve)
            self.metrics.cancelled.labels(self.model, track.stage).inc()
            raise
        # An arrival for the tuner only once admitted and whole: a flood the pod refuses (too
        # large, queue full, broken bodies) must not buy its sender more replicas; a saturated
        # pod shows as admitted arrivals at its capacity.
        self.arrivals.record()
        track.stage = "queued"
        return body, reserve

    async def run_one(
        self,
        request: web.Request,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        body: bytes,
        track: Stage,
        *,
        shields: bool = True,
    ) -> Answer:
        """One request body through the queue and an instance: the runtime's answer, or the
        dispatcher's own 503 (a shed); not counted yet (:meth:`finish`). ``shields``: keep the
        client's disconnect from cancelling it once forwarded (a caller running several bodies
        of one request at once shields them all itself)."""
        # This request stays with the set it was admitted to, even across a swap.
        slots, instances, counters = self.slots, self.instances, self._per_instance
        try:
            index = await slots.acquire()
        except QueueFullError:
            return Answer(error_response(503, "queue full", **self._retry()), "dispatcher")
        except TimeoutError:
            msg = "no instance took the request in time"
            return Answer(error_response(503, msg, **self._retry()), "dispatcher")
        except BackendGoneError:
            return Answer(error_response(503, "the model server is gone"), "dispatcher")
        track.stage = "in_flight"
        counters[index].inc()
        # Once forwarded, the request runs to completion even if its client leaves: the
        # worker has it, and its slot must stay taken until the runtime answers.
        if shields:
            shield(request, True)
        try:
            response = await self._forward_then_release(
                slots, index, instances[index], headers=headers, query=query, body=body
            )
        finally:
            if shields:
                shield(request, False)
        return Answer(response, self.source, gone=disconnected(request))

    def finish(self, response: web.Response, start: float, source: str) -> web.Response:
        """Count the answer of one HTTP request (``source``: who answered, the dispatcher or
        the runtime) and close its connection during a drain."""
        if self.draining:
            response.headers["Connection"] = "close"
            response.force_close()
        return self._count(response, start, source=source)

    def _answer(self, response: web.Response, start: float, *, source: str) -> web.Response:
        if self.draining:
            response.headers["Connection"] = "close"
            response.force_close()
        return self._count(response, start, source=source)

    def _too_large(self, length: int | None, limit: int | None = None) -> web.Response:
        got = f"{length} bytes" if length is not None else "a longer body"
        most = limit or self.max_body_bytes
        return error_response(413, f"request body too large: {got}, at most {most} bytes")

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}

    def _shed(self, response: web.Response, start: float) -> web.Response:
        """An answer the dispatcher gives itself."""
        return self._count(response, start, source="dispatcher")

    def _refuse(self, request: web.Request, response: web.Response, start: float) -> web.Response:
        """An answer without reading (the rest of) the body: the connection stops reading
        at
        once and closes after the answer
        (:func:`~packrat.serve.dispatcher.connections.refuse_body`)."""
        response.force_close()
        refuse_body(request)
        return self._count(response, start, source="dispatcher")

    async def _forward_then_release(
        self,
        slots: Slots,
        index: int,
        inst: InstanceSpec,
        *,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        body: bytes,
    ) -> web.Response:
        forwarded = time.perf_counter()
        try:
            return await self.backend.forward(inst.name, headers, query, body)
        finally:
            slots.release(index)
            self.metrics.instance_duration.labels(self.model, inst.name).observe(
                time.perf_counter() - forwarded
            )

    def _count(self, response: web.Response, start: float, *, source: str) -> web.Response:
        m = self.metrics
        code = str(response.status)
        self._duration.observe(time.perf_counter() - start)
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = m.requests.labels(self.model, code)
        counter.inc()
        if response.status >= 400:
            m.errors.labels(self.model, code, source).inc()
        return response
