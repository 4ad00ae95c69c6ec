"""A .mar handler's module for the engines (packrat.runtime.engines.handler): found behind
every kind of TorchServe entry point, its inputs captured from the sample request with the
batch dimension checked, swapped for an engine's runner (eager kept for inputs the artefact
was not made for), and its captured inputs kept where a serving pod finds its artefact."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from packrat.runtime import engines
from packrat.runtime.engines import cache
from packrat.runtime.engines.base import InputSpec
from packrat.runtime.engines.handler import (
    EngineModule,
    HandlerModuleError,
    artefact_inputs,
    capture,
    handler_owner,
    input_specs,
    record_inputs,
    recorded_inputs,
    swap,
)


class LinearHandler:
    """TorchServe's BaseHandler convention: ``self.model``, called from ``handle``."""

    def __init__(self, per_request: bool = False, kwargs: bool = False) -> None:
        torch.manual_seed(0)
        self.model: Any = nn.Linear(8, 4).eval()
        self.per_request = per_request
        self.kwargs = kwargs

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        x = torch.tensor([row["body"] for row in data], dtype=torch.float32)
        with torch.inference_mode():
            if self.per_request:
                y = torch.cat([self.model(x[i : i + 1]) for i in range(len(x))])
            elif self.kwargs:
                y = self.model(input=x)
            else:
                y = self.model(x)
        return [json.dumps(row) for row in y.tolist()]


class Envelope:
    """TorchServe's request envelopes keep the handler's entry as ``_handle_fn``."""

    def __init__(self, handle_fn: Callable[..., Any]) -> None:
        self._handle_fn = handle_fn

    def handle(self, data: Any, context: Any) -> Any:
        return self._handle_fn(data, context)


class FakeService:
    """What :func:`capture` uses of :class:`packrat.runtime.mar.HandlerService`."""

    def __init__(self, entry: Callable[..., Any]) -> None:
        self.service = types.SimpleNamespace(_entry_point=entry)
        self.handler = "linear_handler.py"

    def predict(self, bodies: Sequence[bytes], *, content_type: str) -> int:
        rows = [{"body": json.loads(b)} for b in bodies]
        self.answers = self.service._entry_point(rows, None)
        return 200


BODY = json.dumps([0.5] * 8).encode()


def test_the_owner_is_found_behind_a_bound_method_an_envelope_and_a_function() -> None:
    handler = LinearHandler()
    assert handler_owner(handler.handle) is handler
    assert handler_owner(Envelope(handler.handle).handle) is handler
    module = types.ModuleType("user_function_handler")
    module._service = handler  # type: ignore[attr-defined]  # a function handler's module

    def handle(data: Any, context: Any) -> Any:
        return None

    handle.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        assert handler_owner(handle) is handler
    finally:
        del sys.modules[module.__name__]


def test_a_handler_without_a_module_is_one_line() -> None:
    class NoModel:
        def __init__(self) -> None:
            self.model = lambda x: x  # callable, but no nn.Module: nothing to convert

        def handle(self, data: Any, context: Any) -> Any:
            return data

    with pytest.raises(HandlerModuleError, match=r"no torch.nn.Module `model`") as info:
        handler_owner(NoModel().handle)
    assert len(str(info.value).splitlines()) == 1


def test_capture_records_the_inputs_without_the_batch_dimension() -> None:
    handler = LinearHandler()
    captured = capture(FakeService(handler.handle), BODY, content_type="application/json")
    assert captured.owner is handler and captured.module is handler.model
    assert captured.inputs == (InputSpec((8,), "float32"),)
    (x,) = captured.sample
    assert tuple(x.shape) == (2, 8) and torch.all(x == 0.5)
    assert handler.model._forward_pre_hooks == {}  # the hook is removed


