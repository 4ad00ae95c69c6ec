"""A ``.mar``'s model on a converted engine, its handler's Python kept around it.

TorchServe's handlers (its ``BaseHandler`` and most users' own) build their network in
``initialize`` as ``self.model`` and call it from ``inference``. Such a module is converted
like any model, once per engine, and swapped into the loaded handler as a small
:class:`EngineModule` that runs the engine's artefact: the handler's pre- and
post-processing run unchanged around it, in the profile and in the serving worker alike.

What the engines need and a ``.mar`` does not declare, the module's inputs (shapes without
the batch dimension, dtypes), is captured by :func:`capture`: the archive's sample request
is run through the handler once as a batch of two requests, a forward pre-hook on the
module recording what it is called with. The inputs are kept beside the artefacts
(``<model>-<digest16>/handler-inputs.json``) so that a serving pod, which has no sample
request, finds the same artefact folder (:func:`recorded_inputs`).

A handler without an ``nn.Module`` ``model`` attribute, or one whose module is called in a
way no engine takes (keyword arguments, non-tensor arguments, no batch dimension), is
:class:`HandlerModuleError`: one line, the reason; the archive is served eager.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from packrat.runtime.engines.base import EngineError, InputSpec, Runner
from packrat.runtime.engines.cache import model_folder, read_manifest

log = logging.getLogger(__name__)

INPUTS_FILE = "handler-inputs.json"
CAPTURE_BATCH = 2  # requests in the capturing batch: the module's first dimension must sum to it
_FOLLOW = ("entry", "_entry_point", "_handle_fn", "_service", "service", "handler")


class HandlerModuleError(EngineError):
    """The handler exposes no module an engine can take (the archive runs eager)."""


@dataclass(frozen=True, slots=True)
class Captured:
    """The handler's module and what it was called with for the sample request."""

    owner: Any  # the handler object whose ``model`` it is
    module: nn.Module
    inputs: tuple[InputSpec, ...]
    sample: tuple[Tensor, ...]  # the module's arguments for CAPTURE_BATCH requests


def handler_owner(entry: Any) -> Any:
    """The handler object with an ``nn.Module`` ``model`` that ``entry`` (TorchServe's
    entry point: a handler's bound ``handle``, a request envelope's, Packrat's wrapper's or
    a module-level function) ends up calling; HandlerModuleError when there is none.

    A bounded walk over what the entry point holds: a bound method's object, the wrappers'
    entry attributes, and for a function its module's objects (a function handler's
    ``_service = MyHandler()``, Packrat's wrapper's state)."""
    todo: list[Any] = [entry]
    seen: set[int] = set()
    while todo and len(seen) < 256:
        obj = todo.pop(0)
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(_attr(obj, "model"), nn.Module) and not isinstance(obj, types.ModuleType):
            return obj
        owner = _attr(obj, "__self__")
        if owner is not None and not isinstance(owner, types.ModuleType):
            todo.append(owner)
        if isinstance(obj, dict):
            todo += list(obj.values())[:16]
        elif not isinstance(obj, (types.ModuleType, type)):
            todo += [_attr(obj, name) for name in _FOLLOW]
        if isinstance(obj, types.FunctionType):
            module = sys.modules.get(obj.__module__)
            names = vars(module) if module is not None else {}
            todo += [v for k, v in names.items() if not k.startswith("__") and _instance(v)]
    raise HandlerModuleError("the handler has no torch.nn.Module `model` attribute")


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # a property of a user's object that raises: not a path to a model
        return None


def _instance(value: Any) -> bool:
    kinds = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
    return not isinstance(value, kinds)


def input_specs(calls: Sequence[tuple[Any, ...]], *, requests: int) -> tuple[InputSpec, ...]:
    """The engines' input specs from the module's calls for ``requests`` requests: every
    argument a tensor, the first dimension the batch (the same across a call's arguments and
    summing to ``requests`` over the calls), the rest the same in every call."""
    if not calls:
        raise HandlerModuleError("the handler never called its model for the sample request")
    for args in calls:
        if not args or not all(isinstance(a, Tensor) for a in args):
            kinds = ", ".join(type(a).__name__ for a in args) or "nothing"
            raise HandlerModuleError(f"the handler calls its model with {kinds}, not tensors")
        if any(a.dim() == 0 for a in args) or len({a.shape[0] for a in args}) != 1:
            shapes = ", ".join(str(list(a.shape)) for a in args)
            raise HandlerModuleError(f"the model's inputs {shapes} share no batch dimension")
    layouts = {tuple((tuple(a.shape[1:]), a.dtype) for a in args) for args in calls}
    if len(layouts) != 1:
        raise HandlerModuleError("the handler calls its model with inputs of varying shape")
    total = sum(int(args[0].shape[0]) for args in calls)
    if total != requests:
        raise HandlerModuleError(
            f"the model's first dimension is {total} for {requests} requests: not a batch"
        )
    return tuple(_spec(t) for t in _batched(calls))


