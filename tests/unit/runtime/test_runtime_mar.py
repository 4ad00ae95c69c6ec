"""Reading TorchServe's worker-to-frontend prediction message, as the native runtime does for
a user's .mar: the messages are made by TorchServe's own ``create_predict_response``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from packrat.runtime.mar import HandlerError, parse_predict_response, request_value

otf = pytest.importorskip("ts.protocol.otf_message_handler", reason="needs TorchServe's ts")


class _Context:
    """The part of TorchServe's context ``create_predict_response`` reads."""

    stopping_criteria = None

    def __init__(self, statuses: dict[int, tuple[int, str]], types: dict[int, str]) -> None:
        self.statuses, self.types = statuses, types

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return {"X-Idx": str(idx)}

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        pass

    def get_response_content_type(self, idx: int) -> str | None:
        return self.types.get(idx)

    def get_response_status(self, idx: int) -> tuple[int | None, str | None]:
        return self.statuses.get(idx, (None, None))


def test_each_requests_status_type_and_body_are_read() -> None:
    ids = {0: "a", 1: "b", 2: "c"}
    context: Any = _Context({1: (400, "Bad Request")}, {0: "application/json", 1: "text/plain"})
    message = otf.create_predict_response(
        ['{"x": 1}', b"\x00bad", {"y": [1, 2]}], ids, "Prediction success", 200, context=context
    )
    code, text, answers = parse_predict_response(bytes(message))
    assert (code, text) == (200, "Prediction success")
    assert answers[0] == (200, "application/json", b'{"x": 1}')
    assert answers[1] == (400, "text/plain", b"\x00bad")
    assert answers[2][0] == 200 and json.loads(answers[2][2]) == {"y": [1, 2]}


def test_a_failed_batch_is_its_code_for_every_request() -> None:
    message = otf.create_predict_response(None, {0: "a", 1: "b"}, "Prediction failed", 503)
    code, text, answers = parse_predict_response(bytes(message))
    assert (code, text) == (503, "Prediction failed")
    assert [a[0] for a in answers] == [503, 503]


def test_a_truncated_message_is_a_handler_error() -> None:
    message = bytes(otf.create_predict_response(["ok"], {0: "a"}, "Prediction success", 200))
    for cut in (3, 10, len(message) - 5):
        with pytest.raises(HandlerError):
            parse_predict_response(message[:cut])


def test_bodies_reach_a_handler_as_torchserves_worker_decodes_them() -> None:
    assert request_value(b'{"a": 1}', "application/json") == {"a": 1}
    assert request_value(b"[" * 100_000, "application/json") == b"[" * 100_000  # bytes, no raise
    assert request_value(b"[" + b"7" * 5000 + b"]", "application/json") == b"[" + b"7" * 5000 + b"]"
    assert request_value(b"hi", "text/plain") == "hi"
    assert request_value(b"\xff", "application/octet-stream") == b"\xff"
