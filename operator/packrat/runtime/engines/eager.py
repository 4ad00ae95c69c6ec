"""Eager PyTorch: the model as built, no artefact. Always installed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from packrat.runtime.engines.base import EAGER, EngineError, InputSpec, memory_report


class EagerRunner:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def run(self, inputs: Sequence[Tensor]) -> Tensor | tuple[Tensor, ...]:
        with torch.inference_mode():
            out = self.model(*inputs)
        return tuple(out) if isinstance(out, (list, tuple)) else out

    def memory(self) -> dict[str, int]:
        return memory_report(None)


class Eager:
    name = EAGER
    fork_safe = True

    def missing(self) -> str | None:
        return None

    def version(self) -> str:
        return str(torch.__version__)

    def convert(self, model: nn.Module, inputs: Sequence[InputSpec], folder: Path) -> Path | None:
        return None  # nothing to convert: the pods build or map the model as before

    def load(self, artefact: Path | None, *, model: nn.Module | None, threads: int) -> EagerRunner:
        if model is None:
            raise EngineError("eager: no model to run")
        return EagerRunner(model)
