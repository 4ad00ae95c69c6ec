"""The TorchServe handler every Packrat worker runs: pin first, then load and serve.

TorchServe starts one Python worker per registered model instance; the worker imports the
archive's handler and calls it once with ``data=None`` to initialize. Packrat's archives name
:func:`handle` (through a one-line ``packrat_entry.py``), so the very first thing a worker does
is read its instance's core set (looked up by the registered model name in the file that
``PACKRAT_SERVE_CONFIG`` names) and pin itself, before any model weight is loaded or any
thread pool is started. Then it either:

- serves a zoo model or TorchScript file natively (``packrat_model.json`` in the archive):
  one request = one sample, JSON or raw little-endian bytes, decoded per request so that a
  malformed request fails alone (400 for that request, the rest of the batch is answered); or
- delegates to the user's own handler from a wrapped ``.mar`` (``packrat_wrapped.json`` names
  it), loaded exactly as TorchServe would load it, so user handlers work unchanged. A user
  handler owns its whole batch: if it raises, TorchServe answers every request of that batch
  with an error (and only that batch); per-request isolation is the user handler's job.

Runs inside TorchServe's worker process; imports torch and ``ts`` lazily.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONFIG_ENV = "PACKRAT_SERVE_CONFIG"
MODEL_FILE = "packrat_model.json"
WRAPPED_FILE = "packrat_wrapped.json"
ENTRY_MODULE = "packrat_entry"
ENTRY_SOURCE = (
    '"""Packrat entry point: pin this worker to its cores, then serve\n'
    '(packrat.serve.torchserve.handler)."""\n'
    "from packrat.serve.torchserve.handler import handle  # noqa: F401\n"
)

_state: dict[str, Any] = {}  # this worker's service, created by the first (init) call
# Models built before the fork by the pod's zygote (packrat.serve.zygote.zygote), by (spec, file).
_preloaded: dict[tuple[str, str], Any] = {}


def preload_model(spec: str, weights: Path, *, built: Any = None) -> None:
    """A zoo model with its weights mapped from ``weights`` (``built``, or built here without
    running a torch operation), for forked workers to use as they are."""
    from packrat.runtime import modelid
    from packrat.runtime.weights import load_shared

    if modelid.is_zoo_name(spec):
        model = built if built is not None else load_shared(spec, weights)
        _preloaded[(spec, str(weights))] = model


def instance_settings(model_name: str, config_path: str | None) -> dict[str, Any] | None:
    """This worker's ``{"cpus": [...], "threads": t, "batch": b}``, or None when unpinned."""
    if not config_path:
        return None
    data = json.loads(Path(config_path).read_text())
    entry = data.get("instances", {}).get(model_name)
    return entry if isinstance(entry, dict) else None


def pod_weights(config_path: str | None) -> Path | None:
    """The pod's shared weight file (``"weights"`` in the settings file), if it has one."""
    if not config_path:
        return None
    path = json.loads(Path(config_path).read_text()).get("weights")
    return Path(path) if isinstance(path, str) and path else None


def handle(data: Any, context: Any) -> Any:
    """TorchServe's function entry point (``data is None`` means initialize)."""
    service = _state.get("service")
    if service is None:
        service = _state["service"] = _initialize(context)
    if data is None:
        return None
    return service.handle(data, context)


def _initialize(context: Any) -> Any:
    settings = instance_settings(context.model_name, os.environ.get(CONFIG_ENV))
    if settings is not None:
        from packrat.runtime.pinning import pin_current_process

        pin_current_process(settings["cpus"], threads=int(settings["threads"]))
        log.info(
            "packrat: %s pinned to cpus %s with %s threads (pid %d)",
            context.model_name,
            settings["cpus"],
            settings["threads"],
            os.getpid(),
        )
    else:
        log.info("packrat: %s runs unpinned (no instance settings)", context.model_name)
    model_dir = Path(context.system_properties.get("model_dir", "."))
    wrapped = model_dir / WRAPPED_FILE
    if wrapped.exists():
        spec = json.loads(wrapped.read_text())
        return _WrappedService(str(spec["handler"]), context)
    spec = json.loads((model_dir / MODEL_FILE).read_text())
    return _NativeService(spec, model_dir, pod_weights(os.environ.get(CONFIG_ENV)))


# -- a user's handler, loaded the way TorchServe loads it -----------------------------------
class _WrappedService:
    def __init__(self, handler: str, context: Any) -> None:
        self.entry: Callable[[Any, Any], Any]
        module_name, _, function_name = handler.partition(":")
        module_name = module_name.removesuffix(".py").split("/")[-1]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = importlib.import_module(f".{module_name}", "ts.torch_handler")
        function_name = function_name or "handle"
        if hasattr(module, function_name):
            self.entry = getattr(module, function_name)
            self.entry(None, context)
            return
        from ts.utils.util import list_classes_from_module

        classes = list_classes_from_module(module)
        if len(classes) != 1:
            raise ValueError(f"expected exactly one handler class in {handler}, found {classes}")
        instance = classes[0]()
        instance.initialize(context)
        self.entry = instance.handle

    def handle(self, data: Any, context: Any) -> Any:
        return self.entry(data, context)


# -- zoo models and TorchScript files ------------------------------------------------------
class _NativeService:
    def __init__(self, spec: dict[str, Any], model_dir: Path, weights: Path | None) -> None:
        import torch

        from packrat.runtime.zoo import load_model

        self.torch = torch
        source = str(spec["spec"])
        if spec.get("file"):  # a TorchScript file shipped inside the archive
            source = str(model_dir / source)
        start = time.monotonic()
        if weights is not None:  # map the pod's one copy (packrat.runtime.weights)
            from packrat.runtime.weights import load_shared, mapped_bytes

            self.model = _preloaded.get((source, str(weights))) or load_shared(source, weights)
            how = f"{mapped_bytes(self.model, weights).fraction:.0%} mapped from {weights.name}"
            if (source, str(weights)) in _preloaded:
                how += ", built before the fork"
        else:
            self.model = load_model(source).eval()
            how = "private copy"
        log.info("packrat: model loaded in %.3f s (%s)", time.monotonic() - start, how)
        self.inputs: list[dict[str, Any]] | None = spec.get("inputs")

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[Any]:
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
                out[idx] = _bad_request(context, idx, str(exc) or type(exc).__name__)
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
                    out[items[0][0]] = _bad_request(context, items[0][0], f"model failed: {exc}")
                    continue
                # One request may have broken the whole batch: run each alone to find it.
                for item in items:
                    try:
                        self._run([item], out, context)
                    except Exception as one:
                        log.warning("packrat: the model failed on one request: %s", one)
                        out[item[0]] = _bad_request(context, item[0], f"model failed: {one}")
        return out

    def _run(self, items: list[tuple[int, list[Any]]], out: list[Any], context: Any) -> None:
        from packrat.serve.codec import encode_output

        torch = self.torch
        arity = len(items[0][1])
        batch = [torch.stack([s[i] for _, s in items]) for i in range(arity)]
        with torch.inference_mode():
            result = self.model(*batch)
        answers = [encode_output(result, row) for row in range(len(items))]
        for (idx, _), answer in zip(items, answers, strict=True):
            out[idx] = answer
            context.set_response_content_type(idx, "application/json")


def _bad_request(context: Any, idx: int, message: str) -> str:
    context.set_response_status(code=400, phrase="Bad Request", idx=idx)
    context.set_response_content_type(idx, "application/json")
    return json.dumps({"code": 400, "type": "BadRequest", "message": message[:500]})
