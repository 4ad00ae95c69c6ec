"""AOTInductor: ``torch.export`` with a dynamic batch, compiled ahead into a package (a shared
library and its weights), so the serving pod needs no compiler. Compiling is slow (about 77 s
for ResNet-50 on 2 quiet cores) and needs a C++ compiler where the profiling Job runs."""

from __future__ import annotations

import contextlib
import io
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from packrat.runtime.engines.base import (
    INDUCTOR,
    ArtefactRunner,
    EngineError,
    InputSpec,
    one_or_tuple,
)
from packrat.runtime.engines.onnx_export import sample

MAX_BATCH = 1024  # the package's dynamic batch range is 1..MAX_BATCH (the CRD's batchSize cap)


class InductorRunner(ArtefactRunner):
    def __init__(self, package: Any, artefact: Path) -> None:
        self.package = package
        self.artefact = artefact

    def run(self, inputs: Sequence[Tensor]) -> Tensor | tuple[Tensor, ...]:
        with torch.inference_mode():
            out = self.package(*inputs)
        if isinstance(out, (list, tuple)):
            return one_or_tuple(out)
        return out  # type: ignore[no-any-return]


class Inductor:
    name = INDUCTOR
    fork_safe = True  # runs on torch's own OpenMP pool, set after the fork as eager's is

    def missing(self) -> str | None:
        if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
            return "engine inductor: no C++ compiler (c++, g++ or clang++) on PATH to compile with"
        return None

    def version(self) -> str:
        return str(torch.__version__)

    def convert(self, model: nn.Module, inputs: Sequence[InputSpec], folder: Path) -> Path:
        if isinstance(model, torch.jit.ScriptModule):
            raise EngineError("inductor: a TorchScript module cannot be torch.export-ed")
        example = sample(inputs, 4)
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        shapes = tuple({0: batch} for _ in inputs)
        try:
            with (
                torch.no_grad(),
                warnings.catch_warnings(),
                contextlib.redirect_stdout(io.StringIO()),
            ):
                warnings.simplefilter("ignore")
                program = torch.export.export(model, example, dynamic_shapes=shapes)
                path = torch._inductor.aoti_compile_and_package(
                    program, package_path=str(folder / "model.pt2")
                )
        except Exception as exc:
            raise EngineError(
                f"inductor: compilation failed: {type(exc).__name__}: {exc}"[:500]
            ) from None
        return Path(path)

    def load(
        self, artefact: Path | None, *, model: nn.Module | None, threads: int
    ) -> InductorRunner:
        if artefact is None:
            raise EngineError("inductor: no artefact to load")
        return InductorRunner(torch._inductor.aoti_load_package(str(artefact)), artefact)
