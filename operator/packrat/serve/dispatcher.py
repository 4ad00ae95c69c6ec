"""The serving pod's one public port: TorchServe's inference API in front of the thin instances.

Clients see one model (``POST /predictions/{model}``); behind it every plan instance is its
own TorchServe registration. The dispatcher sends each request to the instance with the least
outstanding work relative to its batch size (:mod:`packrat.serve.routing`), passes bodies,
content types and status codes through unchanged, and keeps at most two batches outstanding
per instance, so the rest waits here, in a bounded FIFO queue: beyond ``queue_limit`` waiting
requests it answers 503 with ``Retry-After`` instead of growing without bound.

Liveness (``GET /healthz``) is 200 unless TorchServe is gone. Readiness (``GET /ping``) is
owned by whoever watches the instances (see :mod:`packrat.serve.server`): it marks instances
up only after they loaded and answered a warm-up batch, and down while their worker
restarts. During a drain the listener is closed by the owner; requests that still arrive on
open connections are served and answered with ``Connection: close``.

The batch-size estimator samples the outstanding requests (queued + in flight) every few
milliseconds while there are any, and exports Packrat's estimate as a gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from packrat.plan.estimator import BatchSizeEstimator
from packrat.serve.config import InstanceSpec
from packrat.serve.metrics import ServeMetrics
from packrat.serve.routing import choose_instance, default_caps

log = logging.getLogger(__name__)

# Headers a proxy must not copy between hops (RFC 9110 section 7.6.1) plus length/encoding,
# which aiohttp recomputes.
_HOP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Content-Length",
        "Content-Encoding",
        "Host",
    )
)


class QueueFullError(Exception):
    """The dispatcher's queue is at its limit."""


def _error(status: int, message: str, **headers: str) -> web.Response:
    """An error body shaped like TorchServe's own (``code``, ``type``, ``message``)."""
    kind = {404: "ModelNotFoundException", 503: "ServiceUnavailableException"}.get(
        status, "InternalServerException"
    )
    return web.Response(
        status=status,
        text=json.dumps({"code": status, "type": kind, "message": message}),
        content_type="application/json",
        headers=headers,
    )


