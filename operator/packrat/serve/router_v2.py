"""The Open Inference Protocol's infer at a pipeline's router: ``POST /v2/models/{pipeline}/
infer`` treated as ``/predictions`` is (:mod:`packrat.serve.router`).

The request's tensors are split into samples as the dispatcher splits them
(:mod:`packrat.serve.dispatcher.v2_codec`), the sample shape and datatype read from the
request itself (the router does not know its first stage's inputs: that stage checks them);
each sample is one query through the DAG, one arrival in the pipeline's ingress (the stages'
tuners read it), with the same deadline and buffer budget as the request; the last stages'
answers (JSON rows) are stacked into ``output__0``. Errors are ``{"error": ...}``: 400 for a
malformed request, and a failed sample's status (a stage's 4xx, 502, 503, 504) otherwise.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from packrat.serve.dispatcher.v2 import HEADER_LENGTH, header_length
from packrat.serve.dispatcher.v2_codec import (
    V2Error,
    build_response,
    parse_request,
    request_spec,
    split_samples,
)

if TYPE_CHECKING:
    from packrat.serve.router import Held, Router

__all__ = ["MAX_SAMPLES", "infer"]

MAX_SAMPLES = 64  # samples in one request to a router (each a query through every stage)


def _samples(body: bytes, header: str | None) -> tuple[Any, list[tuple[bytes, str]]]:
    req = parse_request(body, header_length(header))
    spec = request_spec(req)
    return req, split_samples(req, spec, max_samples=MAX_SAMPLES)


async def infer(
    router: Router, request: web.Request, body: bytes, deadline: float, held: Held
) -> web.Response:
    from packrat.serve.router import Answer, StageFailedError

    try:
        # the router's body cap (6 MiB) bounds the parse; at most MAX_SAMPLES queries follow
        req, samples = await asyncio.to_thread(_samples, body, request.headers.get(HEADER_LENGTH))
    except V2Error as exc:
        return router.answer(400, {"error": str(exc)})
    router.arrivals.record(len(samples))  # each sample is a query of the pipeline
    paths: list[list[str]] = [[] for _ in samples]
    try:
        answers = await asyncio.gather(
            *(
                router.execute(Answer(b, t), deadline, path, held)
                for (b, t), path in zip(samples, paths, strict=True)
            )
        )
    except StageFailedError as exc:
        name = router.config.pipeline
        router.metrics.stage_failures.labels(name, exc.stage, exc.reason).inc()
        text = f"stage {exc.stage}: {exc.detail}"
        return router.answer(exc.status, {"error": text}, paths[0], retry=exc.status == 503)
    try:
        payload, head = build_response(
            router.config.pipeline, req, [a.body for a in answers], raw_bytes=False
        )
    except (V2Error, ValueError) as exc:
        return router.answer(502, {"error": f"the last stages' answers: {exc}"})
    router.metrics.requests.labels(router.config.pipeline, "200").inc()
    visited = list(dict.fromkeys(stage for path in paths for stage in path))
    headers = {"X-Packrat-Path": ",".join(visited)}
    if head is not None:
        headers[HEADER_LENGTH] = str(head)
    ctype = "application/json" if head is None else "application/octet-stream"
    return web.Response(body=payload, headers=headers, content_type=ctype)
