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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packrat.serve.modelservice import PRELOADED, ModelService, bad_request
from packrat.serve.modelservice import preload_model as _preload_model

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
# Models built before the fork by the pod's zygote (shared with the native runtime's workers).
_preloaded = PRELOADED
preload_model = _preload_model
_NativeService = ModelService
_bad_request = bad_request


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
