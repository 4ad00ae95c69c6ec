"""The worker-side handler: pins before loading, serves or delegates, errors per request."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from packrat.runtime import zoo
from packrat.serve.codec import encode_sample
from packrat.serve.torchserve import handler

CALLS: list[Any] = []


class FakeContext:
    def __init__(self, name: str, model_dir: Path) -> None:
        self.model_name = name
        self.system_properties = {"model_dir": str(model_dir)}
        self.statuses: dict[int, int] = {}
        self.types: dict[int, str] = {}

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.statuses[idx] = code

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.types[idx] = value


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    CALLS.clear()
    monkeypatch.setattr(handler, "_state", {})
    monkeypatch.setattr(
        "packrat.runtime.pinning.pin_current_process",
        lambda cpus, *, threads: CALLS.append(("pin", list(cpus), threads)),
    )
    cfg = tmp_path / "workers.json"
    cfg.write_text(json.dumps({"instances": {"m_i0": {"cpus": [0], "threads": 1, "batch": 2}}}))
    monkeypatch.setenv(handler.CONFIG_ENV, str(cfg))
    yield tmp_path


def test_native_model_is_pinned_then_loaded_and_errors_stay_per_request(fresh: Path) -> None:
    (fresh / handler.MODEL_FILE).write_text(
        json.dumps({"spec": "tiny", "inputs": zoo.input_spec("tiny")})
    )
    ctx = FakeContext("m_i0", fresh)
    assert handler.handle(None, ctx) is None
    assert CALLS == [("pin", [0], 1)]
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    rows = [
        {"body": bytearray(encode_sample([x[0]]))},
        {"body": bytearray(b"junk")},
        {"data": x[1].tolist()},  # TorchServe already parsed a JSON body
    ]
    out = handler.handle(rows, ctx)
    assert ctx.statuses == {1: 400}
    assert json.loads(out[1])["code"] == 400
    with torch.inference_mode():
        expected = zoo.load_model("tiny")(x)
    assert torch.allclose(torch.tensor(json.loads(out[0])), expected[0], atol=1e-5)
    assert torch.allclose(torch.tensor(json.loads(out[2])), expected[1], atol=1e-5)
    assert ctx.types == {0: "application/json", 1: "application/json", 2: "application/json"}


def test_unknown_instance_runs_unpinned(fresh: Path) -> None:
    (fresh / handler.MODEL_FILE).write_text(json.dumps({"spec": "tiny", "inputs": None}))
    handler.handle(None, FakeContext("other", fresh))
    assert CALLS == []


USER = """
from tests_user_calls import CALLS


class Mine:
    def initialize(self, context):
        CALLS.append("user-init")

    def handle(self, data, context):
        return [f"user:{len(data)}" for _ in data]
"""


def test_a_wrapped_user_handler_is_initialized_after_pinning(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fresh / "user_mod.py").write_text(USER)
    monkeypatch.syspath_prepend(str(fresh))
    monkeypatch.setitem(sys.modules, "tests_user_calls", sys.modules[__name__])
    monkeypatch.delitem(sys.modules, "user_mod", raising=False)
    (fresh / handler.WRAPPED_FILE).write_text(json.dumps({"handler": "user_mod.py"}))
    ctx = FakeContext("m_i0", fresh)
    handler.handle(None, ctx)
    assert CALLS == [("pin", [0], 1), "user-init"]
    assert handler.handle([{"body": b"a"}, {"body": b"b"}], ctx) == ["user:2", "user:2"]


def test_a_wrapped_function_handler(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (fresh / "fn_mod.py").write_text(
        "def go(data, context):\n    return None if data is None else ['fn'] * len(data)\n"
    )
    monkeypatch.syspath_prepend(str(fresh))
    monkeypatch.delitem(sys.modules, "fn_mod", raising=False)
    (fresh / handler.WRAPPED_FILE).write_text(json.dumps({"handler": "fn_mod:go"}))
    ctx = FakeContext("m_i0", fresh)
    handler.handle(None, ctx)
    assert handler.handle([{"body": b"a"}], ctx) == ["fn"]


def _native(fresh: Path, inputs: Any) -> FakeContext:
    (fresh / handler.MODEL_FILE).write_text(json.dumps({"spec": "tiny", "inputs": inputs}))
    ctx = FakeContext("m_i0", fresh)
    handler.handle(None, ctx)
    return ctx


def test_hostile_requests_fail_alone_in_their_batch(fresh: Path) -> None:
    """Deep nesting (RecursionError) and a 5,000-digit integer (ValueError) used to escape the
    handler and fail the whole batch of four."""
    ctx = _native(fresh, zoo.input_spec("tiny"))
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(2))
    rows = [
        {"body": bytearray(encode_sample([x[0]]))},
        {"body": bytearray(b"[" * 100_000 + b"]" * 100_000)},
        {"body": bytearray(("[" + "9" * 5000 + "]").encode())},
        {"data": x[1].tolist()},
        "not even a dict",
    ]
    out = handler.handle(rows, ctx)
    assert ctx.statuses == {1: 400, 2: 400, 4: 400}
    assert all(json.loads(out[i])["code"] == 400 for i in (1, 2, 4))
    assert len(json.loads(out[0])) == len(json.loads(out[3])) > 0


def test_a_request_the_model_rejects_fails_alone(fresh: Path) -> None:
    """Without an input description any numeric array decodes; the model itself then raises
    on the wrong width, for those requests only."""
    ctx = _native(fresh, None)
    good = torch.randn(2, 16, generator=torch.Generator().manual_seed(3))
    rows = [
        {"data": good[0].tolist()},
        {"data": [1.0, 2.0, 3.0]},
        {"data": good[1].tolist()},
        {"data": [4.0, 5.0, 6.0]},
    ]
    out = handler.handle(rows, ctx)
    assert ctx.statuses == {1: 400, 3: 400}
    assert "model failed" in json.loads(out[1])["message"]
    with torch.inference_mode():
        expected = zoo.load_model("tiny")(good)
    assert torch.allclose(torch.tensor(json.loads(out[2])), expected[1], atol=1e-5)