def _batched(calls: Sequence[tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """The calls' arguments as one batch (a handler that called its model per request)."""
    return tuple(torch.cat([args[i] for args in calls]) for i in range(len(calls[0])))


def _spec(tensor: Tensor) -> InputSpec:
    dtype = str(tensor.dtype).removeprefix("torch.")
    high = 0
    if not tensor.dtype.is_floating_point and tensor.dtype != torch.bool and tensor.numel():
        high = int(tensor.max()) + 1  # random ids for the gate stay below what it was given
    return InputSpec(tuple(int(d) for d in tensor.shape[1:]), dtype, max(high, 0))


def capture(service: Any, body: bytes, *, content_type: str) -> Captured:
    """Run ``body`` through the loaded handler (:class:`packrat.runtime.mar.HandlerService`)
    as a batch of :data:`CAPTURE_BATCH` requests, recording the module's calls."""
    owner = handler_owner(service.service._entry_point)
    module: nn.Module = owner.model
    calls: list[tuple[Any, ...]] = []
    keywords: list[str] = []

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        keywords.extend(kwargs)  # said after the batch: TorchServe turns a raise into a 503
        calls.append(tuple(a.detach().clone() if isinstance(a, Tensor) else a for a in args))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        service.predict([body] * CAPTURE_BATCH, content_type=content_type)
    except Exception as exc:
        raise HandlerModuleError(f"the sample request failed: {exc}".splitlines()[0]) from None
    finally:
        handle.remove()
    if keywords:
        names = ", ".join(dict.fromkeys(keywords))
        raise HandlerModuleError(f"the handler calls its model with keyword arguments ({names})")
    specs = input_specs(calls, requests=CAPTURE_BATCH)
    return Captured(owner=owner, module=module, inputs=specs, sample=_batched(calls))


class EngineModule(nn.Module):
    """What the handler calls as its ``model`` once swapped: the engine's runner for inputs
    shaped as captured, the eager module for any other (a request the sample did not cover
    is answered, by eager, rather than failed by an engine that fixed that shape)."""

    def __init__(self, runner: Runner, eager: nn.Module, inputs: Sequence[InputSpec]) -> None:
        super().__init__()
        self.runner = runner
        self.eager = [eager]  # not a submodule: its weights are not this module's
        self.inputs = tuple(inputs)
        self.fell_back = 0

    def forward(self, *args: Any) -> Any:
        if self._matches(args):
            return self.runner.run(args)
        if not self.fell_back:
            log.warning("packrat: an input the engine was not converted for: ran eager")
        self.fell_back += 1
        return self.eager[0](*args)

    def _matches(self, args: tuple[Any, ...]) -> bool:
        return len(args) == len(self.inputs) and all(
            isinstance(a, Tensor)
            and tuple(a.shape[1:]) == s.shape
            and str(a.dtype).removeprefix("torch.") == s.dtype
            for a, s in zip(args, self.inputs, strict=True)
        )


def swap(service: Any, runner: Runner, inputs: Sequence[InputSpec]) -> EngineModule:
    """Make the loaded handler call ``runner`` as its model (its eager module kept for
    inputs the artefact was not made for)."""
    owner = handler_owner(service.service._entry_point)
    module = owner.model
    eager = module.eager[0] if isinstance(module, EngineModule) else module
    wrapped = EngineModule(runner, eager, inputs)
    owner.model = wrapped
    return wrapped


def artefact_inputs(artefact: Path) -> tuple[InputSpec, ...]:
    """The inputs an artefact was converted for (its manifest's)."""
    manifest = read_manifest(artefact.parent)
    if manifest is None:
        raise EngineError(f"{artefact.parent}: not a converted artefact (no manifest)")
    return tuple(InputSpec.from_dict(item) for item in manifest.get("inputs", []))


def record_inputs(root: Path, *, name: str, digest: str, inputs: Sequence[InputSpec]) -> None:
    """Keep the captured inputs beside the model's artefacts (written whole, renamed)."""
    folder = model_folder(root, name=name, digest=digest)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{INPUTS_FILE}.tmp"
    tmp.write_text(json.dumps({"inputs": [i.to_dict() for i in inputs]}) + "\n")
    tmp.replace(folder / INPUTS_FILE)


def recorded_inputs(root: Path, *, name: str, digest: str) -> tuple[InputSpec, ...] | None:
    """The inputs :func:`record_inputs` kept for this archive, or None."""
    try:
        data = json.loads((model_folder(root, name=name, digest=digest) / INPUTS_FILE).read_text())
        return tuple(InputSpec.from_dict(item) for item in data["inputs"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError):
        return None  # a spoiled file: as if none (the pod says to profile again)
    except RecursionError:
        return None
