"""The Open Inference Protocol (v2) REST endpoints at the dispatcher, on either runtime.

``GET /v2`` (server metadata), ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{name}[/versions/{v}]`` (model metadata), ``.../ready``, and
``POST .../infer`` with JSON tensors or the binary tensor extension
(``Inference-Header-Content-Length``). Health answers 200 for true and 400 for false, as the
protocol says. An infer request goes through the same admission, limits, queue and instances
as ``/predictions`` (:meth:`~packrat.serve.dispatcher.app.Dispatcher.admit`,
:meth:`~packrat.serve.dispatcher.app.Dispatcher.run_one`): its N samples are N places in the
queue, spread over the plan's instances, and the request is answered when all are. Errors
have the protocol's body, ``{"error": "..."}``: 400 for a malformed request, 404 for another
model, and the status a sample got (503 when shed, 400 when the model refused it) otherwise.
The codec is :mod:`packrat.serve.dispatcher.v2_codec`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from packrat.serve.dispatcher.connections import shield
from packrat.serve.dispatcher.v2_codec import (
    V2Error,
    build_response,
    model_metadata,
    parse_request,
    split_samples,
)

if TYPE_CHECKING:
    from packrat.serve.dispatcher.app import Dispatcher

__all__ = ["HEADER_LENGTH", "v2_routes"]

HEADER_LENGTH = "Inference-Header-Content-Length"
VERSION = "1"


def v2_error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _message(response: web.Response) -> str:
    """The message of one of the dispatcher's or the runtime's error answers."""
    body = response.body if isinstance(response.body, bytes) else b""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500] or f"status {response.status}"
    if isinstance(doc, dict):
        return str(doc.get("message") or doc.get("error") or doc)[:500]
    return str(doc)[:500]


def _as_v2(response: web.Response) -> web.Response:
    keep = {k: v for k, v in response.headers.items() if k in ("Retry-After", "Connection")}
    out = v2_error(response.status, _message(response), **keep)
    if response.headers.get("Connection") == "close":
        out.force_close()
    return out


def v2_routes(d: Dispatcher, *, alive: Callable[[], bool] | None) -> list[web.RouteDef]:
    """The v2 routes for dispatcher ``d``; ``alive`` as for ``/healthz``."""

    def known(request: web.Request) -> web.Response | None:
        name = request.match_info["model"]
        if name != d.model:
            return v2_error(404, f"model {name!r} not found; this server serves {d.model!r}")
        version = request.match_info.get("version")
        if version is not None and version != VERSION:
            return v2_error(404, f"model {name!r} has version {VERSION} only")
        return None

    async def server_metadata(_request: web.Request) -> web.Response:
        return web.json_response(
            {"name": "packrat", "version": VERSION, "extensions": ["binary_tensor_data"]}
        )

    async def live(_request: web.Request) -> web.Response:
        ok = alive is None or alive()
        return web.json_response({"live": ok}, status=200 if ok else 400)

    async def ready(request: web.Request) -> web.Response:
        if "model" in request.match_info and (missing := known(request)) is not None:
            return missing
        return web.json_response({"ready": d.ready}, status=200 if d.ready else 400)

    async def metadata(request: web.Request) -> web.Response:
        if (missing := known(request)) is not None:
            return missing
        return web.json_response(model_metadata(d.model, d.inputs))

    async def infer(request: web.Request) -> web.StreamResponse:
        if (missing := known(request)) is not None:
            return missing
        return await _infer(d, request)

    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    return [
        web.get("/v2", server_metadata),
        web.get("/v2/health/live", live),
        web.get("/v2/health/ready", ready),
        web.get(model, metadata),
        web.get(versioned, metadata),
        web.get(f"{model}/ready", ready),
        web.get(f"{versioned}/ready", ready),
        web.post(f"{model}/infer", infer),
        web.post(f"{versioned}/infer", infer),
    ]


async def _infer(d: Dispatcher, request: web.Request) -> web.StreamResponse:
    from packrat.serve.dispatcher.app import Stage

    start = time.perf_counter()
    track = Stage()
    header = request.headers.get(HEADER_LENGTH)
    admitted = await d.admit(request, start, track, cap=d.batch_body_bytes)  # a batch
    if isinstance(admitted, web.Response):
        return _as_v2(admitted)
    body, reserve = admitted
    try:
        try:
            if header is not None and not (header.isdigit() and len(header) <= 12):
                raise V2Error(f"{HEADER_LENGTH} must be a number of bytes")
            req = parse_request(body, int(header) if header is not None else None)
            samples = split_samples(req, d.inputs)
        except V2Error as exc:
            return d.finish(v2_error(400, str(exc)), start, "dispatcher")
        del body  # the samples hold the bytes from here
        # The samples run together; none is cancelled by a disconnect once any is forwarded
        # (each holds its slot until its worker answers), so the request is shielded whole.
        shield(request, True)
        try:
            answers = await asyncio.gather(
                *(
                    d.run_one(request, {"Content-Type": t}, {}, b, track, shields=False)
                    for b, t in samples
                )
            )
        finally:
            shield(request, False)
        if any(a.gone for a in answers):
            d.metrics.cancelled.labels(d.model, track.stage).inc()
            return v2_error(499, "the client went away")
        failed = next((a for a in answers if a.response.status != 200), None)
        if failed is not None:
            return d.finish(_as_v2(failed.response), start, failed.source)
        outputs = [a.response.body if isinstance(a.response.body, bytes) else b"" for a in answers]
        try:
            payload, head = build_response(d.model, req, outputs, raw_bytes=d.inputs is None)
        except V2Error as exc:
            return d.finish(v2_error(400, str(exc)), start, "dispatcher")
        except ValueError as exc:  # answers that do not stack: the model's, not the client's
            return d.finish(v2_error(500, f"the model's answers: {exc}"), start, d.source)
        response = _response(payload, head)
        return d.finish(response, start, d.source)
    except asyncio.CancelledError:
        d.metrics.cancelled.labels(d.model, track.stage).inc()
        raise
    finally:
        d.budget.release(reserve)


def _response(payload: bytes, head: int | None) -> web.Response:
    if head is None:
        return web.Response(body=payload, content_type="application/json")
    headers: dict[str, Any] = {HEADER_LENGTH: str(head)}
    return web.Response(body=payload, content_type="application/octet-stream", headers=headers)