class Dispatcher:
    """Routes, queues, sheds and measures prediction requests for one model's instances."""

    def __init__(
        self,
        *,
        model: str,
        instances: Sequence[InstanceSpec],
        backend_url: str,
        queue_limit: int = 1024,
        queue_timeout_s: float = 60.0,
        retry_after_s: int = 1,
        estimator_interval_s: float = 0.005,
        estimator_window: int = 200,
        metrics: ServeMetrics | None = None,
        status: Callable[[], Mapping[str, Any]] | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        if queue_limit < 0:
            raise ValueError("queue_limit must be >= 0")
        self.model = model
        self.instances = list(instances)
        self.batches = [inst.batch for inst in self.instances]
        self.caps = default_caps(self.batches)
        self.backend_url = backend_url.rstrip("/")
        self.queue_limit = queue_limit
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.metrics = metrics or ServeMetrics()
        self.estimator = BatchSizeEstimator(window=estimator_window)
        self.estimator_interval_s = estimator_interval_s
        self.outstanding = [0] * len(self.instances)
        self.up = [False] * len(self.instances)
        self.draining = False
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: aiohttp.ClientSession | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._status = status
        self._alive = alive
        m = self.metrics
        m.queue_limit.labels(model).set(queue_limit)
        m.planned_batch.labels(model).set(sum(self.batches))
        for inst in self.instances:
            m.instance_up.labels(model, inst.name).set(0)
            m.instance_requests.labels(model, inst.name)
        m.ready.labels(model).set(0)
        # Labelled children looked up once: the request path runs for every request.
        self._queue_gauge = m.queue_depth.labels(model)
        self._in_flight_gauge = m.in_flight.labels(model)
        self._duration = m.request_duration.labels(model)
        self._per_instance = [m.instance_requests.labels(model, i.name) for i in self.instances]
        self._by_code: dict[str, Any] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/predictions/{model}", self.handle_predict)
        app.router.add_post("/predictions/{model}/{version}", self.handle_predict)
        app.router.add_get("/ping", self.handle_ping)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/status", self.handle_status)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.close()

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,
            )
        if self._sampler is None:
            self._sampler = asyncio.create_task(self._sample_loop())

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- state the owner drives -----------------------------------------------------------------
    def set_up(self, index: int, up: bool) -> None:
        if self.up[index] != up:
            log.info("instance %s is %s", self.instances[index].name, "up" if up else "down")
        self.up[index] = up
        self.metrics.instance_up.labels(self.model, self.instances[index].name).set(int(up))
        self._update_ready()
        if up:
            self._dispatch_waiters()

    @property
    def ready(self) -> bool:
        return bool(self.instances) and all(self.up) and not self.draining

    def _update_ready(self) -> None:
        self.metrics.ready.labels(self.model).set(int(self.ready))

    def begin_drain(self) -> None:
        self.draining = True
        self._update_ready()

    @property
    def pending(self) -> int:
        """Outstanding requests: queued here plus in flight to TorchServe."""
        return sum(self.outstanding) + len(self._waiters)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is outstanding; False when ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- queueing -------------------------------------------------------------------------------
    def _choose(self) -> int | None:
        return choose_instance(self.outstanding, self.batches, up=self.up, caps=self.caps)

    def _take(self, index: int) -> None:
        self.outstanding[index] += 1
        self._idle.clear()

    def _release(self, index: int) -> None:
        self.outstanding[index] -= 1
        self._dispatch_waiters()
        if self.pending == 0:
            self._idle.set()

    def _dispatch_waiters(self) -> None:
        while self._waiters:
            index = self._choose()
            if index is None:
                break
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self._take(index)
            fut.set_result(index)
        self._gauges()

    def _gauges(self) -> None:
        self._queue_gauge.set(len(self._waiters))
        self._in_flight_gauge.set(sum(self.outstanding))

    async def acquire(self) -> int:
        """An instance index for one request: at once, or after waiting in the queue."""
        if not self._waiters:
            index = self._choose()
            if index is not None:
                self._take(index)
                self._gauges()
                return index
        if len(self._waiters) >= self.queue_limit:
            raise QueueFullError
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._idle.clear()
        self._gauges()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            if fut.done() and not fut.cancelled():
                self._release(fut.result())  # assigned just as we gave up: hand it back
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
                self._gauges()
                if self.pending == 0:
                    self._idle.set()
            raise

    async def _sample_loop(self) -> None:
        """Feed the estimator the outstanding requests every few ms, while there are any.

        Idle samples (nothing outstanding) are skipped: they say nothing about the size of
        the batches that arrive, and between closed-loop bursts of exactly B they would pull
        the average just below B, which floors to B/2.
        """
        m = self.metrics
        while True:
            depth = self.pending
            if depth > 0:
                self.estimator.observe(depth)
            m.batch_size_estimate.labels(self.model).set(self.estimator.estimate)
            m.outstanding_ewma.labels(self.model).set(self.estimator.ewma)
            await asyncio.sleep(self.estimator_interval_s)

    # -- HTTP handlers --------------------------------------------------------------------------
    async def handle_predict(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["model"]
        if name != self.model:
            return _error(404, f"Model not found: {name}")
        start = time.perf_counter()
        body = await request.read()
        try:
            index = await self.acquire()
        except QueueFullError:
            return self._count(
                _error(503, "queue full", **{"Retry-After": str(self.retry_after_s)}),
                start,
                source="dispatcher",
            )
        except TimeoutError:
            return self._count(
                _error(503, "no instance took the request in time", **{"Retry-After": "1"}),
                start,
                source="dispatcher",
            )
        inst = self.instances[index]
        self._per_instance[index].inc()
        forwarded = time.perf_counter()
        try:
            response = await self._forward(request, inst, body)
        finally:
            self._release(index)
            self.metrics.instance_duration.labels(self.model, inst.name).observe(
                time.perf_counter() - forwarded
            )
        if self.draining:
            response.headers["Connection"] = "close"
            response.force_close()
        return self._count(response, start, source="torchserve")

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

    async def _forward(self, request: web.Request, inst: InstanceSpec, body: bytes) -> web.Response:
        assert self._session is not None, "dispatcher not started"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        url = f"{self.backend_url}/predictions/{inst.name}"
        try:
            async with self._session.post(
                url, data=body, headers=headers, params=request.query
            ) as upstream:
                payload = await upstream.read()
                out_headers = {
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS
                }
                return web.Response(status=upstream.status, body=payload, headers=out_headers)
        except aiohttp.ClientError as exc:
            log.warning("instance %s unreachable: %s", inst.name, exc)
            return _error(503, f"instance unreachable: {exc}", **{"Retry-After": "1"})

    async def handle_ping(self, _request: web.Request) -> web.Response:
        if self.ready:
            return web.json_response({"status": "Healthy"})
        return web.json_response({"status": "Unhealthy"}, status=503)

    async def handle_healthz(self, _request: web.Request) -> web.Response:
        """Liveness, unlike readiness: 200 while the pod can recover by itself (instances
        loading, a worker restarting, draining); 503 only when TorchServe itself is gone."""
        if self._alive is None or self._alive():
            return web.json_response({"status": "Alive"})
        return web.json_response({"status": "Dead"}, status=503)

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(self.metrics.registry))
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        response.charset = "utf-8"
        return response

    async def handle_status(self, _request: web.Request) -> web.Response:
        doc: dict[str, Any] = dict(self._status()) if self._status else {}
        doc.setdefault("ready", self.ready)
        doc["draining"] = self.draining
        doc["outstanding"] = {"in_flight": sum(self.outstanding), "queued": len(self._waiters)}
        doc["batch_size_estimate"] = {
            "estimate": self.estimator.estimate,
            "ewma": self.estimator.ewma,
            "samples": self.estimator.samples,
        }
        return web.json_response(doc)
