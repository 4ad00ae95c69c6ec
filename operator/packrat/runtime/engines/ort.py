"""ONNX Runtime (CPU execution provider, every graph optimisation): the optional extra
``onnxruntime``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from packrat.runtime.engines.base import (
    ONNXRUNTIME,
    ArtefactRunner,
    InputSpec,
    import_engine,
    one_or_tuple,
)
from packrat.runtime.engines.onnx_export import OnnxEngine, export_onnx


class OrtRunner(ArtefactRunner):
    def __init__(self, session: Any, artefact: Path) -> None:
        self.session = session
        self.artefact = artefact
        self.names = [i.name for i in session.get_inputs()]

    def run(self, inputs: Sequence[Tensor]) -> Tensor | tuple[Tensor, ...]:
        feed = {n: t.contiguous().numpy() for n, t in zip(self.names, inputs, strict=True)}
        outs = [torch.from_numpy(o) for o in self.session.run(None, feed)]
        return one_or_tuple(outs)


class OnnxRuntime(OnnxEngine):
    name = ONNXRUNTIME
    package = "onnxruntime"
    fork_safe = False  # its thread pool is created with the session: load after the fork

    def convert(self, model: nn.Module, inputs: Sequence[InputSpec], folder: Path) -> Path:
        return export_onnx(model, inputs, folder / "model.onnx")

    def load(self, artefact: Path | None, *, model: nn.Module | None, threads: int) -> OrtRunner:
        artefact = self.to_load(artefact)
        ort = import_engine(self.package, self)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        session = ort.InferenceSession(str(artefact), options, providers=["CPUExecutionProvider"])
        return OrtRunner(session, artefact)
