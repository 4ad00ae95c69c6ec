"""The model service both runtimes run in a worker: a zoo model or TorchScript file, one
request one sample, decoded per request so that a malformed request fails alone.

TorchServe's worker calls it through Packrat's handler (:mod:`packrat.serve.torchserve.handler`);
the native runtime's worker (:mod:`packrat.serve.native.worker`) calls it directly. Either way a
batch is a list of rows (``{"body": value}`` or ``{"data": value}``, the value raw bytes or JSON
already parsed) and a context that records each request's status and content type (TorchServe's
own context, or :class:`BatchContext`), so a request fails the same way on both: a 400 of its
own, the rest of its batch answered.

Models built before a fork (the pod's zygote, :mod:`packrat.serve.zygote.zygote`) are kept in
:data:`PRELOADED`, by (spec, weight file), for the forked workers to use as they are.

Imports torch lazily.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

__all__ = ["PRELOADED", "BatchContext", "ModelService", "bad_request", "preload_model"]

log = logging.getLogger(__name__)

# Models built before the fork by the pod's zygote, by (spec, weight file).
PRELOADED: dict[tuple[str, str], Any] = {}


def preload_model(spec: str, weights: Path, *, built: Any = None) -> None:
    """A zoo model with its weights mapped from ``weights`` (``built``, or built here without
    running a torch operation), for forked workers to use as they are."""
    from packrat.runtime import modelid
    from packrat.runtime.weights import load_shared

    if modelid.is_zoo_name(spec):
        model = built if built is not None else load_shared(spec, weights)
        PRELOADED[(spec, str(weights))] = model


class BatchContext:
    """Each request's status and content type, as a handler sets them (the part of
    TorchServe's context :class:`ModelService` uses)."""

    def __init__(self, size: int) -> None:
        self.statuses: list[int] = [200] * size
        self.types: list[str] = ["application/json"] * size

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.statuses[idx] = int(code)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.types[idx] = value


class ModelService:
    """A zoo model or TorchScript file (``spec`` as ``packrat_model.json`` has it), loaded
    once: from the pod's weight file when there is one (mapped, shared), else privately."""

    def __init__(
        self,
        spec: dict[str, Any],
        model_dir: Path,
        weights: Path | None,
        *,
        engine: str = "eager",
        threads: int = 1,
    ) -> None:
        import torch

        from packrat.runtime.zoo import load_model

        self.torch = torch
        source = str(spec["spec"])
        if spec.get("file"):  # a TorchScript file shipped beside the spec
            source = str(model_dir / source)
        start = time.monotonic()
        self.engine = engine
        self.runner: Any = None
        self.inputs: list[dict[str, Any]] | None = spec.get("inputs")
        if (
            engine != "eager"
        ):  # the profiling Job's converted artefact, loaded here (after the fork)
            from packrat.runtime.engines.cache import load_converted

            self.runner, path = load_converted(source, engine, threads=threads)
            self.model: Any = None
            log.info(
                "packrat: engine %s loaded in %.3f s from %s",
                engine,
                time.monotonic() - start,
                path,
            )
            return
        if weights is not None:  # map the pod's one copy (packrat.runtime.weights)
            from packrat.runtime.weights import load_shared, mapped_bytes

            self.model = PRELOADED.get((source, str(weights))) or load_shared(source, weights)
            fraction = mapped_bytes(self.model, weights).fraction
            how = f"{fraction:.0%} mapped from {weights.name}"
            if (source, str(weights)) in PRELOADED:
                how += ", built before the fork"
                if fraction == 0:  # the native zygote's own copy, its file written behind
                    how = "built before the fork, shared with the zygote"
        else:
            self.model = load_model(source).eval()
            how = "private copy"
        log.info("packrat: model loaded in %.3f s (%s)", time.monotonic() - start, how)

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        """One answer per request; a request that fails (decoding or in the model) gets a 400
        of its own and the rest of the batch is answered normally."""
        from packrat.serve.codec import decode_sample

        samples: list[tuple[int, list[Any]]] = []
        out: list[Any] = [None] * len(data)
        for idx, row in enumerate(data):
            try:
                body = row.get("data", row.get("body")) if isinstance(row, dict) else row
                samples.append((idx, decode_sample(body, self.inputs)))
            except Exception as exc:  # CodecError, or anything a hostile row trips over
                out[idx] = bad_request(context, idx, str(exc) or type(exc).__name__)
        groups: dict[tuple[tuple[int, ...], ...], list[tuple[int, list[Any]]]] = {}
        for item in samples:
            key = tuple(tuple(t.shape) for t in item[1])
            groups.setdefault(key, []).append(item)
        for items in groups.values():
            try:
                self._run(items, out, context)
            except Exception as exc:
                if len(items) == 1:
                    log.warning("packrat: the model failed on one request: %s", exc)
                    out[items[0][0]] = bad_request(context, items[0][0], f"model failed: {exc}")
                    continue
                # One request may have broken the whole batch: run each alone to find it.
                for item in items:
                    try:
                        self._run([item], out, context)
                    except Exception as one:
                        log.warning("packrat: the model failed on one request: %s", one)
                        out[item[0]] = bad_request(context, item[0], f"model failed: {one}")
        return out

    def _run(self, items: list[tuple[int, list[Any]]], out: list[Any], context: Any) -> None:
        from packrat.serve.codec import encode_output

        torch = self.torch
        arity = len(items[0][1])
        batch = [torch.stack([s[i] for _, s in items]) for i in range(arity)]
        if self.runner is not None:
            result = self.runner.run(batch)
        else:
            with torch.inference_mode():
                result = self.model(*batch)
        answers = [encode_output(result, row) for row in range(len(items))]
        for (idx, _), answer in zip(items, answers, strict=True):
            out[idx] = answer
            context.set_response_content_type(idx, "application/json")


def bad_request(context: Any, idx: int, message: str) -> str:
    """Request ``idx`` of the batch is a 400 of its own, with TorchServe's error shape."""
    context.set_response_status(code=400, phrase="Bad Request", idx=idx)
    context.set_response_content_type(idx, "application/json")
    return json.dumps({"code": 400, "type": "BadRequest", "message": message[:500]})
