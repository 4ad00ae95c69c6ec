"""KServe's v1 protocol at the dispatcher: ``POST /v1/models/{name}:predict`` with
``{"instances": [...]}``, answered ``{"predictions": [...]}``.

Each instance is one sample, sent to the model as a JSON body (the nested list
``/predictions`` takes as JSON; a ``.mar`` handler gets it as TorchServe would), so a v1
request takes the v2 path's steps: parsed in the parse pool, at most the plan's batch of
instances, its samples charged to the queue and the tuner's arrivals, through the canary
split and into the request log. Errors are ``{"error": ...}`` (KServe's v1 shape): 400 for a
malformed request or a sample the model refused, 404 for another model, 503 when shed.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from packrat.serve.dispatcher.connections import shield
from packrat.serve.dispatcher.v2 import ParseBusyError, as_v2, message_of, v2_error

if TYPE_CHECKING:
    from packrat.serve.dispatcher.app import Dispatcher

__all__ = ["V1Error", "instances_of", "v1_predict"]


class V1Error(ValueError):
    """A malformed v1 request: 400."""


def instances_of(body: bytes, max_samples: int) -> list[bytes]:
    """The JSON body of each instance (runs in the parse pool)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise V1Error("the request is not valid JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
        raise V1Error('the request must be {"instances": [...]}')
    instances = doc["instances"]
    if not 1 <= len(instances) <= max_samples:
        raise V1Error(f"a request carries 1..{max_samples} instances, got {len(instances)}")
    try:
        return [json.dumps(i, separators=(",", ":")).encode() for i in instances]
    except (ValueError, RecursionError):
        raise V1Error("an instance cannot be written as JSON") from None


async def v1_predict(d: Dispatcher, request: web.Request) -> web.StreamResponse:
    """The route's handler (the model's name checked here)."""
    from packrat.serve.dispatcher.app import Stage

    name = request.match_info["model"]
    if name != d.model:
        return v2_error(404, f"model {name!r} not found; this server serves {d.model!r}")
    start, track = time.perf_counter(), Stage()
    cap = min(d.batch_body_bytes, d.max_samples * d.max_body_bytes)
    admitted = await d.admit(request, start, track, cap=cap, arrival=False)
    if isinstance(admitted, web.Response):
        return as_v2(admitted)  # already counted; a refused body's connection closes
    body, reserve = admitted
    try:
        try:
            samples = await d.parser.run(instances_of, body, d.max_samples, size=len(body))
        except V1Error as exc:
            return d.finish(v2_error(400, str(exc)), start, "dispatcher")
        except ParseBusyError:
            busy = v2_error(503, "too many requests being parsed", **d.retry_headers())
            return d.finish(busy, start, "dispatcher")
        if not d.slots.admissible(len(samples)):
            return d.finish(v2_error(503, "queue full", **d.retry_headers()), start, "dispatcher")
        d.arrivals.record(len(samples))
        shield(request, True)
        try:
            headers = {"Content-Type": "application/json"}
            answers = await asyncio.gather(
                *(d.run_sample(request, headers, s, track) for s in samples)
            )
        finally:
            shield(request, False)
        response = _answer(answers)
        d.offer_log(request.headers, body, response, start)
        source = "canary" if any(a.source == "canary" for a in answers) else d.source
        return d.finish(response, start, source)
    except asyncio.CancelledError:
        d.metrics.cancelled.labels(d.model, track.stage).inc()
        raise
    finally:
        d.budget.release(reserve)


def _answer(answers: list[Any]) -> web.Response:
    failed = next((a for a in answers if a.response.status != 200), None)
    if failed is not None:
        return v2_error(failed.response.status, message_of(failed.response))
    predictions = []
    for a in answers:
        raw = a.response.body if isinstance(a.response.body, bytes) else b""
        try:
            predictions.append(json.loads(raw))
        except ValueError:
            predictions.append(raw.decode("utf-8", "replace"))  # a .mar's text answer
    body = json.dumps({"predictions": predictions}).encode()
    return web.Response(body=body, content_type="application/json")