def test_a_handler_calling_its_model_per_request_still_has_a_batch_dimension() -> None:
    captured = capture(
        FakeService(LinearHandler(per_request=True).handle), BODY, content_type="application/json"
    )
    assert captured.inputs == (InputSpec((8,), "float32"),)
    assert tuple(captured.sample[0].shape) == (2, 8)


def test_keyword_arguments_are_not_converted() -> None:
    with pytest.raises(HandlerModuleError, match="keyword arguments"):
        capture(FakeService(LinearHandler(kwargs=True).handle), BODY, content_type="x")


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ([], "never called"),
        ([(torch.zeros(3, 8),)], "first dimension is 3 for 2 requests"),
        ([(torch.zeros(8),)], "first dimension is 8"),
        ([(torch.zeros(2, 8), torch.zeros(3, 8))], "share no batch dimension"),
        ([(torch.zeros(2, 8), "text")], "str, not tensors"),
        ([(torch.zeros(1, 8),), (torch.zeros(1, 9),)], "varying shape"),
    ],
)
def test_inputs_that_are_not_a_batch_are_refused(
    calls: list[tuple[Any, ...]], message: str
) -> None:
    with pytest.raises(HandlerModuleError, match=message):
        input_specs(calls, requests=2)


def test_token_ids_keep_an_upper_bound_for_the_gates_random_batches() -> None:
    ids = torch.tensor([[3, 7, 1], [0, 2, 9]])
    (spec,) = input_specs([(ids,)], requests=2)
    assert spec == InputSpec((3,), "int64", 10)


class Doubling:
    """A runner that is not eager (its answers twice eager's), to see which one ran."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.calls = 0

    def run(self, inputs: Sequence[Tensor]) -> Tensor:
        self.calls += 1
        with torch.inference_mode():
            return self.module(*inputs) * 2  # type: ignore[no-any-return]

    def memory(self) -> dict[str, int]:
        return {}


def test_swap_runs_the_engine_and_eager_for_inputs_it_was_not_made_for() -> None:
    handler = LinearHandler()
    eager = handler.model
    service = FakeService(handler.handle)
    runner = Doubling(eager)
    swapped = swap(service, runner, [InputSpec((8,), "float32")])
    assert handler.model is swapped and isinstance(swapped, EngineModule)
    x = torch.full((3, 8), 0.5)
    with torch.inference_mode():
        assert torch.allclose(swapped(x), eager(x) * 2) and runner.calls == 1
        other = torch.full((3, 2, 8), 0.5)  # not the captured shape: eager answers it
        assert torch.allclose(swapped(other), eager(other))
        assert swapped.fell_back == 1 and runner.calls == 1
    assert list(swapped.parameters()) == []  # eager's weights are not the wrapper's
    again = swap(service, Doubling(eager), [InputSpec((8,), "float32")])
    assert again.eager[0] is eager  # swapping twice keeps the original module


def test_captured_inputs_find_the_archives_artefact(tmp_path: Path) -> None:
    engine = engines.engine(engines.EAGER)
    digest = "sha256:" + "ab" * 32
    with pytest.raises(engines.EngineError, match="profile it with packrat profile"):
        cache.find_for_archive(tmp_path, name="linear", digest=digest, engine=engine)
    specs = (InputSpec((8,), "float32"),)
    record_inputs(tmp_path, name="linear", digest=digest, inputs=specs)
    assert recorded_inputs(tmp_path, name="linear", digest=digest) == specs
    assert recorded_inputs(tmp_path, name="linear", digest="sha256:" + "cd" * 32) is None
    made = cache.converted(
        engine,
        root=tmp_path,
        model_name="linear",
        digest=digest,
        inputs=specs,
        build=lambda: nn.Linear(8, 4),
    )
    found = cache.find_for_archive(tmp_path, name="linear", digest=digest, engine=engine)
    assert found.folder == made.folder and found.inputs == specs
    assert made.folder is not None
    assert artefact_inputs(made.folder / "model.onnx") == specs  # read from its manifest
