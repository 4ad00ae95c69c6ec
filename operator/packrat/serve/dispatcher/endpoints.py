"""The dispatcher's read-only endpoints: ``/ping`` (readiness), ``/healthz`` (liveness),
``/metrics`` (Prometheus), ``/status`` (plan, queue, estimate) and ``/arrivals`` (the arrival
log the operator's tuner reads: with the pod's admin token only, since when each request came
is the model's clients' business, not every client's). They answer from
:class:`~packrat.serve.dispatcher.app.Dispatcher` state and change none of it.

``/metrics`` is public (Prometheus scrapes it without a token), so it is a snapshot taken at
most every ``metrics_interval_s`` (:data:`METRICS_INTERVAL_S`): a client polling it between
its own requests would otherwise read each request's time off the counters, the arrival log
by another door (issue 38). Rendering it at most that often also bounds what a flood of
``/metrics`` costs the event loop. For the same reason ``/status`` shows its live counts
(requests in flight and queued, the estimator's samples, batches, the canary's counts) only
with the token, on a pod that has one; without, the configuration and the estimate."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from packrat.serve.auth import AdminToken, bearer_accepted
from packrat.serve.dispatcher.arrivals import DEFAULT_LIMIT
from packrat.serve.dispatcher.metrics import METRICS_INTERVAL_S, Snapshot
from packrat.serve.dispatcher.upstream import error_response

if TYPE_CHECKING:
    from packrat.serve.dispatcher.app import Dispatcher

__all__ = ["METRICS_INTERVAL_S", "read_only_routes"]


def read_only_routes(
    d: Dispatcher,
    *,
    status: Callable[[], Mapping[str, Any]] | None,
    alive: Callable[[], bool] | None,
    token: AdminToken = None,
) -> list[web.RouteDef]:
    """The routes, answering from ``d``; ``status`` adds the owner's document to ``/status``,
    ``alive`` says whether TorchServe is still there (``None``: always). ``/arrivals`` needs
    the bearer ``token`` (a 401 without it); a pod with no token has no ``/arrivals``, as it
    has no admin routes."""

    async def handle_ping(_request: web.Request) -> web.Response:
        if d.ready:
            return web.json_response({"status": "Healthy"})
        return web.json_response({"status": "Unhealthy"}, status=503)

    async def handle_healthz(_request: web.Request) -> web.Response:
        """Liveness, unlike readiness: 200 while the pod can recover by itself (instances
        loading, a worker restarting, draining); 503 only when TorchServe itself is gone."""
        if alive is None or alive():
            return web.json_response({"status": "Alive"})
        return web.json_response({"status": "Dead"}, status=503)

    snapshot = Snapshot()

    async def handle_metrics(_request: web.Request) -> web.Response:
        body = snapshot.get(d.metrics_interval_s, lambda: generate_latest(d.metrics.registry))
        response = web.Response(body=body)
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        response.charset = "utf-8"
        return response

    async def handle_status(request: web.Request) -> web.Response:
        doc: dict[str, Any] = dict(status()) if status else {}
        doc.setdefault("ready", d.ready)
        doc["draining"] = d.draining
        if token and not bearer_accepted(request.headers.get("Authorization", ""), token):
            # public: the configuration and the estimate; the live counts (when requests
            # came, as the arrival log says) are the token's (issue 38)
            doc["batch_size_estimate"] = {"estimate": d.estimator.estimate}
            return web.json_response(doc)
        doc["outstanding"] = {"in_flight": d.slots.in_flight, "queued": d.slots.queued}
        doc["canary"] = d.canary.stats()
        doc["batch_size_estimate"] = {
            "estimate": d.estimator.estimate,
            "ewma": d.estimator.ewma,
            "samples": d.estimator.samples,
            "stable_seconds": round(d.sampler.stable_s(), 3),
            "batches": dict(d.batch_counts),
        }
        return web.json_response(doc)

    async def handle_arrivals(request: web.Request) -> web.Response:
        """The arrival log after ``?after=`` (seconds since the epoch; default: all of it)."""
        if not bearer_accepted(request.headers.get("Authorization", ""), token):
            return error_response(401, "a valid bearer token is required")
        try:
            after = float(request.query.get("after", "0"))
            limit = int(request.query.get("limit", str(DEFAULT_LIMIT)))
        except ValueError:
            return error_response(400, "after must be a number of seconds, limit an integer")
        if not math.isfinite(after) or not 1 <= limit <= DEFAULT_LIMIT:
            return error_response(400, f"after must be finite, limit in 1..{DEFAULT_LIMIT}")
        return web.json_response(d.arrivals.after(after, limit=limit))

    routes = [
        web.get("/ping", handle_ping),
        web.get("/healthz", handle_healthz),
        web.get("/metrics", handle_metrics),
        web.get("/status", handle_status),
    ]
    return [*routes, web.get("/arrivals", handle_arrivals)] if token else routes
