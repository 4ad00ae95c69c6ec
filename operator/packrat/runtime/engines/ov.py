"""OpenVINO (CPU plugin), the optional extra ``openvino``.

The artefact is OpenVINO's IR (``model.xml`` + ``model.bin``, weights kept in FP32), which
the runtime maps from its file. Each instance runs one stream with ``t`` threads, the LATENCY
hint and OpenVINO's own pinning off (the process is pinned already), and FP32 inference
precision: on CPUs with AVX-512 BF16 or AMX OpenVINO otherwise computes in bfloat16, a
different model from the one eager serves (OpenVINO's own hints, as the benchmark runs them,
keep their default).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from packrat.runtime.engines.base import (
    OPENVINO,
    ArtefactRunner,
    EngineError,
    InputSpec,
    import_engine,
    one_or_tuple,
)
from packrat.runtime.engines.onnx_export import OnnxEngine, export_onnx


def instance_config(threads: int) -> dict[str, Any]:
    """One thin instance: one stream of ``threads`` threads, on the process's own cores."""
    return {
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": False,
        "INFERENCE_PRECISION_HINT": "f32",
    }


class OvRunner(ArtefactRunner):
    def __init__(self, compiled: Any, artefact: Path) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.artefact = artefact

    def run(self, inputs: Sequence[Tensor]) -> Tensor | tuple[Tensor, ...]:
        feed = {i: t.contiguous().numpy() for i, t in enumerate(inputs)}
        result = self.request.infer(feed)
        outs = [torch.from_numpy(result[o].copy()) for o in self.compiled.outputs]
        return one_or_tuple(outs)


class OpenVino(OnnxEngine):
    name = OPENVINO
    package = "openvino"
    fork_safe = False  # TBB's pool is created at compile: load after the fork

    def convert(self, model: nn.Module, inputs: Sequence[InputSpec], folder: Path) -> Path:
        ov = import_engine(self.package, self)
        onnx_path = export_onnx(model, inputs, folder / "model.onnx")
        try:
            converted = ov.Core().read_model(str(onnx_path))
            xml = folder / "model.xml"
            ov.save_model(converted, str(xml), compress_to_fp16=False)
        except Exception as exc:
            raise EngineError(f"openvino: conversion failed: {exc}"[:500]) from None
        finally:
            onnx_path.unlink(missing_ok=True)
        return xml

    def load(self, artefact: Path | None, *, model: nn.Module | None, threads: int) -> OvRunner:
        artefact = self.to_load(artefact)
        ov = import_engine(self.package, self)
        compiled = ov.Core().compile_model(str(artefact), "CPU", instance_config(threads))
        return OvRunner(compiled, artefact)
