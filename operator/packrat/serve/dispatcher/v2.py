"""The Open Inference Protocol (v2) REST endpoints at the dispatcher, on either runtime.

``GET /v2`` (server metadata), ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{name}[/versions/{v}]`` (model metadata: the output as the model answered its
warm-up), ``.../ready`` (with the model's ``name``), ``.../config`` (Triton's model
configuration JSON), ``.../stats`` (the statistics extension: counters per model),
``GET /v2/models`` and ``POST /v2/repository/index`` (the one model), and ``POST .../infer``
with JSON tensors or the binary tensor extension (``Inference-Header-Content-Length``), gzip or
deflate bodies (inflated within the same byte cap). The classification extension is a clear
400. Every error under ``/v2``, unknown paths and wrong methods included, is
``{"error": ...}`` (:func:`v2_errors`). Health answers 200 for true and 400 for false, as the
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
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from packrat.serve.dispatcher.canary import HEADER as CANARY_HEADER
from packrat.serve.dispatcher.connections import shield
from packrat.serve.dispatcher.v2_codec import (
    InferRequest,
    V2Error,
    build_response,
    model_config,
    model_metadata,
    parse_request,
    split_samples,
)

if TYPE_CHECKING:
    from packrat.serve.dispatcher.app import Dispatcher

__all__ = [
    "HEADER_LENGTH",
    "ParseBusyError",
    "ParsePool",
    "header_length",
    "parse_split",
    "v2_errors",
    "v2_routes",
]

_T = TypeVar("_T")

HEADER_LENGTH = "Inference-Header-Content-Length"
VERSION = "1"


def v2_error(status: int, message: str, **headers: str) -> web.Response:
    """The protocol's error, as ``application/json`` exactly: the KServe SDK reads the message
    only under that content type (aiohttp's ``json_response`` adds ``; charset=utf-8``)."""
    body = json.dumps({"error": message}).encode()
    return web.Response(body=body, status=status, headers=headers, content_type="application/json")


def message_of(response: web.Response) -> str:
    """The message of one of the dispatcher's or the runtime's error answers."""
    body = response.body if isinstance(response.body, bytes) else b""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500] or f"status {response.status}"
    if isinstance(doc, dict):
        return str(doc.get("message") or doc.get("error") or doc)[:500]
    return str(doc)[:500]


def as_v2(response: web.Response, *, canary: bool = False) -> web.Response:
    keep = {k: v for k, v in response.headers.items() if k in ("Retry-After", "Connection")}
    if canary:
        keep[CANARY_HEADER] = "true"
    out = v2_error(response.status, message_of(response), **keep)
    if response.headers.get("Connection") == "close":
        out.force_close()
    return out


@web.middleware
async def v2_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Under ``/v2``, aiohttp's own errors (an unknown path: 404, a wrong method: 405, a
    body over the app's size: 413) in the protocol's shape, ``{"error": ...}``: clients parse
    every v2 answer as JSON (tritonclient reported a parse error for the plain-text ones)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        path = request.path
        if exc.status < 400 or not (path == "/v2" or path.startswith("/v2/")):
            raise
        text = f"{exc.reason}: {request.method} {path[:200]}"
        if isinstance(exc, web.HTTPMethodNotAllowed):
            text += f" (allowed: {', '.join(sorted(exc.allowed_methods))})"
            return v2_error(exc.status, text, Allow=",".join(sorted(exc.allowed_methods)))
        return v2_error(exc.status, text)


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
        doc: dict[str, Any] = {"ready": d.ready}
        if "model" in request.match_info:
            if (missing := known(request)) is not None:
                return missing
            doc = {"name": d.model, **doc}
        return web.json_response(doc, status=200 if d.ready else 400)

    async def metadata(request: web.Request) -> web.Response:
        if (missing := known(request)) is not None:
            return missing
        return web.json_response(model_metadata(d.model, d.inputs, d.output))

    async def config(request: web.Request) -> web.Response:
        if (missing := known(request)) is not None:
            return missing
        meta = model_metadata(d.model, d.inputs, d.output)
        return web.json_response(model_config(meta, d.max_samples))

    async def stats(request: web.Request) -> web.Response:
        if (missing := known(request)) is not None:
            return missing
        return web.json_response(d.stats.document(d.model, VERSION))

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"models": [d.model]})

    async def index(_request: web.Request) -> web.Response:
        state = "READY" if d.ready else "UNAVAILABLE"
        return web.json_response([{"name": d.model, "version": VERSION, "state": state}])

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
        web.get(f"{model}/config", config),
        web.get(f"{versioned}/config", config),
        web.get(f"{model}/stats", stats),
        web.get(f"{versioned}/stats", stats),
        web.get("/v2/models", models),
        web.post("/v2/repository/index", index),
        web.post(f"{model}/infer", infer),
        web.post(f"{versioned}/infer", infer),
    ]


INLINE_BYTES = 16 * 1024  # bodies up to this size are parsed on the event loop


class ParseBusyError(Exception):
    """Every place in the parse pool's line is taken: shed the request (503)."""


