"""A .mar whose handler has no module an engine can take: every engine asked for is left out
by the first verdict, in one line, and not tried again (packrat.profiler.engines)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from packrat.profiler import engines as profiler_engines
from packrat.profiler.client import HandlerTarget
from packrat.profiler.profiler import ProfileJob, ProfileSettings


def test_a_handler_without_a_module_is_said_once_for_every_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def verdict(spec: str, engine: str, root: Path, **_: Any) -> dict[str, Any]:
        asked.append(engine)
        reason = "handler h.py: the handler has no torch.nn.Module `model` attribute; eager"
        return {"engine": engine, "status": "excluded", "reason": reason, "handler": "eager"}

    monkeypatch.setattr(profiler_engines, "prepare_engine", verdict)
    stream = io.StringIO()
    job = ProfileJob(
        spec=str(tmp_path / "m.mar"),
        cpus=1,
        max_batch=1,
        output=None,
        threads=None,
        extra_batches=(),
        settings=ProfileSettings(),
        allowed=None,
        stream=stream,
        on_point=None,
    )
    handler = HandlerTarget(archive=tmp_path / "m.mar", sample_request=tmp_path / "s.json")
    records = profiler_engines._prepare_all(
        job, ["eager", "onnxruntime", "openvino"], tmp_path, handler
    )
    assert asked == ["onnxruntime"]  # the handler is the same for every engine
    assert stream.getvalue().splitlines() == [
        "engines onnxruntime, openvino left out: handler h.py: the handler has no "
        "torch.nn.Module `model` attribute; eager"
    ]
    assert records["eager"]["status"] == "ok"
    assert {records[e]["status"] for e in ("onnxruntime", "openvino")} == {"excluded"}
    assert records["openvino"]["engine"] == "openvino"