class ParsePool:
    """Where v2 request bodies are parsed and split: off the event loop, in ``threads``
    threads, with at most ``waiting`` bodies in line (beyond: :class:`ParseBusyError`).

    A JSON body costs CPU in proportion to its size (``json.loads``, then flattening); on the
    event loop one large body held every other client and the readiness probe for seconds
    (issue 38). In a thread the loop keeps running: Python hands the GIL over every few
    milliseconds, so probes and small requests interleave with the parse, and the pool's
    single thread bounds what parsing may take from the loop to one thread's share. A
    process pool would isolate more, at the cost of copying every body (and its samples)
    between processes; the declared shapes are checked before any data is flattened and the
    body is capped at the plan's batch, so a parse is bounded anyway."""

    def __init__(
        self, *, threads: int = 1, waiting: int = 8, inline_bytes: int = INLINE_BYTES
    ) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="v2-parse")
        self.limit = threads + waiting
        self.pending = 0  # submitted and not finished (a cancelled caller's parse still runs)
        self.inline_bytes = inline_bytes

    async def run(self, fn: Callable[..., _T], *args: Any, size: int | None = None) -> _T:
        """``fn(*args)`` in the pool; inline when ``size`` (the bytes it works on) is at most
        :attr:`inline_bytes`: a small body parses in well under a millisecond, less than
        handing it to a thread and back costs (measured: benchmarks/serving/grpc_cpu.py)."""
        if size is not None and size <= self.inline_bytes:
            return fn(*args)
        if self.pending >= self.limit:
            raise ParseBusyError
        loop = asyncio.get_running_loop()
        self.pending += 1
        job = self._executor.submit(fn, *args)
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._done))
        return await asyncio.wrap_future(job)

    def _done(self) -> None:
        self.pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def parse_split(
    body: bytes,
    header: int | None,
    inputs: list[dict[str, Any]] | None,
    max_samples: int,
) -> tuple[InferRequest, list[tuple[bytes, str]]]:
    """In the parse pool: the request, checked against the model, and its samples."""
    req = parse_request(body, header, inputs, max_samples=max_samples)
    return req, split_samples(req, inputs, max_samples=max_samples)


def header_length(value: str | None) -> int | None:
    """The binary extension's header length (ASCII digits only: ``"²".isdigit()`` holds)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 12):
        raise V2Error(f"{HEADER_LENGTH} must be a number of bytes")
    return int(value)


async def _infer(d: Dispatcher, request: web.Request) -> web.StreamResponse:
    from packrat.serve.dispatcher.app import Stage

    start = time.perf_counter()
    track = Stage()
    header = request.headers.get(HEADER_LENGTH)
    # A batch of at most the plan's samples, each at most one sample's body.
    cap = min(d.batch_body_bytes, d.max_samples * d.max_body_bytes)
    admitted = await d.admit(request, start, track, cap=cap, arrival=False)
    if isinstance(admitted, web.Response):
        return as_v2(admitted)
    body, reserve = admitted
    try:
        try:
            req, samples = await d.parser.run(
                parse_split, body, header_length(header), d.inputs, d.max_samples, size=len(body)
            )
        except V2Error as exc:
            return d.finish(v2_error(400, str(exc)), start, "dispatcher")
        except ParseBusyError:
            busy = v2_error(503, "too many requests being parsed", **d.retry_headers())
            return d.finish(busy, start, "dispatcher")
        logged = body if d.payload_log is not None else b""  # else the samples hold the bytes
        del body

        def answered(response: web.Response, source: str) -> web.Response:
            """Counted, and logged as a /predictions answer is (the v2 request and answer)."""
            d.offer_log(request.headers, logged, response, start)
            return d.finish(response, start, source)

        # The queue is charged by samples (each takes a place), and so is the tuner's log.
        if not d.slots.admissible(len(samples)):
            full = v2_error(503, "queue full", **d.retry_headers())
            return d.finish(full, start, "dispatcher")
        d.arrivals.record(len(samples))
        # The samples run together; none is cancelled by a disconnect once any is forwarded
        # (each holds its slot until its worker answers), so the request is shielded whole.
        shield(request, True)
        try:
            answers = await asyncio.gather(
                *(d.run_sample(request, {"Content-Type": t}, b, track) for b, t in samples)
            )
        finally:
            shield(request, False)
        if any(a.gone for a in answers):
            d.metrics.cancelled.labels(d.model, track.stage).inc()
            return v2_error(499, "the client went away")
        canary = any(a.source == "canary" for a in answers)
        failed = next((a for a in answers if a.response.status != 200), None)
        if failed is not None:
            return answered(as_v2(failed.response, canary=canary), failed.source)
        outputs = [a.response.body if isinstance(a.response.body, bytes) else b"" for a in answers]
        try:
            payload, head = build_response(d.model, req, outputs, raw_bytes=d.inputs is None)
        except V2Error as exc:
            return answered(v2_error(400, str(exc)), "dispatcher")
        except ValueError as exc:  # answers that do not stack: the model's, not the client's
            return answered(v2_error(500, f"the model's answers: {exc}"), d.source)
        response = _response(payload, head)
        if canary:  # as /predictions marks an answer the canary gave
            response.headers[CANARY_HEADER] = "true"
        return answered(response, "canary" if canary else d.source)
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
